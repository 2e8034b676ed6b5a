"""64 nodes on the real Slurm (issue 31, item 3): the bad-node exclusion bound with a reservation and
node features, and the train job's pre-flight (its shared-directory file exchange, the judge, the
exclusion and the requeue) across 60 nodes, on ONE 64-node dev cluster for the module.

The cluster: node1..node64, 2 CPUs each, no GPUs, no accounting (cheaper to start; nothing here
reads sacct), fast timers, cgroups where writable, Features=ib on node1..node62 (slurm.conf
NodeName lines, DevClusterConfig.node_features); a reservation is created per test with
`scontrol create reservation` (real Slurm, nothing mocked). Ports from 23400 (own range: the suite's
clusters use 16900.. and 18300..).

The train ranks of the chain test are light stand-ins: a `python3` first on PATH runs a
standard-library rank in place of `python3 -m lingjun_slurm.stages train` (file rendezvous of all
ranks, rank 0 writes the checkpoint tracker), as bench/scale_train.py does; the pre-flight, the judge,
the exclusion, the watchdog and the batch script are the real ones. 60 torch ranks would need
about 13 GB and minutes of CPU on CI's 2 cores.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError, cgroup_problem
from lingjun_slurm.injob.host import exclusion

from .fixtures import require_slurm, slurm, submit, wait_job

NODES = 64
IB_NODES = 62  # Features=ib on node1..node62; node63, node64 have none
BASE_PORT = 23400


@pytest.fixture(scope="module")
def cluster64() -> Iterator[DevCluster]:
    require_slurm()
    root = Path(f"/tmp/lingjun-test-scale64-{os.getpid()}")
    features = {f"node{i}": ("ib",) for i in range(1, IB_NODES + 1)}
    cluster = None
    # A 64-node cluster spans base..base+3 and base+200..base+263: step past it.
    for base in range(BASE_PORT, BASE_PORT + 300 * 6, 300):
        candidate = DevCluster(DevClusterConfig(root=root, nodes=NODES, cpus_per_node=2, gpus_per_node=0,
                                                base_port=base, fast_timers=True, cgroups=cgroup_problem() is None,
                                                cluster_name="lingjun-scale64", node_features=features))
        if not candidate.ports_in_use():
            cluster = candidate
            break
    if cluster is None:
        pytest.fail(f"no free ports for a 64-node test cluster from {BASE_PORT}")
    try:
        cluster.up(timeout=240)
    except DevClusterError as exc:
        pytest.fail(f"64-node test cluster did not start:\n{exc}")
    try:
        yield cluster
    finally:
        cluster.down()
        if not os.environ.get("LINGJUN_KEEP_TEST_CLUSTER"):
            shutil.rmtree(root, ignore_errors=True)


def reservation(env: dict[str, str], name: str, nodes: str) -> None:
    slurm(env, "scontrol", "create", "reservation", f"ReservationName={name}", "StartTime=now", "Duration=60",
          "Users=root", f"Nodes={nodes}", "Flags=IGNORE_JOBS")


def job_field(env: dict[str, str], job: str, key: str) -> str:
    out = slurm(env, "scontrol", "show", "job", "-o", job).stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith(f"{key}=")), "")


def expand(env: dict[str, str], hostlist: str) -> list[str]:
    return slurm(env, "scontrol", "show", "hostnames", hostlist).stdout.split()


@pytest.mark.slurm
def test_the_exclusion_bound_counts_64_nodes_features_a_reservation_and_drained_nodes(
        cluster64: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reservation on node[33-64], constraint ib (node1..62), node48 drained: the job could use
    node33..47, 49..62 = 29 nodes. A 26-node job may lose 3: node34, node35, node36 are excluded,
    node37 is not (26 left would be 25); node33 is never excluded (the job requires it). Then Slurm
    takes the list (scontrol update ExcNodeList on the held job) and runs the job on exactly the 26
    nodes left, none outside the reservation or without the feature. Each `add` makes a bounded
    number of Slurm calls however many nodes it is given."""
    env = cluster64.env
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reservation(env, "lj64a", "node[33-64]")
    slurm(env, "scontrol", "update", "NodeName=node48", "State=DRAIN", "Reason=scale64 test")
    job = ""
    try:
        job = submit(env, "--hold", "-p", "cpu", "-N26", "--ntasks-per-node=1", "--constraint=ib",
                     "--reservation=lj64a", "--nodelist=node33", "-t", "5", "-o", "/dev/null", "--wrap", "srun true")
        calls: list[list[str]] = []
        real_run = exclusion._run

        def counting(argv: Any) -> subprocess.CompletedProcess:
            calls.append(list(argv))
            return real_run(argv)

        monkeypatch.setattr(exclusion, "_run", counting)
        found = [{"node": f"node{i}", "reason": "eth0 down", "source": "preflight"} for i in (33, 34, 35, 36, 37)]
        got = exclusion.add(str(tmp_path), job, need=26, max_nodes=8, found=found, drain=False)
        assert got == ["node34", "node35", "node36"], got
        # job_fields, ExcNodeList/ReqNodeList hostnames, sinfo, the reservation and its hostnames: not one per node
        assert len(calls) <= 6, calls
        doc = json.loads((tmp_path / "nodes" / "excluded.json").read_text())
        verdicts = {n["node"]: (n["excluded"], n.get("not_excluded", "")) for n in doc["nodes"]}
        assert verdicts["node33"] == (False, "the job requires this node (its nodelist)"), verdicts
        assert verdicts["node37"] == (False, "the job needs 26 nodes and its partition and reservation would keep 25 "
                                             "usable"), verdicts
        assert [n for n, (ex, _) in verdicts.items() if ex] == ["node34", "node35", "node36"]

        slurm(env, "scontrol", "update", f"JobId={job}", f"ExcNodeList={','.join(got)}")
        slurm(env, "scontrol", "release", job)
        assert wait_job(env, job, timeout=120) == "COMPLETED"
        ran = set(expand(env, job_field(env, job, "NodeList")))
        expected = {f"node{i}" for i in range(33, IB_NODES + 1)} - {"node34", "node35", "node36", "node48"}
        assert ran == expected, sorted(ran ^ expected)
    finally:
        if job:
            slurm(env, "scancel", job, check=False)
        slurm(env, "scontrol", "update", "NodeName=node48", "State=RESUME", check=False)
        slurm(env, "scontrol", "delete", "ReservationName=lj64a", check=False)


STANDIN_RANK = '''import os, sys, time, pathlib
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = os.environ["SLURM_JOB_ID"] + "." + os.environ.get("SLURM_RESTART_COUNT", "0")
rdv = pathlib.Path(os.environ["STANDIN_RDV"]) / attempt
rdv.mkdir(parents=True, exist_ok=True)
(rdv / str(rank)).write_text(os.uname().nodename)
end = time.monotonic() + 120
while len(os.listdir(rdv)) < world:
    if time.monotonic() > end:
        sys.exit("rendezvous timed out")
    time.sleep(0.2)
if rank == 0:
    pathlib.Path(os.environ["STANDIN_TRACKER"]).write_text(os.environ["STANDIN_ITERS"])
'''


def standin_env(tmp: Path, tracker: Path, iterations: int) -> dict[str, str]:
    """PATH with a python3 that runs STANDIN_RANK for the train step and the venv's python otherwise."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    rank = tmp / "standin_rank.py"
    rank.write_text(STANDIN_RANK)
    wrapper = bin_dir / "python3"
    wrapper.write_text(
        "#!/bin/bash\n"
        'if [ "${1:-}" = -m ] && [ "${2:-}" = lingjun_slurm.stages ] && [ "${3:-}" = train ]; then\n'
        f"  exec {shlex.quote(sys.executable)} {shlex.quote(str(rank))}\n"
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return {"PATH": path, "STANDIN_RDV": str(tmp / "rdv"), "STANDIN_TRACKER": str(tracker),
            "STANDIN_ITERS": str(iterations)}


def sysfs_roots(tmp: Path, bad: set[str]) -> str:
    """A modelled sysfs per node (LINGJUN_PREFLIGHT_ROOT with {node}): eth0 up, down on `bad`."""
    root = tmp / "roots"
    for i in range(1, NODES + 1):
        net = root / f"node{i}" / "sys" / "class" / "net" / "eth0"
        net.mkdir(parents=True)
        down = f"node{i}" in bad
        (net / "operstate").write_text("down\n" if down else "up\n")
        (net / "carrier").write_text("0\n" if down else "1\n")
    return str(root / "{node}")


@pytest.mark.slurm
def test_preflight_on_60_nodes_excludes_within_the_bound_of_features_and_reservation(
        cluster64: DevCluster, tmp_path: Path) -> None:
    """A 60-node train stage, constraint ib, in a reservation of node[2-64]: it can use node2..62 =
    61 nodes. The pre-flight (NCCL_SOCKET_IFNAME=eth0 against each node's modelled sysfs) finds
    eth0 down on node3 and node5. The judge names both among 60 reports; the bound excludes node3
    (61 - 1 = 60 still fit) and not node5 (59 would not); the job is requeued without node3, lands
    on node[2,4-62], node5's eth0 is still down, nothing more can be excluded, and the job gives
    up (max_restarts 1) with the cause. Every node of each attempt read the other 59 nodes' tokens
    of the shared-directory probe."""
    from tests.integration.helpers import all_ended, cli, submitted_run_id, wait_for

    env = cluster64.env
    reservation(env, "lj64b", "node[2-64]")
    try:
        work = tmp_path / "work"
        ckpt = work / "checkpoints"
        doc: dict[str, Any] = {
            "version": 1,
            "run": {"name": "scale64", "workdir": str(work)},
            "cluster": {"network": {"profile": "tcp", "overrides": {"NCCL_SOCKET_IFNAME": "eth0"}},
                        "reservation": "lj64b", "constraint": "ib",
                        "defaults": {"partition": "cpu", "time": "00:10:00"},
                        "stages": {"train": {"nodes": 60, "tasks_per_node": 1, "gpus_per_node": 0,
                                             "cpus_per_task": 1}}},
            "container": {"runtime": "none"},
            "data": {"prefix": str(tmp_path / "data" / "corpus_text_document"),
                     "tokenizer": {"type": "null", "vocab_size": 128}},
            "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32,
                      "vocab_size": 128},
            "parallelism": {"micro_batch": 1, "global_batch": 60},
            "training": {"iterations": 4, "precision": "fp32", "save_grace_s": 60, "max_restarts": 1,
                         "preflight": True, "preflight_collective_timeout": 0, "hang_timeout": 120,
                         "hang_startup_timeout": 300, "exclude_bad_nodes": 2},
            "checkpoint": {"dir": str(ckpt)},
            "stages": {"preprocess": {"skip": True}, "merge": {"skip": True}, "checkpoint": {"skip": True}},
        }
        spec = tmp_path / "scale64.yaml"
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        ckpt.mkdir(parents=True)
        run_env = {**env, "LINGJUN_STATE_DIR": str(tmp_path / "state"),
                   **standin_env(tmp_path, ckpt / "latest_checkpointed_iteration.txt", 4),
                   "LINGJUN_PREFLIGHT_ROOT": sysfs_roots(tmp_path, {"node3", "node5"}),
                   "LINGJUN_PREFLIGHT_SHARE_TIMEOUT": "60"}
        run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=run_env).stdout)
        run_dir = work / "runs" / run_id
        stages = wait_for(run_id, run_env, all_ended, timeout=400)
        train = stages["train"]
        assert train["state"] == "FAILED" and train["restarts"] == 1, stages
        job = json.loads((run_dir / "manifest.json").read_text())["stages"][0]["job_ids"][0]
        assert job_field(env, job, "ExcNodeList") == "node3"
        first = json.loads((run_dir / "preflight" / f"{job}-0" / "verdict.json").read_text())
        assert first["exit"] == 1 and sorted(first["bad_nodes"]) == ["node3", "node5"], first
        assert len(first["nodes"]) == 60 and "node1" not in first["nodes"], first["nodes"]
        assert not {"node63", "node64"} & set(first["nodes"])
        second = json.loads((run_dir / "preflight" / f"{job}-1" / "verdict.json").read_text())
        assert second["exit"] == 1 and list(second["bad_nodes"]) == ["node5"], second
        assert set(second["nodes"]) == {f"node{i}" for i in range(2, IB_NODES + 1)} - {"node3"}
        excluded = json.loads((run_dir / "nodes" / "excluded.json").read_text())["nodes"]
        assert [(e["node"], e["excluded"]) for e in excluded][:2] == [("node3", True), ("node5", False)], excluded
        assert "the job needs 60 nodes and its partition and reservation would keep 59 usable" in \
            excluded[1]["not_excluded"]
        for attempt, verdict in (("0", first), ("1", second)):
            for node in verdict["nodes"]:
                report = json.loads((run_dir / "preflight" / f"{job}-{attempt}" / f"{node}.json").read_text())
                shared = next(c for c in report["checks"] if c["name"] == "shared-workdir")
                assert shared["ok"] and "tokens of 59 other nodes read" in shared["detail"], (node, shared)
        log = cli("logs", run_id, "train", env=run_env).stdout
        assert "requeueing without node(s) node3" in log, log[-3000:]
        assert "lingjun-slurm: preflight: node node5: " in log, log[-3000:]
    finally:
        slurm(env, "scontrol", "delete", "ReservationName=lj64b", check=False)


@pytest.mark.slurm
def test_the_cluster_takes_a_1024_task_array_and_reports_its_features(cluster64: DevCluster) -> None:
    """MaxArraySize=4001 reaches slurmctld (Slurm's default 1001 would refuse --array=0-1023:
    src/common/read_config.h DEFAULT_MAX_ARRAY_SIZE, slurm-22-05-8-1), and each node's Features."""
    env = cluster64.env
    config = slurm(env, "scontrol", "show", "config").stdout
    assert any(line.split() == ["MaxArraySize", "=", "4001"] for line in config.splitlines()), config
    job = submit(env, "--hold", "--array=0-1023", "-t", "1", "-o", "/dev/null", "--wrap", "true")
    try:
        assert job_field(env, f"{job}_1023", "ArrayTaskId") in ("1023", "0-1023")
    finally:
        slurm(env, "scancel", job, check=False)
    sinfo = slurm(env, "sinfo", "-h", "-N", "-p", "cpu", "-o", "%N %f").stdout
    nodes = dict(line.split() for line in sinfo.splitlines())
    assert len(nodes) == NODES
    assert {n for n, f in nodes.items() if f == "ib"} == {f"node{i}" for i in range(1, IB_NODES + 1)}
    assert nodes["node63"] == nodes["node64"] == "(null)"
