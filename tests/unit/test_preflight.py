"""The job pre-flight (lingjun_slurm/injob/preflight): node side on the real H100 sysfs tree
(tests/fixtures/health/real/sysfs-class-infiniband/gpud-h100-0, the same bytes as
../shared/reference/real-samples/health/sysfs/gpud-h100-0, cited in tests/fixtures/health/SOURCES.md)
with the stand-in nvidia-smi of tests/health/machines.py, "nodes" as processes sharing (or not)
a directory under tmp_path, and the judge's verdicts and exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.injob.preflight import file_name, judge, node
from tests.health.machines import REPO, Machine, Node, gpud_h100, roce_a100

SHARED_REAL = REPO.parent / "shared" / "reference" / "real-samples" / "health" / "sysfs" / "gpud-h100-0"


def make_plan(tmp: Path, gpus: int = 8, profile: str | None = "generic-ib", workdir: Path | None = None,
              ckpt: Path | None = None, **preflight: Any) -> dict:
    workdir = workdir or tmp / "shared" / "work"
    ckpt = ckpt or workdir / "checkpoints"
    workdir.mkdir(parents=True, exist_ok=True)
    preflight.setdefault("checkpoint_bytes", 10 ** 6)
    preflight.setdefault("thresholds", {"IB_PORT_COUNT": "8", "IB_RATE_GBPS": "400"})
    return {"schema": 1, "run_id": "r1", "workdir": str(workdir), "checkpoint_dir": str(ckpt),
            "host_checkpoint_dir": str(ckpt), "settings": {"preflight": preflight},
            "stages": [{"kind": "train", "network_profile": profile,
                        "resources": {"nodes": 1, "tasks_per_node": gpus or 1, "gpus_per_node": gpus}}]}


def env_of(n: Node, name: str, nodes: str | None = None, **extra: str) -> dict[str, str]:
    env = n.base_env()
    env.update(SLURMD_NODENAME=name, SLURM_JOB_ID="4242", SLURM_PROCID="0", LINGJUN_NODES=nodes or name,
               LINGJUN_PREFLIGHT_ROOT=str(n.root), LINGJUN_PREFLIGHT_SHARE_TIMEOUT="3")
    env.update(extra)
    return env


def run_node(n: Node, plan: dict, out: Path, name: str = "gpu-node-7", **extra: str) -> dict:
    assert node.main(plan, out, env=env_of(n, name, **extra)) == 0
    return json.loads((out / file_name(name, ".json")).read_text())


def check(report: dict, name: str) -> list[dict]:
    return [c for c in report["checks"] if c["name"] == name]


def failures(report: dict) -> list[str]:
    return [c["detail"] for c in report["checks"] if not c["ok"]]


@pytest.fixture
def h100(tmp_path: Path) -> Node:
    return Node(tmp_path / "node", gpud_h100())


# ------------------------------------------------------------------ node side
def test_a_healthy_real_h100_node_passes(h100: Node, tmp_path: Path) -> None:
    rep = run_node(h100, make_plan(tmp_path), tmp_path / "out")
    assert failures(rep) == []
    assert {c["name"] for c in rep["checks"]} == {"gpu-count", "ib-ports", "roce-gid", "socket-if", "shared-workdir",
                                                  "shared-checkpoint-dir", "free-space", "clock"}
    assert check(rep, "gpu-count")[0]["detail"] == "8 GPUs (nvidia-smi -L)"
    assert check(rep, "ib-ports")[0]["detail"].startswith("8 ports ACTIVE, LinkUp, >= 400 Gb/s, InfiniBand")
    assert rep["node"] == "gpu-node-7" and rep["job"] == "4242" and rep["timings"]["total"] < 30


@pytest.mark.skipif(not SHARED_REAL.is_dir(), reason="no ../shared/reference/real-samples here")
def test_the_brief_s_copy_of_the_real_tree_passes_and_fails_the_same(tmp_path: Path) -> None:
    n = Node(tmp_path / "node", Machine(**{**gpud_h100().__dict__, "ib_tree": SHARED_REAL}))
    plan = make_plan(tmp_path)
    assert failures(run_node(n, plan, tmp_path / "out")) == []
    (n.root / "sys/class/infiniband/mlx5_4/ports/1/state").write_text("1: DOWN\n")
    assert failures(run_node(n, plan, tmp_path / "out")) == ["mlx5_4 port 1 DOWN"]


def test_a_down_port_fails_with_the_port(h100: Node, tmp_path: Path) -> None:
    (h100.root / "sys/class/infiniband/mlx5_7/ports/1/state").write_text("1: DOWN\n")
    assert failures(run_node(h100, make_plan(tmp_path), tmp_path / "out")) == ["mlx5_7 port 1 DOWN"]


def test_a_slow_port_fails_at_the_expected_rate(h100: Node, tmp_path: Path) -> None:
    (h100.root / "sys/class/infiniband/mlx5_1/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    assert failures(run_node(h100, make_plan(tmp_path), tmp_path / "out")) == ["mlx5_1 port 1 at 200 Gb/s, expected 400"]


def test_an_nccl_ib_hca_device_that_does_not_exist(h100: Node, tmp_path: Path) -> None:
    plan = make_plan(tmp_path, thresholds={})
    got = failures(run_node(h100, plan, tmp_path / "out", NCCL_IB_HCA="=mlx5_0,mlx5_13"))
    assert got == ["NCCL_IB_HCA names mlx5_13, which this node does not have"]


def roce_gids(n: Node, kind: str) -> None:
    """GIDs on the real tree's Ethernet bond (the real tree has none): index 3 of type KIND, as
    show_gids lists them on a RoCE node (tests/health/machines.py roce_a100)."""
    port = n.root / "sys/class/infiniband/mlx5_bond_0/ports/1"
    (port / "gids").mkdir(exist_ok=True)
    (port / "gid_attrs/types").mkdir(parents=True, exist_ok=True)
    (port / "gids/3").write_text("0000:0000:0000:0000:0000:ffff:0a00:3c03\n")
    (port / "gid_attrs/types/3").write_text(kind + "\n")


@pytest.mark.parametrize("kind, ok", [("RoCE v2", True), ("IB/RoCE v1", False)])
def test_the_roce_gid_index_must_be_roce_v2(h100: Node, tmp_path: Path, kind: str, ok: bool) -> None:
    roce_gids(h100, kind)
    plan = make_plan(tmp_path, profile="generic-roce", thresholds={})
    got = failures(run_node(h100, plan, tmp_path / "out", NCCL_IB_HCA="=mlx5_bond_0", NCCL_IB_GID_INDEX="3"))
    assert got == ([] if ok else [f"mlx5_bond_0 port 1 GID 3 is {kind}, not RoCE v2"])


def test_the_roce_node_of_the_lingjun_profile(tmp_path: Path) -> None:
    n = Node(tmp_path / "node", roce_a100())
    plan = make_plan(tmp_path, profile="lingjun", thresholds={})
    assert failures(run_node(n, plan, tmp_path / "out")) == []
    got = failures(run_node(n, plan, tmp_path / "out", NCCL_IB_GID_INDEX="0"))
    assert got[0] == "mlx5_0 port 1 GID 0 is IB/RoCE v1, not RoCE v2" and len(got) == 9


def test_a_socket_interface_that_is_down(h100: Node, tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    assert failures(run_node(h100, plan, tmp_path / "out", NCCL_SOCKET_IFNAME="bond0")) == []
    (h100.root / "sys/class/net/bond0/operstate").write_text("down\n")
    (h100.root / "sys/class/net/bond0/carrier").write_text("0\n")
    got = failures(run_node(h100, plan, tmp_path / "out", NCCL_SOCKET_IFNAME="bond0"))
    assert got == ["bond0 down (NCCL_SOCKET_IFNAME=bond0)"]
    got = failures(run_node(h100, plan, tmp_path / "out", NCCL_SOCKET_IFNAME="=eth0"))
    assert got == ["no interface matches NCCL_SOCKET_IFNAME==eth0"]


# ------------------------------------------------------------------ GPUs
@pytest.mark.parametrize("want, cvd, detail", [
    (8, None, None),
    (4, None, "8 GPUs (nvidia-smi -L), expected 4"),
    (4, "0,1,2,3", None),
    (4, "0,1,2", "8 GPUs (nvidia-smi -L), 3 of them in CUDA_VISIBLE_DEVICES=0,1,2, expected 4"),
    (4, "0,1,9,3", "8 GPUs (nvidia-smi -L), 2 of them in CUDA_VISIBLE_DEVICES=0,1,9,3, expected 4"),  # CUDA stops at 9
    (2, "GPU-,5", "8 GPUs (nvidia-smi -L), 2 of them in CUDA_VISIBLE_DEVICES=GPU-,5, expected 2"),
])
def test_gpu_count_with_the_stand_in_nvidia_smi(h100: Node, want: int, cvd: str | None, detail: str | None) -> None:
    env = h100.base_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    got = node.check_gpus(want, str(h100.root), env)
    if detail is None:
        assert got["ok"], got
    elif want == 2:  # "GPU-" prefixes the first UUID: GPU 0, then 5: two GPUs, as asked
        assert got["ok"] and got["detail"] == detail.replace(", expected 2", ""), got
    else:
        assert not got["ok"] and got["detail"] == detail, got


def test_gpus_from_proc_without_nvidia_smi(tmp_path: Path) -> None:
    root = tmp_path / "root"
    env = {"PATH": str(tmp_path / "empty-bin")}
    got = node.check_gpus(2, str(root), env)
    assert not got["ok"] and got["detail"] == ("no nvidia-smi and no /proc/driver/nvidia/gpus: no GPU driver visible, "
                                               "expected 2 GPUs")
    for bus in ("0000:18:00.0", "0000:2a:00.0"):
        (root / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
    assert node.check_gpus(2, str(root), env)["ok"]
    assert node.check_gpus(2, str(root), {**env, "CUDA_VISIBLE_DEVICES": "1"})["detail"] == \
        "2 GPUs (/proc/driver/nvidia/gpus), 1 of them in CUDA_VISIBLE_DEVICES=1, expected 2"
    assert node.check_gpus(0, str(root), env)["skipped"]


# ------------------------------------------------------------------ free space
class FakeStat:
    def __init__(self, free: int) -> None:
        self.f_bavail, self.f_frsize = free // 4096, 4096


def test_free_space_for_two_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(tmp_path, checkpoint_bytes=10 * 2 ** 30)
    seen: list[str] = []
    monkeypatch.setattr(node, "_statvfs", lambda p: seen.append(p) or FakeStat(15 * 2 ** 30))
    got = node.check_free_space(plan, plan["checkpoint_dir"])
    assert not got["ok"] and got["detail"].startswith(f"{plan['checkpoint_dir']}: 15.0 GiB free, 2 checkpoints need "
                                                      f"20.0 GiB (10.0 GiB each")
    assert seen == [plan["workdir"]]  # the checkpoint dir does not exist yet: its nearest parent
    monkeypatch.setattr(node, "_statvfs", lambda p: FakeStat(21 * 2 ** 30))
    assert node.check_free_space(plan, plan["checkpoint_dir"])["ok"]


def test_free_space_skipped_when_the_planner_cannot_estimate(tmp_path: Path) -> None:
    plan = make_plan(tmp_path, checkpoint_bytes=None)
    got = node.check_free_space(plan, plan["checkpoint_dir"])
    assert got["ok"] and got["skipped"] and got["detail"].startswith("checkpoint size unknown: the planner cannot "
                                                                     "estimate it (")


def test_free_space_from_the_planner_for_a_rendered_plan(tmp_path: Path) -> None:
    """The size is `lingjun-slurm plan`'s checkpoint.bytes for the same spec."""
    spec = REPO / "examples/tiny-gpt.yaml"
    subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "render", str(spec), "-o", str(tmp_path / "r")],
                   check=True, capture_output=True, cwd=tmp_path)
    planned = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "plan", str(spec), "--json"], check=True,
                             capture_output=True, text=True, cwd=tmp_path)
    plan = json.loads((tmp_path / "r/plan.json").read_text())
    assert node.checkpoint_bytes(plan) == (json.loads(planned.stdout)["checkpoint"]["bytes"], "the planner's estimate")


@pytest.mark.skipif(not shutil.which("unshare"), reason="no unshare")
def test_free_space_on_a_tiny_tmpfs(h100: Node, tmp_path: Path) -> None:
    """A real statvfs: a 1 MiB tmpfs as the checkpoint dir, in a user and mount namespace."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip("unshare -rm not permitted here")
    small = tmp_path / "small"
    small.mkdir()
    plan = make_plan(tmp_path, ckpt=small, checkpoint_bytes=2 ** 20)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    script = (f"mount -t tmpfs -o size=1m tmpfs {small} && exec {sys.executable} -m lingjun_slurm.stages preflight "
              f"--plan {tmp_path / 'plan.json'} --out {tmp_path / 'out'}")
    env = env_of(h100, "gpu-node-7", PYTHONPATH=str(REPO))
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads((tmp_path / "out/gpu-node-7.json").read_text())
    free = check(rep, "free-space")[0]
    assert not free["ok"] and "2 checkpoints need 2.0 MiB" in free["detail"], free


# ------------------------------------------------------------------ several nodes
def spawn(n: Node, plan_file: Path, out: Path, name: str, nodes: str, **extra: str) -> subprocess.Popen:
    env = env_of(n, name, nodes, PYTHONPATH=str(REPO), **extra)
    return subprocess.Popen([sys.executable, "-m", "lingjun_slurm.stages", "preflight", "--plan", str(plan_file),
                             "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_nodes(n: Node, tmp: Path, names: list[str], plans: dict[str, dict], **extra: str) -> Path:
    out = tmp / "out"
    procs = []
    for name in names:
        plan_file = tmp / f"plan-{len(procs)}.json"
        plan_file.write_text(json.dumps(plans[name]))
        procs.append(spawn(n, plan_file, out, name, " ".join(names), **extra))
    for p in procs:
        text, _ = p.communicate(timeout=90)
        assert p.returncode == 0, text
    return out


def run_judge(plan: dict, out: Path, nodes: list[str], tmp: Path, **env: str) -> tuple[int, str, dict]:
    plan_file = tmp / "judge-plan.json"
    plan_file.write_text(json.dumps(plan))
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    full.update(PYTHONPATH=str(REPO), SLURM_JOB_ID="4242", **env)
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.stages", "preflight-judge", "--plan", str(plan_file),
                           "--out", str(out), "--nodes", " ".join(nodes)], capture_output=True, text=True, env=full,
                          timeout=60)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("lingjun-slurm: preflight: ")]
    return proc.returncode, "\n".join(lines), json.loads((out / "verdict.json").read_text())


def test_three_nodes_share_the_dirs_and_pass(h100: Node, tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    names = ["n1", "n2", "n3"]
    t = time.monotonic()
    out = run_nodes(h100, tmp_path, names, {n: plan for n in names})
    assert time.monotonic() - t < 30
    rc, lines, verdict = run_judge(plan, out, names, tmp_path)
    assert rc == 0 and verdict["ok"] and verdict["bad_nodes"] == {} and verdict["problems"] == [], lines
    assert lines.startswith("lingjun-slurm: preflight: 3 nodes passed (clocks within ")
    assert 0 <= verdict["skew_s"] < 1
    # the judge removed the tokens
    assert not list(Path(plan["workdir"]).glob(".preflight-*")) and verdict["cleaned"]


def test_a_node_with_its_own_directory_is_blamed(h100: Node, tmp_path: Path) -> None:
    """n3's workdir is not the shared one (e.g. the file system is not mounted there)."""
    plan = make_plan(tmp_path)
    lonely = make_plan(tmp_path, workdir=tmp_path / "n3-local" / "work")
    lonely["checkpoint_dir"] = plan["checkpoint_dir"]
    names = ["n1", "n2", "n3"]
    out = run_nodes(h100, tmp_path, names, {"n1": plan, "n2": plan, "n3": lonely})
    rc, lines, verdict = run_judge(plan, out, names, tmp_path)
    assert rc == 1 and list(verdict["bad_nodes"]) == ["n3"], lines
    assert verdict["bad_nodes"]["n3"].startswith(f"workdir {plan['workdir']} is not the directory the other 2 nodes "
                                                 f"share (it read the tokens of none of them; its own was read by none)")
    assert lines.splitlines()[0].startswith("lingjun-slurm: preflight: node n3: workdir ")


def test_two_nodes_with_different_dirs_is_a_job_wide_problem(h100: Node, tmp_path: Path) -> None:
    a = make_plan(tmp_path, workdir=tmp_path / "a" / "work")
    b = make_plan(tmp_path, workdir=tmp_path / "b" / "work")
    out = run_nodes(h100, tmp_path, ["n1", "n2"], {"n1": a, "n2": b})
    rep = json.loads((out / "n1.json").read_text())
    assert not check(rep, "shared-workdir")[0]["ok"]
    assert "no token from n2 within 3 s" in check(rep, "shared-workdir")[0]["detail"]
    rc, lines, verdict = run_judge(a, out, ["n1", "n2"], tmp_path)
    assert rc == 2 and verdict["bad_nodes"] == {}, lines
    assert any(p.startswith("workdir ") and "is not one shared directory" in p for p in verdict["problems"])


def test_a_down_port_on_one_of_three_nodes(tmp_path: Path) -> None:
    good, bad = Node(tmp_path / "good", gpud_h100()), Node(tmp_path / "bad", gpud_h100())
    (bad.root / "sys/class/infiniband/mlx5_4/ports/1/state").write_text("1: DOWN\n")
    plan = make_plan(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    names = "n1 n2 n3"
    procs = [spawn(good, tmp_path / "plan.json", tmp_path / "out", "n1", names),
             spawn(bad, tmp_path / "plan.json", tmp_path / "out", "n2", names),
             spawn(good, tmp_path / "plan.json", tmp_path / "out", "n3", names)]
    for p in procs:
        p.communicate(timeout=90)
    rc, lines, verdict = run_judge(plan, tmp_path / "out", names.split(), tmp_path)
    assert rc == 1 and verdict["bad_nodes"] == {"n2": "mlx5_4 port 1 DOWN"}
    assert lines == "lingjun-slurm: preflight: node n2: mlx5_4 port 1 DOWN"


# ------------------------------------------------------------------ the judge on written reports
def report(name: str, fails: dict[str, str] | None = None, offset: float = 0.0, seen: list[str] | None = None,
           job: str = "4242", exchange: dict[str, tuple[float, float]] | None = None) -> dict:
    checks = [{"name": c, "ok": c not in (fails or {}), "skipped": False, "detail": (fails or {}).get(c, "fine")}
              for c in ("gpu-count", "ib-ports", "roce-gid", "socket-if", "free-space")]
    seen = seen or []
    clock = {"write": {"before": 1000.0, "after": 1000.1, "mtime": 1000.05 + offset},
             "seen": {o: {"seen_at": s, "written_at": w} for o, (s, w) in (exchange or {}).items()},
             "all_seen_at": 1001.0}
    return {"schema": 1, "node": name, "job": job, "restart": "0", "checks": checks,
            "shared": {"workdir": {"path": "/w", "written": True, "error": None, "seen": seen, "missing": []},
                       "checkpoint_dir": {"path": "/c", "written": True, "error": None, "seen": seen, "missing": []}},
            "clock": {"workdir": clock}}


def write_reports(out: Path, docs: list[dict]) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    for d in docs:
        (out / file_name(d["node"], ".json")).write_text(json.dumps(d))
    return [d["node"] for d in docs]


def verdict_of(tmp: Path, docs: list[dict], nodes: list[str] | None = None, **kw: Any) -> dict:
    names = write_reports(tmp / "out", docs)
    return judge.judge({}, tmp / "out", nodes or names, env={"SLURM_JOB_ID": "4242"}, **kw)


def all_seeing(names: list[str], **per: dict) -> list[dict]:
    return [report(n, seen=[m for m in names if m != n], **per.get(n, {})) for n in names]


def test_most_nodes_failing_the_same_check_is_no_node_s_fault(tmp_path: Path) -> None:
    names = ["a", "b", "c", "d"]
    docs = all_seeing(names, a={"fails": {"socket-if": "no interface matches NCCL_SOCKET_IFNAME=eth9"}},
                      b={"fails": {"socket-if": "no interface matches NCCL_SOCKET_IFNAME=eth9"}},
                      c={"fails": {"socket-if": "no interface matches NCCL_SOCKET_IFNAME=eth9",
                                   "gpu-count": "7 GPUs (nvidia-smi -L), expected 8"}})
    v = verdict_of(tmp_path, docs)
    assert v["exit"] == 2 and v["bad_nodes"] == {"c": "7 GPUs (nvidia-smi -L), expected 8"}
    assert v["problems"] == ["socket-if fails on 3 of 4 nodes (a: no interface matches NCCL_SOCKET_IFNAME=eth9): most "
                             "likely the spec, the image or the cluster's configuration, not bad nodes; no node is "
                             "excluded for it"]
    # on two of four it is the nodes'
    docs[2]["checks"][3]["ok"] = True
    v = verdict_of(tmp_path, docs)
    assert v["exit"] == 1 and set(v["bad_nodes"]) == {"a", "b", "c"}


def test_a_missing_report_is_a_bad_node_and_most_missing_is_the_job_s(tmp_path: Path) -> None:
    docs = all_seeing(["a", "b"])
    v = verdict_of(tmp_path, docs, nodes=["a", "b", "c"])
    assert v["exit"] == 1 and v["bad_nodes"] == {
        "c": "no pre-flight report: the task or its container did not start on c; see the job log"}
    v = verdict_of(tmp_path / "only-a", docs[:1], nodes=["a", "b", "c"])
    assert v["exit"] == 2 and v["bad_nodes"] == {} and v["problems"][0].startswith(
        "no pre-flight report from 2 of 3 nodes (b, c): the step or the image failed to start")


def test_a_report_of_another_attempt_does_not_count(tmp_path: Path) -> None:
    docs = all_seeing(["a", "b", "c"])
    docs[1]["job"] = "4241"
    v = verdict_of(tmp_path, docs)
    assert v["exit"] == 1 and v["bad_nodes"]["b"].startswith("pre-flight report ") and "is from job 4241.0" in \
        v["bad_nodes"]["b"]


def test_a_clock_off_the_file_server_and_the_others(tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    v = verdict_of(tmp_path, all_seeing(names, c={"offset": 7.5}))
    assert v["exit"] == 1 and list(v["bad_nodes"]) == ["c"] and v["bad_nodes"]["c"].startswith("clock +7.5 s off ")
    assert v["skew_s"] == 7.5
    assert verdict_of(tmp_path, all_seeing(names, c={"offset": 4.0}))["exit"] == 0
    assert verdict_of(tmp_path, all_seeing(names, c={"offset": 4.0}), bound=3.0)["exit"] == 1
    # with two nodes the file server's clock breaks the tie
    v = verdict_of(tmp_path, all_seeing(["a", "b"], b={"offset": -9.0}))
    assert v["exit"] == 1 and list(v["bad_nodes"]) == ["b"]


def test_a_skew_only_the_token_exchange_can_prove(tmp_path: Path) -> None:
    """mtime from the client's clock (Lustre, a local fs): offsets all 0. b read a's token 20 s
    (b's clock) before a wrote it (a's clock): b's clock is behind by more than 20 - 0.5 s."""
    names = ["a", "b"]
    docs = all_seeing(names, a={"exchange": {"b": (1000.5, 1000.0)}}, b={"exchange": {"a": (980.5, 1000.0)}})
    v = verdict_of(tmp_path, docs)
    assert v["exit"] == 2 and v["bad_nodes"] == {}
    assert v["problems"] == ["the clocks of a and b differ by at least 19.5 s (bound 5 s) and it cannot be told which "
                             "is wrong: check chronyd/ntpd on both"]
    assert v["skew_s"] == 19.5 and v["clock"]["method"] == "token exchange"
    third = report("c", seen=["a", "b"], exchange={"a": (1000.4, 1000.0), "b": (980.6, 1000.0)})
    docs = [report("a", seen=["b", "c"], exchange={"b": (1000.5, 1000.0), "c": (1000.3, 1000.0)}),
            report("b", seen=["a", "c"], exchange={"a": (980.5, 1000.0), "c": (980.4, 1000.0)}), third]
    v = verdict_of(tmp_path, docs)
    assert v["exit"] == 1 and list(v["bad_nodes"]) == ["b"] and "token exchange" in v["bad_nodes"]["b"]


def test_write_errors_on_the_shared_dir(tmp_path: Path) -> None:
    docs = all_seeing(["a", "b", "c"])
    docs[0]["shared"]["checkpoint_dir"].update(written=False, error="cannot write a token into /c: Read-only file system")
    for d in docs[1:]:
        d["shared"]["checkpoint_dir"]["seen"] = [n for n in ("b", "c") if n != d["node"]]
    v = verdict_of(tmp_path, docs)
    assert v["exit"] == 1 and v["bad_nodes"] == {"a": "cannot write a token into /c: Read-only file system"}


@pytest.mark.parametrize("name", ["node%201", "n'$(touch${IFS}pwned)\"", "../../etc", ".hidden", "-n", "n\\x", "*"])
def test_hostile_node_names(h100: Node, tmp_path: Path, name: str) -> None:
    plan = make_plan(tmp_path)
    names = [name, "n2"]
    out = run_nodes(h100, tmp_path, names, {n: plan for n in names})
    assert sorted(p.name for p in out.iterdir()) == sorted([file_name(name, ".json"), "n2.json"])
    assert all(p.parent == out for p in out.iterdir())
    rc, lines, verdict = run_judge(plan, out, names, tmp_path)
    assert rc == 0, lines
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
    # (names are whitespace-free: Slurm's node names are, and the node lists are space-separated)
    (out / file_name(name, ".json")).unlink()
    rc, lines, verdict = run_judge(plan, out, names, tmp_path)
    assert rc == 1 and list(verdict["bad_nodes"]) == [name]


def test_hostile_paths(h100: Node, tmp_path: Path) -> None:
    work = tmp_path / "a dir; $(touch pwned) 'q'" / "work"
    plan = make_plan(tmp_path, workdir=work)
    rep = run_node(h100, plan, tmp_path / "out o")
    assert failures(rep) == [] and not (tmp_path / "pwned").exists()


def test_the_stage_entry_needs_no_runtime_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.injob.stages import dispatch as stages

    def refuse(*a: Any) -> str:
        raise AssertionError("the runtime package check ran")

    monkeypatch.setattr(stages, "check", refuse)
    write_reports(tmp_path / "out", all_seeing(["a", "b"]))
    (tmp_path / "plan.json").write_text(json.dumps(make_plan(tmp_path)))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert stages.main(["preflight-judge", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "out"),
                        "--nodes", "a b"]) == 0
    with pytest.raises(SystemExit):
        stages.parse(["preflight-judge", "--plan", "p.json", "--out", "o"])
    with pytest.raises(SystemExit):
        stages.parse(["preflight", "--plan", "p.json"])


def test_the_package_imports_only_the_standard_library() -> None:
    code = ("import sys, lingjun_slurm.injob.preflight.node, lingjun_slurm.injob.preflight.judge, lingjun_slurm.injob.stages.dispatch; "
            "bad = [m for m in ('pydantic', 'yaml', 'torch', 'click', 'numpy') if m in sys.modules]; print(bad)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert proc.stdout.strip() == "[]"


# ------------------------------------------------------------------ a node whose container starts late
def run_nodes_late(n: Node, tmp: Path, names: list[str], plans: dict[str, dict], late: dict[str, float],
                   **extra: str) -> Path:
    """Like run_nodes, but the task of each node in LATE starts that many seconds after the others:
    pyxis/enroot unpack the image on each node before the task runs, minutes for a large image,
    not at the same time everywhere."""
    out = tmp / "out"
    procs, t0 = [], time.monotonic()
    for name in sorted(names, key=lambda x: late.get(x, 0.0)):
        time.sleep(max(0.0, late.get(name, 0.0) - (time.monotonic() - t0)))
        plan_file = tmp / f"plan-{name}.json"
        plan_file.write_text(json.dumps(plans[name]))
        procs.append(spawn(n, plan_file, out, name, " ".join(names), **extra))
    for p in procs:
        text, _ = p.communicate(timeout=90)
        assert p.returncode == 0, text
    return out


def test_a_node_whose_container_starts_late_is_not_excluded(h100: Node, tmp_path: Path) -> None:
    """n3's task starts 6 s after n1's and n2's, past their 3 s window (a 20 GB image unpacking
    90 s later than on the others, scaled down): they stopped waiting before its token was
    written, and it read theirs at once. Its directory is shared: not excluded."""
    plan = make_plan(tmp_path)
    names = ["n1", "n2", "n3"]
    out = run_nodes_late(h100, tmp_path, names, {n: plan for n in names}, {"n3": 6.0})
    n1 = json.loads((out / "n1.json").read_text())
    assert not check(n1, "shared-workdir")[0]["ok"]  # n1 alone cannot tell late from elsewhere
    rc, lines, verdict = run_judge(plan, out, names, tmp_path)
    assert rc == 0 and verdict["bad_nodes"] == {} and verdict["problems"] == [], lines
    assert 5 <= verdict["late"]["n3"] < 30
    assert "node n3 started " in lines and "judged on its own reading of theirs" in lines


def test_a_late_node_that_does_not_share_is_still_excluded(h100: Node, tmp_path: Path) -> None:
    plan = make_plan(tmp_path)
    lonely = make_plan(tmp_path, workdir=tmp_path / "n3-local" / "work")
    lonely["checkpoint_dir"] = plan["checkpoint_dir"]
    names = ["n1", "n2", "n3"]
    out = run_nodes_late(h100, tmp_path, names, {"n1": plan, "n2": plan, "n3": lonely}, {"n3": 6.0})
    rc, lines, verdict = run_judge(plan, out, names, tmp_path)
    assert rc == 1 and list(verdict["bad_nodes"]) == ["n3"], lines
    assert verdict["bad_nodes"]["n3"].startswith(f"workdir {plan['workdir']} is not the directory the other 2 nodes "
                                                 f"share (it read the tokens of none of them")


def timed_report(name: str, seen: list[str], written: float, until: float, window: float = 60.0) -> dict:
    doc = report(name, seen=seen)
    for entry in doc["shared"].values():
        entry.update(written_at=written, waited_until=until, timeout_s=window)
    return doc


def test_the_judge_measures_each_miss_from_the_peer_s_start(tmp_path: Path) -> None:
    """Reports as the nodes write them, 60 s window: c's container started 90 s after a's and b's."""
    early = [timed_report("a", ["b"], 1000.0, 1060.0), timed_report("b", ["a"], 1000.2, 1060.2)]
    v = verdict_of(tmp_path, early + [timed_report("c", ["a", "b"], 1090.0, 1090.3)])
    assert v["exit"] == 0 and v["bad_nodes"] == {} and v["late"] == {"c": 90.0}
    # late and not sharing: it had a's and b's tokens for its whole window and read none
    v = verdict_of(tmp_path, early + [timed_report("c", [], 1090.0, 1150.0)])
    assert v["exit"] == 1 and list(v["bad_nodes"]) == ["c"]
    # on time and not sharing: both sides had a full window
    v = verdict_of(tmp_path, early + [timed_report("c", [], 1000.1, 1060.1)])
    assert v["exit"] == 1 and list(v["bad_nodes"]) == ["c"] and v["late"] == {}
    # 30 s late: a and b still had 30 s of their window, not a full one; c read theirs
    v = verdict_of(tmp_path, early + [timed_report("c", ["a", "b"], 1030.0, 1030.2)])
    assert v["exit"] == 0 and v["bad_nodes"] == {}
    # a report without the timing fields (an older lingjun_slurm in the image): every miss counts
    old = report("c", seen=["a", "b"])
    v = verdict_of(tmp_path, early + [old])
    assert v["exit"] == 1 and list(v["bad_nodes"]) == ["c"]
