"""`lingjun-slurm nccl-test` end to end on the real test Slurm cluster (tests/cluster, node1..node4).

There are no GPUs and no nccl-tests binaries here, so the binaries are a FAKE:
tests/fixtures/nccl/standin/ replays real recorded nccl-tests outputs (sources in its docstring
and tests/fixtures/nccl/SOURCES.md), scaled by a per-node factor so one node can be made slow.
Everything else is real: sbatch, the rendered script, srun across nodes (--mpi=pmi2: Debian's
slurm has the pmix plugin but not the PMIx library it loads), squeue/sacct, the report and chart.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_nccltests_report import need_matplotlib

from .helpers import cli

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
STANDIN = str(REPO / "tests" / "fixtures" / "nccl" / "standin")
COMMON = ["--profile", "tcp", "--partition", "cpu", "--gpus-per-node", "0", "--no-container", "--tests-dir", STANDIN,
          "--mpi", "pmi2", "--time", "5", "--poll-interval", "0.5"]


@pytest.fixture
def env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    need_matplotlib()
    factors = tmp_path / "factors.txt"
    factors.write_text("")
    return {**slurm_cluster.env, "NCCL_STANDIN_FACTORS": str(factors)}


def slow(env: dict[str, str], **nodes: str) -> None:
    Path(env["NCCL_STANDIN_FACTORS"]).write_text("".join(f"{n} {f}\n" for n, f in nodes.items()))


def png(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_four_nodes_table_chart_and_verdict(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "run"
    started = time.monotonic()
    proc = cli("nccl-test", *COMMON, "--nodelist", "node[1-4]", "--outdir", str(out),
               "--expect", "all_reduce=330@8G", env=env)
    took = time.monotonic() - started
    text = proc.stdout
    assert "nccl-tests on 4 nodes x 1 task (no GPUs), profile tcp" in text and "(COMPLETED)" in text
    assert "size  all_reduce algbw  all_reduce busbw  all_gather algbw  all_gather busbw" in text
    assert "  8 GiB            225.88            338.82                 -                 -" in text  # 4 ranks: x 1.5
    assert "all_reduce: PASS: busbw 338.09 GB/s at 8 GiB >= 330 GB/s (--expect on the command line)" in text
    assert "all_gather: no verdict: no published reference for all_gather_perf (profile tcp)" in text
    assert png(out / "busbw.png") and f"chart: {out / 'busbw.png'}" in text
    doc = json.loads((out / "report.json").read_text())
    assert doc["ok"] and doc["jobs"][0]["state"] == "COMPLETED" and doc["jobs"][0]["nodes"] == "node[1-4]"
    for op in doc["ops"]:  # the JSON report (-J) was read, and one rank per node ran in one step
        assert op["file"] == str(out / f"{op['op']}.json") and op["ranks"] == 4
    assert (out / "all_reduce.txt").read_text().count("on      node") == 4  # rank lines of node1..node4
    print(f"4-node nccl-test (2 ops) end to end: {took:.1f} s")


def test_one_slow_node_fails_the_whole_run(tmp_path: Path, env: dict[str, str]) -> None:
    slow(env, node2="0.5")
    proc = cli("nccl-test", *COMMON, "--nodes", "3", "--ops", "all_reduce", "--min-bytes", "1G", "--outdir",
               str(tmp_path / "run"), "--expect", "all_reduce=330@8G", env=env, check=1)
    assert "all_reduce: FAIL: busbw 169.04 GB/s at 8 GiB < 330 GB/s" in proc.stdout


def test_fake_gpus_and_a_profile_without_a_reference(tmp_path: Path, env: dict[str, str]) -> None:
    """The gpu partition's fake gres: 2 tasks per node; Lingjun has no published figure: no verdict, exit 0."""
    args = [a for a in COMMON if a not in ("--gpus-per-node", "0", "--partition", "cpu", "--profile", "tcp")]
    proc = cli("nccl-test", *args, "--profile", "lingjun", "--partition", "gpu", "--gpus-per-node", "2",
               "--nodes", "2", "--ops", "all_reduce", "--outdir", str(tmp_path / "run"), "--json", env=env)
    doc = json.loads(proc.stdout)
    op = doc["ops"][0]
    assert doc["ok"] and op["ranks"] == 4 and op["verdict"] == "NONE"
    assert "no published reference for all_reduce_perf (profile lingjun)" in op["reason"]
    script = (tmp_path / "run" / "nccl-test.sbatch").read_text()
    assert "#SBATCH --gpus-per-node=2" in script and "export NCCL_IB_TC=136" in script


def test_a_failing_node_fails_the_job_and_the_command(tmp_path: Path, env: dict[str, str]) -> None:
    slow(env, node2="fail")
    proc = cli("nccl-test", *COMMON, "--nodelist", "node[1-2]", "--ops", "all_reduce", "--outdir",
               str(tmp_path / "run"), "--no-chart", env=env, check=1)
    assert "all_reduce: FAIL: no results table" in proc.stdout and "unhandled system error" in proc.stdout
    assert "(FAILED)" in proc.stdout and "job log: " in proc.stdout


def test_no_wait_then_report(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "run"
    proc = cli("nccl-test", *COMMON, "--nodes", "2", "--ops", "all_gather", "--outdir", str(out), "--no-wait",
               env=env)
    job_id = proc.stdout.strip()
    assert job_id.isdigit() and f"--report {out}" in proc.stderr
    deadline = time.monotonic() + 60
    while not (out / "jobs" / job_id).is_file() or "end " not in (out / "jobs" / job_id).read_text():
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.3)
    report = cli("nccl-test", "--report", str(out), "--profile", "tcp", env=env)
    assert "  1 GiB            244.28            122.14" in report.stdout and png(out / "busbw.png")  # 2 ranks: busbw = algbw / 2


def test_bisect_finds_the_slow_node(tmp_path: Path, env: dict[str, str]) -> None:
    slow(env, node3="0.6")
    out = tmp_path / "bisect"
    started = time.monotonic()
    proc = cli("nccl-test", *COMMON, "--nodelist", "node[1-4]", "--bisect", "--min-bytes", "1G", "--outdir",
               str(out), env=env, check=1)
    took = time.monotonic() - started
    text = proc.stdout
    assert "slow node(s): node3" in text
    assert "    1  node1+node2                         338.82  ok" in text
    assert "    1  node3+node4                         203.29  BELOW" in text
    assert "node3: with node1: 203.29 GB/s < 271.06 GB/s" in text
    doc = json.loads((out / "report.json").read_text())
    assert doc["slow"] == ["node3"] and doc["undetermined"] == [] and len(doc["pairs"]) == 4
    assert [p["round"] for p in doc["pairs"]] == [1, 1, 2, 2]
    assert png(out / "busbw.png")
    # Each pair's job ran on exactly its two nodes.
    for pair in doc["pairs"]:
        ranks = json.loads(Path(pair["directory"], "all_reduce.json").read_text())["config"]["devices"]
        assert sorted(d["hostname"] for d in ranks) == sorted(pair["nodes"])
    print(f"bisection of 4 nodes (2 rounds, 4 jobs): {took:.1f} s")


def test_bisect_polls_once_per_round_not_once_per_job(tmp_path: Path, env: dict[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, to count the Slurm commands: one squeue per poll, sbatch once per pair."""
    from lingjun_slurm import network
    from lingjun_slurm.nodes.nccltests.bisect_run import run_bisection
    from lingjun_slurm.nodes.nccltests.plan import NcclJob
    from lingjun_slurm.nodes.nccltests.run import Waiter
    from lingjun_slurm.slurm.client import SlurmCLI
    from lingjun_slurm.transport import LocalTransport

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}")
    slow(env, nodeX="0.5")  # not a node of this test: nobody is slow
    t = LocalTransport()
    base = NcclJob(job_name="nb", out_dir=str(tmp_path / "b"), network=network.resolve(network.get_profile("tcp")),
                   gpus_per_node=0, partition="cpu", time_s=300, image=None, tests_dir=STANDIN, mpi="pmi2",
                   min_bytes=1 << 30, max_bytes=8 << 30)
    polls: list[str] = []
    report = run_bisection(t, Waiter(t, SlurmCLI(t), poll_s=0.5), base, ["node1", "node2", "node3", "node4"],
                           reference=None, progress=polls.append)
    assert report.ok and report.outcome.good == ["node1", "node2", "node3", "node4"]
    programs = [argv[0] for argv in t.history]
    assert programs.count("sbatch") == 2  # round 1 only: both pairs good
    assert set(programs) <= {"sbatch", "squeue", "sacct"}, programs  # never a per-job scontrol/squeue -j
    assert all("-j" not in argv and "--jobs" not in " ".join(argv) for argv in t.history if argv[0] == "squeue")
