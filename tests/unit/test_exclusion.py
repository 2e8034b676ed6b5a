"""Bad-node exclusion (lingjun_slurm/injob/host/exclusion.py): the record, the bound, the stuck ranks of a hang,
node failures; with stand-ins for scontrol and sinfo that print what Slurm 22.05 prints
(`scontrol show job -o`, `sinfo -h -N -o '%N %T'`). The real requeuehold/update/release path runs
on the test cluster (tests/integration/test_faults_slurm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm.injob.host import exclusion
from lingjun_slurm.status import StageStatus, _add_note

REPO = Path(__file__).resolve().parents[2]


def stand_ins(tmp: Path, sinfo: str, partition: str = "gpu", job: str = "ExcNodeList=(null) ReqNodeList=(null)",
              reservation: str = "") -> dict[str, str]:
    """scontrol: `show job -o` prints `JobId=7 Partition=... <job>`, `show hostnames a,b` one per line
    (no bracket ranges here), `show reservation -o` prints <reservation>; sinfo prints <sinfo>."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp / "calls.log"
    (bin_dir / "scontrol").write_text(
        f"#!/bin/bash\necho \"scontrol $*\" >> {log}\n"
        f"if [ \"$1 $2\" = 'show job' ]; then echo 'JobId=7 JobName=x Partition={partition} {job}'; fi\n"
        "if [ \"$1 $2\" = 'show hostnames' ]; then echo \"$3\" | tr ',' '\\n'; fi\n"
        f"if [ \"$1 $2\" = 'show reservation' ]; then echo '{reservation}'; fi\n")
    (bin_dir / "sinfo").write_text(f"#!/bin/bash\necho \"sinfo $*\" >> {log}\ncat <<'EOF'\n{sinfo}EOF\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.host.exclusion", *args], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=60)


FOUR_IDLE = "node1 allocated\nnode2 allocated\nnode3 idle\nnode4 idle\n"


def test_a_bad_node_is_excluded_and_recorded(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, FOUR_IDLE)
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2",
               "--node", "node2", "--reason", "mlx5_2 port 1 DOWN", "--source", "preflight")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "node2"
    assert "node node2: mlx5_2 port 1 DOWN (preflight): excluding it from the requeue" in proc.stderr
    doc = json.loads((tmp_path / "nodes" / "excluded.json").read_text())
    assert [(n["node"], n["excluded"], n["job"], n["source"]) for n in doc["nodes"]] == [("node2", True, "7", "preflight")]
    # A second bad node later in the same job: the list carries both (ExcNodeList replaces, not adds).
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2",
               "--node", "node1", "--reason", "rank 3 hung", "--source", "watchdog")
    assert proc.stdout.strip() == "node2,node1"
    assert "-p gpu" in (tmp_path / "calls.log").read_text()  # the job's own partition is what must still fit


def test_the_bound_keeps_the_job_fitting_its_partition(tmp_path: Path) -> None:
    """3 nodes, one drained: a 2-node job cannot lose another one and still start."""
    env = stand_ins(tmp_path, "node1 allocated\nnode2 allocated\nnode3 drained\n")
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "5",
               "--node", "node1", "--reason", "GPU count 7 of 8", "--source", "preflight")
    assert proc.returncode == 0
    assert proc.stdout.strip() == ""
    assert "not excluded: the job needs 2 nodes and its partition would keep 1 usable" in proc.stderr
    doc = json.loads((tmp_path / "nodes" / "excluded.json").read_text())
    assert doc["nodes"][0]["excluded"] is False


def test_the_bound_caps_the_count_per_job(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, FOUR_IDLE + "node5 idle\nnode6 idle\n")
    args = ["add", "--run-dir", str(tmp_path), "--job", "7", "--need", "1", "--max", "1"]
    assert run(env, *args, "--node", "node1", "--reason", "a", "--source", "preflight").stdout.strip() == "node1"
    proc = run(env, *args, "--node", "node2", "--reason", "b", "--source", "preflight")
    assert proc.stdout.strip() == ""  # node2 recorded, not excluded: nothing new to set
    assert "training.exclude_bad_nodes (1) already excluded" in proc.stderr
    # Another job of the run (a resubmit) starts with its own budget.
    assert run(env, "add", "--run-dir", str(tmp_path), "--job", "8", "--need", "1", "--max", "1", "--node", "node2",
               "--reason", "b", "--source", "preflight").stdout.strip() == "node2"


def test_not_responding_nodes_do_not_count_as_usable(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, "node1 allocated\nnode2 idle*\nnode3 down\nnode4 idle\n")
    assert exclusion.usable_nodes is not None
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "1", "--max", "2",
               "--node", "node1", "--reason", "x", "--source", "preflight")
    assert proc.stdout.strip() == "node1"  # node4 is left
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "1", "--max", "2",
               "--node", "node4", "--reason", "y", "--source", "preflight")
    assert proc.stdout.strip() == ""  # node4 would leave none: node2 (idle*) and node3 (down) don't count
    assert "would keep 0 usable" in proc.stderr


def test_a_preflight_verdict_and_a_failed_drain(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, FOUR_IDLE)
    (tmp_path / "scontrol-fail").write_text("")
    bin_sc = tmp_path / "bin" / "scontrol"
    bin_sc.write_text(bin_sc.read_text() + "if [ \"$1\" = update ]; then echo 'Access/permission denied' >&2; "
                                           "exit 1; fi\n")
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"ok": False, "bad_nodes": {"node3": "no pre-flight report", "node1": "it's $(x)"}}))
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2", "--drain",
               "--verdict", str(verdict))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "node1,node3"
    doc = json.loads((tmp_path / "nodes" / "excluded.json").read_text())
    assert [n["drained"] for n in doc["nodes"]] == [False, False]
    assert "permission denied" in doc["nodes"][0]["drain_error"]
    assert "Reason=lingjun-slurm: it's $(x)" in (tmp_path / "calls.log").read_text()


def write_stack(d: Path, node: str, rank: int, dumped: bool) -> None:
    text = f"lingjun-slurm stacks: rank {rank} on {node}\n"
    if dumped:
        text += 'Thread 0x00007f (most recent call first):\n  File "train.py", line 3 in all_reduce\n'
    (d / f"{node}-rank{rank}-pid{100 + rank}.txt").write_text(text)


def test_the_ranks_that_never_answered_name_their_node(tmp_path: Path) -> None:
    d = tmp_path / "stacks"
    d.mkdir()
    for rank, node, dumped in ((0, "node-a1", True), (1, "node-a1", True), (2, "node-b2", True), (3, "node-b2", False)):
        write_stack(d, node, rank, dumped)
    assert exclusion.stuck_nodes(str(d)) == {"node-b2": [3]}
    # Nobody answered (stacks not installed, or the whole job stopped): no one to blame.
    for f in d.iterdir():
        f.write_text("header only\n")
    assert exclusion.stuck_nodes(str(d)) == {}
    assert exclusion.stuck_nodes(str(tmp_path / "missing")) == {}


def test_hung_excludes_the_silent_node(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, FOUR_IDLE)
    d = tmp_path / "stacks"
    d.mkdir()
    write_stack(d, "node1", 0, True)
    write_stack(d, "node2", 1, False)
    record = tmp_path / "hang.json"
    record.write_text(json.dumps({"last_iteration": 12}))
    proc = run(env, "hung", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2",
               "--record", str(record), "--stacks", str(d))
    assert proc.stdout.strip() == "node2", proc.stderr
    assert "rank 1 hung (no stack dump on request; last iteration 12)" in proc.stderr


def test_gone_excludes_nodes_slurm_has_down(tmp_path: Path) -> None:
    env = stand_ins(tmp_path, "node1 idle\nnode2 down*\n")
    proc = run(env, "gone", "--run-dir", str(tmp_path), "--job", "7", "--need", "1", "--max", "2",
               "--nodes", "node1 node2")
    assert proc.returncode == 0
    # node2 is down: the partition check (same stand-in) leaves node1 usable for a 1-node job.
    assert proc.stdout.strip() == "node2", proc.stderr
    assert "node failure (Slurm state down* after the last attempt)" in proc.stderr


@pytest.mark.parametrize("state", ["RUNNING", "PENDING", "COMPLETED"])
def test_status_shows_excluded_nodes(tmp_path: Path, state: str) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "excluded.json").write_text(json.dumps({"schema": 1, "nodes": [
        {"node": "node2", "reason": "mlx5_2 port 1 DOWN", "source": "preflight", "job": "7", "excluded": True},
        {"node": "node9", "reason": "old", "source": "preflight", "job": "3", "excluded": True},
        {"node": "node1", "reason": "rank 0 hung", "source": "watchdog", "job": "7", "excluded": False,
         "not_excluded": "the job needs 2 nodes and its partition would keep 1 usable"}]}))
    st = StageStatus("train", ["7"], state, None, None, None, None, 1)
    _add_note(st, None, str(tmp_path))
    assert st.reason == ("excluded node2 (preflight: mlx5_2 port 1 DOWN); not excluded node1 (watchdog: rank 0 hung; "
                         "the job needs 2 nodes and its partition would keep 1 usable)")


def test_status_ignores_a_damaged_record(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "excluded.json").write_text("{not json")
    st = StageStatus("train", ["7"], "RUNNING", None, None, None, None, 0)
    _add_note(st, None, str(tmp_path))
    assert st.reason is None


def test_crashed_excludes_the_node_a_device_error_is_tied_to(tmp_path: Path) -> None:
    """This attempt's part of the job log (from --offset): a real uncorrectable-ECC excerpt
    (tests/fixtures/crashlogs) with srun's task lines, gpu2 failing first; the part before the
    offset (an earlier attempt blaming gpu1) is not read."""
    env = stand_ins(tmp_path, "gpu1 allocated\ngpu2 allocated\ngpu3 idle\n")
    ecc = (REPO / "tests" / "fixtures" / "crashlogs" / "kohya_1434_ecc.log").read_text()
    earlier = ecc + "srun: error: gpu1: task 0: Exited with exit code 1\nsrun: error: gpu2: task 1: Killed\n"
    log = tmp_path / "train-7.out"
    log.write_text(earlier + ecc + "srun: error: gpu2: task 1: Exited with exit code 1\n"
                                   "srun: error: gpu1: task 0: Killed\n")
    args = ["crashed", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2", "--log", str(log),
            "--nodes", "gpu1 gpu2"]
    proc = run(env, *args, "--offset", str(len(earlier.encode())))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "gpu2", proc.stderr
    doc = json.loads((tmp_path / "nodes" / "excluded.json").read_text())
    assert [(n["node"], n["source"]) for n in doc["nodes"]] == [("gpu2", "crash")]
    # A crash without a device error (here: nothing after the end) blames no one: nothing to set.
    proc = run(env, *args, "--offset", str(log.stat().st_size))
    assert proc.stdout.strip() == "" and len(json.loads((tmp_path / "nodes" / "excluded.json").read_text())
                                             ["nodes"]) == 1


def test_the_jobs_own_exclusions_stay_and_its_required_nodes_are_never_excluded(tmp_path: Path) -> None:
    """The spec's sbatch_extra exclude is the job's ExcNodeList: an update replaces it, so it is kept
    in the list; a node of the job's nodelist (ReqNodeList) would leave it pending for good."""
    env = stand_ins(tmp_path, FOUR_IDLE + "node9 idle\n", job="ExcNodeList=node9 ReqNodeList=node1")
    base = ["add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "3"]
    proc = run(env, *base, "--node", "node1", "--reason", "x", "--source", "preflight")
    assert proc.stdout.strip() == "" and "the job requires this node (its nodelist)" in proc.stderr
    proc = run(env, *base, "--node", "node2", "--reason", "y", "--source", "preflight")
    assert proc.stdout.strip() == "node9,node2", proc.stderr


@pytest.mark.parametrize("state", ["idle$", "mixed$", "idle!", "idle%", "reserved", "blocked", "idle@", "down~"])
def test_nodes_slurm_would_not_allocate_now_are_not_counted(tmp_path: Path, state: str) -> None:
    """node_state_string's suffixes and states (SchedMD/slurm src/common/slurm_protocol_defs.c): a
    maintenance reservation ($), power down pending/in progress (! %), reboot pending (@), reserved,
    blocked, down: a 2-node job on node1..node3 whose node3 is in that state cannot lose node2."""
    env = stand_ins(tmp_path, f"node1 allocated\nnode2 allocated\nnode3 {state}\n")
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2",
               "--node", "node2", "--reason", "x", "--source", "preflight")
    assert proc.stdout.strip() == "", (state, proc.stderr)


@pytest.mark.parametrize("state", ["idle~", "allocated+", "mixed-", "planned", "idle"])
def test_usable_states_count(tmp_path: Path, state: str) -> None:
    env = stand_ins(tmp_path, f"node1 allocated\nnode2 allocated\nnode3 {state}\n")
    proc = run(env, "add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2",
               "--node", "node2", "--reason", "x", "--source", "preflight")
    assert proc.stdout.strip() == "node2", (state, proc.stderr)


def test_the_bound_counts_only_the_jobs_reservation_and_constraint(tmp_path: Path) -> None:
    sinfo = "node1 allocated h100,ib\nnode2 allocated h100,ib\nnode3 idle h100,ib\nnode4 idle a100,ib\n"
    base = ["add", "--run-dir", str(tmp_path), "--job", "7", "--need", "2", "--max", "2", "--node", "node2",
            "--reason", "x", "--source", "preflight"]
    # constraint h100: node4 does not count, node3 does
    env = stand_ins(tmp_path, sinfo, job="ExcNodeList=(null) Features=h100&ib")
    assert run(env, *base).stdout.strip() == "node2"
    (tmp_path / "nodes" / "excluded.json").unlink()
    # in reservation big (node1, node2, node4) with constraint h100: only node1 would be left
    env = stand_ins(tmp_path, sinfo, job="ExcNodeList=(null) Features=h100 Reservation=big",
                    reservation="ReservationName=big Nodes=node1,node2,node4 State=ACTIVE")
    proc = run(env, *base)
    assert proc.stdout.strip() == "" and "its partition and reservation would keep 1 usable" in proc.stderr
    (tmp_path / "nodes" / "excluded.json").unlink()
    # a constraint with counts cannot be counted: nothing is excluded
    env = stand_ins(tmp_path, sinfo, job="ExcNodeList=(null) Features=[h100*2&ib]")
    proc = run(env, *base)
    assert proc.stdout.strip() == "" and "cannot be counted" in proc.stderr
