"""The collective smoke test's judge (lingjun_slurm/injob/preflight/collective.py) on runs of the
real runner recorded on this machine (tests/fixtures/preflight_collective/SOURCES.md), and its
pure parts: busbw as nccl-tests defines it, the test hook's parsing, narrowing by pairs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm.injob.host.exclusion import from_verdict
from lingjun_slurm.injob.preflight import collective as c
from lingjun_slurm.nodes.nccltests.bisect import PairResult

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "preflight_collective"
ENV = {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0"}


def plan(**collective: object) -> dict:
    return {"schema": 0, "stages": [], "settings": {"preflight": {"collective": {"timeout_s": 60, **collective}}}}


def copy(tmp: Path, name: str) -> Path:
    out = tmp / name
    shutil.copytree(FIX / name, out)
    return out


def nodes_of(out: Path) -> list[str]:
    return json.loads((out / "results.json").read_text())["nodes"]


def test_busbw_is_nccl_tests_bus_bandwidth() -> None:
    # doc/PERFORMANCE.md: allreduce busbw = S/t * 2(n-1)/n; allgather busbw = S/t * (n-1)/n.
    assert c.busbw("all_reduce", 8_000_000_000, 1.0, 8) == pytest.approx(8 * 2 * 7 / 8)
    assert c.busbw("all_gather", 8_000_000_000, 1.0, 8) == pytest.approx(8 * 7 / 8)
    assert c.busbw("all_reduce", 1_000_000_000, 0.5, 2) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        c.busbw("broadcast", 1, 1.0, 2)


def test_the_slow_hook_parses_and_refuses_nonsense() -> None:
    assert c.parse_slow(None) == {} and c.parse_slow("") == {}
    assert c.parse_slow("node2=0.2, node-7=1") == {"node2": 0.2, "node-7": 1.0}
    for bad in ("node2", "node2=0", "node2=1.5", "=0.3", "node2=x"):
        with pytest.raises(ValueError, match="LINGJUN_PREFLIGHT_SLOW"):
            c.parse_slow(bad)


def test_sizes_in_nccl_tests_notation() -> None:
    assert c.parse_size("16G") == 16 << 30 and c.parse_size("64M") == 64 << 20 and c.parse_size("1024") == 1024
    with pytest.raises(ValueError):
        c.parse_size("lots")


def test_waves_are_node_disjoint() -> None:
    assert c.wave([("a", "b"), ("c", "a"), ("d", "e"), ("c", "b")]) == [[("a", "b"), ("d", "e")],
                                                                        [("c", "a")], [("c", "b")]]


@pytest.mark.parametrize("name,slow", [("slow3", "node2"), ("slow4", "node3"), ("slow3x2", "node1")])
def test_the_slow_node_of_a_recorded_run_is_named(tmp_path: Path, name: str, slow: str) -> None:
    out = copy(tmp_path, name)
    verdict = c.judge(plan(), out, nodes_of(out), env=ENV)
    assert verdict["exit"] == 1 and list(verdict["bad_nodes"]) == [slow], verdict
    why = verdict["bad_nodes"][slow]
    assert why.startswith("all_reduce busbw ") and "below the allocation's median" in why and "in pairs with" in why


def test_a_recorded_run_without_a_slow_node_passes(tmp_path: Path) -> None:
    out = copy(tmp_path, "ok4")
    verdict = c.judge(plan(), out, nodes_of(out), env=ENV)
    assert verdict["ok"] and verdict["exit"] == 0 and not verdict["bad_nodes"], verdict


def test_the_four_node_run_took_a_second_round_to_narrow() -> None:
    results = json.loads((FIX / "slow4" / "results.json").read_text())
    rounds = sorted({p["round"] for p in results["pairs"]})
    assert rounds == [1, 2] and results["narrowing"] == "done", results["pairs"]


def test_a_rank_that_never_started_is_its_node_s_failure(tmp_path: Path) -> None:
    out = copy(tmp_path, "missing")
    verdict = c.judge(plan(timeout_s=8), out, ["node1", "node2", "node3"], env={"SLURM_JOB_ID": "4243"})
    assert verdict["exit"] == 1 and list(verdict["bad_nodes"]) == ["node3"], verdict
    assert "no rank of the collective smoke test reported" in verdict["bad_nodes"]["node3"]


def test_a_hang_everywhere_is_the_step_s_failure_a_warning_and_the_job_trains(tmp_path: Path) -> None:
    out = copy(tmp_path, "missing")
    verdict = c.judge(plan(timeout_s=8), out, ["node1", "node2"], env={"SLURM_JOB_ID": "4243"})
    assert verdict["exit"] == 0 and not verdict["bad_nodes"] and not verdict["problems"], verdict
    assert "deadline (8 s) fired on node1 (init), node2 (init)" in verdict["warnings"][0]
    assert "training anyway" in verdict["warnings"][0]
    assert verdict["collective"]["not_judged"] == ["nothing judged (no results)"]


def test_errors_without_a_deadline_stay_job_wide(tmp_path: Path) -> None:
    out = copy(tmp_path, "missing")
    for rank in (0, 1):
        doc = json.loads((out / f"rank-{rank}.json").read_text())
        (out / f"rank-{rank}.json").write_text(json.dumps({**doc, "state": "error", "error": "NCCL error: boom"}))
    verdict = c.judge(plan(timeout_s=8), out, ["node1", "node2"], env={"SLURM_JOB_ID": "4243"})
    assert verdict["exit"] == 2 and "NCCL error: boom" in verdict["problems"][0], verdict


def test_results_of_another_attempt_do_not_count(tmp_path: Path) -> None:
    out = copy(tmp_path, "slow3")
    verdict = c.judge(plan(), out, nodes_of(out), env={"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"})
    assert verdict["exit"] == 2 and "no rank reported" in verdict["problems"][0], verdict


def test_no_directory_at_all_is_job_wide(tmp_path: Path) -> None:
    verdict = c.judge(plan(), tmp_path / "nothing", ["a", "b", "c"], env=ENV)
    assert verdict["exit"] == 2 and not verdict["bad_nodes"]


def gpu_results(per_node_bw: dict[str, float], whole_bw: float, pairs: list[tuple[str, str, float]]) -> dict:
    return {"schema": 1, "job": "4242", "restart": "0", "complete_run": True, "backend": "nccl",
            "device": "NVIDIA H100 80GB HBM3", "nodes": list(per_node_bw),
            "ranks_per_node": {n: list(range(8 * i, 8 * i + 8)) for i, n in enumerate(per_node_bw)},
            "per_node": {n: [{"op": "all_reduce", "bytes": 16 << 30, "n": 8, "busbw_gbps": bw}]
                         for n, bw in per_node_bw.items()},
            "whole": [{"op": "all_reduce", "bytes": 256 << 20, "n": 8 * len(per_node_bw), "busbw_gbps": whole_bw}],
            "pairs": [{"nodes": [a, b], "round": 1, "op": "all_reduce", "bytes": 256 << 20, "busbw_gbps": bw}
                      for a, b, bw in pairs]}


H100_FLOOR = {"op": "all_reduce", "busbw_gbps": 460.0, "size": "16G", "nodes": 1, "gpus_per_node": 8, "gpu": "H100",
              "source": "azurehpc-health-checks nd96isr_h100_v5.conf"}
PORT = {"gbps": 400.0, "ports_per_node": 8, "source": "8x 400 Gb/s NDR"}


def write(tmp: Path, results: dict) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "results.json").write_text(json.dumps(results))
    return tmp


def test_a_node_below_the_published_single_node_floor(tmp_path: Path) -> None:
    out = write(tmp_path, gpu_results({"a": 470.0, "b": 300.0, "c": 480.0}, 300.0,
                                      [("a", "b", 300.0), ("b", "c", 300.0), ("c", "a", 310.0)]))
    verdict = c.judge(plan(floors=[H100_FLOOR], port=PORT), out, ["a", "b", "c"], env=ENV)
    assert list(verdict["bad_nodes"]) == ["b"], verdict
    assert "below the published single-node floor 460 GB/s" in verdict["bad_nodes"]["b"]


def test_a_floor_for_another_gpu_is_not_applied(tmp_path: Path) -> None:
    out = write(tmp_path, gpu_results({"a": 200.0, "b": 200.0, "c": 200.0}, 300.0,
                                      [("a", "b", 300.0), ("b", "c", 300.0), ("c", "a", 300.0)]))
    floor = {**H100_FLOOR, "gpu": "A100"}
    assert c.judge(plan(floors=[floor], port=PORT), out, ["a", "b", "c"], env=ENV)["ok"]


def test_slow_everywhere_is_the_profile_s_problem_naming_its_variables(tmp_path: Path) -> None:
    out = write(tmp_path, gpu_results({"a": 470.0, "b": 470.0, "c": 470.0}, 3.1,
                                      [("a", "b", 3.0), ("b", "c", 3.2), ("c", "a", 3.1)]))
    verdict = c.judge(plan(port=PORT, profile="azure-nd-h100-v5",
                           network_vars={"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}),
                      out, ["a", "b", "c"], env=ENV)
    assert verdict["exit"] == 2 and not verdict["bad_nodes"], verdict
    text = verdict["problems"][0]
    assert "below 0.5 x one network port's rate: 25 GB/s" in text
    assert "NCCL_IB_DISABLE=1, NCCL_SOCKET_IFNAME=eth0" in text
    assert "azure-nd-h100-v5" in text


def test_narrowing_replays_the_bisection() -> None:
    pairs = [PairResult(("a", "b"), 10.0, 1), PairResult(("c", "d"), 2.0, 1), PairResult(("c", "a"), 2.1, 2),
             PairResult(("d", "b"), 9.5, 2)]
    out = c.narrow(["a", "b", "c", "d"], pairs)
    assert out.slow == ["c"] and out.undetermined == []
    assert c.node_figures(["a", "b", "c", "d"], pairs) == {"a": 10.0, "b": 10.0, "c": 2.1, "d": 9.5}


def test_a_slow_pair_left_unnarrowed_by_the_time_bound_is_a_warning(tmp_path: Path) -> None:
    results = gpu_results({"a": 470.0, "b": 470.0, "c": 470.0, "d": 470.0}, 300.0,
                          [("a", "b", 300.0), ("c", "d", 30.0)])
    verdict = c.judge(plan(port=PORT), write(tmp_path, results), ["a", "b", "c", "d"], env=ENV)
    assert verdict["exit"] == 0 and not verdict["problems"] and not verdict["bad_nodes"], verdict
    assert "undetermined: c, d" in verdict["warnings"][0] and "training anyway" in verdict["warnings"][0]


def test_one_nic_at_its_usual_busbw_passes_the_port_floor(tmp_path: Path) -> None:
    # One GPU per node: every byte crosses one 400 Gb/s port (50 GB/s); NCCL reaches ~46 GB/s there.
    results = gpu_results({"a": 470.0, "b": 470.0, "c": 470.0}, 46.0,
                          [("a", "b", 46.0), ("b", "c", 47.0), ("c", "a", 46.5)])
    verdict = c.judge(plan(port=PORT), write(tmp_path, results), ["a", "b", "c"], env=ENV)
    assert verdict["exit"] == 0 and not verdict["problems"], verdict
    # A TCP fallback an order of magnitude below still fails it, and the factor can be set.
    results["whole"][0]["busbw_gbps"] = 4.0
    assert c.judge(plan(port=PORT), write(tmp_path, results), ["a", "b", "c"], env=ENV)["exit"] == 2
    results["whole"][0]["busbw_gbps"] = 46.0
    assert c.judge(plan(port=PORT, port_floor=1.0), write(tmp_path, results), ["a", "b", "c"], env=ENV)["exit"] == 2


def test_a_deadline_in_the_pairs_keeps_the_finished_phases(tmp_path: Path) -> None:
    # Rank 0 rewrote results.json after round 1 (complete_run false); the deadline fired in round 2.
    results = {**gpu_results({"a": 470.0, "b": 470.0, "c": 470.0, "d": 470.0, "e": 470.0}, 300.0,
                             [("a", "b", 300.0), ("c", "d", 30.0), ("e", "a", 310.0)]),
               "complete_run": False, "phases_done": ["layout", "per-node", "whole"]}
    out = write(tmp_path, results)
    for rank, node in enumerate("abcde"):
        (out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "node": node, "job": "4242", "restart": "0",
                                                           "state": "deadline", "phase": "pairs round 2"}))
    verdict = c.judge(plan(port=PORT, timeout_s=60), out, list("abcde"), env=ENV)
    assert verdict["exit"] == 0 and not verdict["problems"], verdict
    text = " | ".join(verdict["warnings"])
    assert "deadline (60 s) fired on a (pairs round 2)" in text and "(per-node, whole)" in text, text
    assert "undetermined: c, d" in text, text
    # A node the finished round already proved slow is still a bad node; so is the port floor job-wide.
    results["pairs"] += [{"nodes": ["c", "a"], "round": 2, "op": "all_reduce", "bytes": 256 << 20, "busbw_gbps": 30.0},
                         {"nodes": ["d", "b"], "round": 2, "op": "all_reduce", "bytes": 256 << 20, "busbw_gbps": 300.0}]
    write(tmp_path, results)
    verdict = c.judge(plan(port=PORT, timeout_s=60), out, list("abcde"), env=ENV)
    assert verdict["exit"] == 1 and list(verdict["bad_nodes"]) == ["c"], verdict
    results["whole"][0]["busbw_gbps"] = 3.0
    write(tmp_path, results)
    assert c.judge(plan(port=PORT, timeout_s=60), out, list("abcde"), env=ENV)["exit"] == 2


def test_a_node_that_never_reported_stays_a_bad_node(tmp_path: Path) -> None:
    out = copy(tmp_path, "missing")
    verdict = c.judge(plan(timeout_s=8), out, ["node1", "node2", "node3"], env={"SLURM_JOB_ID": "4243"})
    assert verdict["exit"] == 1 and list(verdict["bad_nodes"]) == ["node3"] and not verdict["warnings"], verdict


def test_the_verdict_feeds_the_exclusion_with_its_source(tmp_path: Path) -> None:
    out = copy(tmp_path, "slow3")
    verdict_file = out / c.VERDICT
    doc = c.judge(plan(), out, nodes_of(out), env=ENV)
    verdict_file.write_text(json.dumps(doc))
    assert from_verdict(str(verdict_file)) == [{"node": "node2", "reason": doc["bad_nodes"]["node2"],
                                                "source": "preflight-collective"}]
    old = tmp_path / "verdict.json"
    old.write_text(json.dumps({"bad_nodes": {"n1": "eth0 down"}}))
    assert from_verdict(str(old))[0]["source"] == "preflight"


def test_the_judge_command_prints_one_line_per_bad_node(tmp_path: Path) -> None:
    out = copy(tmp_path, "slow3")
    plan_file = tmp_path / "plan.json"
    from lingjun_slurm.injob.stages.runtime import PLAN_SCHEMA

    plan_file.write_text(json.dumps({**plan(), "schema": PLAN_SCHEMA}))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.stages", "collective-judge", "--plan", str(plan_file),
                           "--out", str(out), "--nodes", "node1 node2 node3"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **ENV})
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("lingjun-slurm: preflight: node node2: all_reduce busbw "), proc.stdout
    assert "Traceback" not in proc.stderr
    assert json.loads((out / c.VERDICT).read_text())["bad_nodes"].keys() == {"node2"}
    # `judge note` reads it like a node verdict.
    subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.preflight.judge", "note", "--verdict",
                    str(out / c.VERDICT), "--run-dir", str(tmp_path / "run")], check=True,
                   env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})


def test_the_runner_refuses_a_bad_hook_without_a_traceback(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    from lingjun_slurm.injob.stages.runtime import PLAN_SCHEMA

    plan_file.write_text(json.dumps({**plan(), "schema": PLAN_SCHEMA}))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.stages", "collective", "--plan", str(plan_file),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURM_PROCID": "0",
                               "SLURM_NTASKS": "1", "LINGJUN_PREFLIGHT_SLOW": "node2=7"})
    assert proc.returncode == 2 and "LINGJUN_PREFLIGHT_SLOW: 'node2=7'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_checks_that_did_not_run_are_not_reported_as_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    # gloo, one rank per node (the recorded 4-node run): neither per node nor the port floor ran.
    out = copy(tmp_path, "ok4")
    assert c.main(plan(port=PORT), out, nodes_of(out)) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("lingjun-slurm: preflight: collective smoke test passed on 4 nodes"), line
    assert "per node: not judged (one rank per node: nothing to measure side by side)" in line, line
    assert "per-port floor: not judged (gloo on CPUs" in line, line
    # Two GPU nodes without a published floor for their GPUs: no pairs, no per-node judgement.
    gpu = gpu_results({"a": 470.0, "b": 470.0}, 300.0, [])
    assert c.main(plan(port=PORT, floors=[{**H100_FLOOR, "gpu": "A100"}]), write(tmp_path / "g", gpu), ["a", "b"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "per node: not judged (no published single-node floor for NVIDIA H100 80GB HBM3, 8 ranks per node)" in line
    assert "across nodes: not judged (pairs need >= 3 nodes, 2 here)" in line, line
    assert "per-port floor" not in line, line  # it was judged (300 GB/s)
    assert json.loads((tmp_path / "g" / c.VERDICT).read_text())["collective"]["not_judged"][1].startswith("across")
    # A deadline: not "passed".
    out = copy(tmp_path, "missing")
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    assert c.main(plan(timeout_s=8), out, ["node1", "node2"]) == 0
    text = capsys.readouterr().out
    assert "lingjun-slurm: preflight: warning: collective smoke test did not finish" in text, text
    assert "passed" not in text and "not conclusive" in text, text


def test_the_runner_agrees_one_deadline_and_keeps_the_finished_phases(tmp_path: Path) -> None:
    """Three real ranks (gloo on 127.0.0.1), rank 0 started 2.5 s before the others, node1 slowed so
    that the whole-allocation phase outlasts the bound: every rank's deadline is the same instant
    (the all_reduce MIN after the layout phase), results.json keeps the layout and per-node phases
    (complete_run false), and the judge warns and lets the job train."""
    pytest.importorskip("torch")
    import socket
    import time

    from lingjun_slurm.injob.stages.runtime import PLAN_SCHEMA

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({"schema": PLAN_SCHEMA,
                                     "stages": [{"kind": "train", "resources": {"gpus_per_node": 0}}],
                                     "settings": {"preflight": {"collective": {"timeout_s": 14}}}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "collective"
    nodes = ["node1", "node2", "node3"]
    procs = []
    for rank, node in enumerate(nodes):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURM_PROCID": str(rank), "SLURM_NTASKS": "3",
               "SLURM_LOCALID": "0", "SLURMD_NODENAME": node, "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "0",
               "MASTER_ADDR": "127.0.0.1", "LINGJUN_COLLECTIVE_PORT": str(port), "LINGJUN_NODES": " ".join(nodes),
               "LINGJUN_PREFLIGHT_SLOW": "node1=0.001"}
        procs.append(subprocess.Popen([sys.executable, "-m", "lingjun_slurm.stages", "collective", "--plan",
                                       str(plan_file), "--out", str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        if rank == 0:
            time.sleep(2.5)
    logs = [p.communicate(timeout=60)[0] for p in procs]
    results = json.loads((out / "results.json").read_text())
    assert results["complete_run"] is False and results["phases_done"] == ["layout", "per-node"], (results, logs)
    states = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(3)]
    deadlines = [s["deadline_at"] for s in states]
    assert max(deadlines) - min(deadlines) < 1.0, (deadlines, logs)  # 2.5 s apart without the agreement
    assert all(s["phase"] == "whole" for s in states) and "deadline" in {s["state"] for s in states}, states
    verdict = c.judge(plan(timeout_s=14), out, nodes, env=ENV)
    assert verdict["exit"] == 0 and not verdict["bad_nodes"] and "node1 (whole)" in verdict["warnings"][0], verdict
    assert "judged on the phases that finished (per-node)" in verdict["warnings"][0], verdict
