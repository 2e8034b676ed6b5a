"""The other ranks wait for rank 0's checkpoint check longer than the process group's timeout
(issue 15 item 5): with LINGJUN_VERIFY_CHECKPOINT=full rank 0 hashes the whole checkpoint, which
on terabytes outlasts the 30-minute timeout a collective (broadcast_object_list) gives up after.

Two real processes and a real gloo process group whose timeout is 2 s; rank 0's check takes 6 s.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from .helpers import REPO, free_port, stage_env

SCRIPT = textwrap.dedent("""
    import datetime, os, sys, time
    from types import SimpleNamespace
    import torch.distributed as dist
    from lingjun_slurm.injob.train import resume

    rank, port, how = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=2))
    rt = SimpleNamespace(rank=rank, world_size=2, use_cuda=False, device=None)

    def slow_check():
        if how == "late":
            return ["fast"]
        time.sleep(6)
        if how == "raise":
            raise OSError(5, "Input/output error")
        return ["file __0_0.distcp truncated"]

    if how == "late" and rank == 1:
        time.sleep(3)  # still on its way (a slow import, a slow node) when rank 0 has its answer
    try:
        got = resume.from_rank0(rt, slow_check)
        print(f"rank {rank} got {got}", flush=True)
    except Exception as exc:
        print(f"rank {rank} error {type(exc).__name__}: {exc}", flush=True)
    dist.destroy_process_group()
""")


def _run(how: str) -> list[str]:
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, str(rank), port, how], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=stage_env(), cwd=str(REPO))
             for rank in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    return [next((line for line in out.splitlines() if line.startswith(f"rank {r} ")), out[-2000:])
            for r, out in enumerate(outs)]


def test_ranks_wait_for_a_check_longer_than_the_process_group_timeout() -> None:
    assert _run("ok") == ["rank 0 got ['file __0_0.distcp truncated']",
                          "rank 1 got ['file __0_0.distcp truncated']"]


def test_an_error_on_rank_0_reaches_the_others() -> None:
    assert _run("raise") == ["rank 0 error OSError: [Errno 5] Input/output error",
                             "rank 1 error TrainError: rank 0 could not check the checkpoint: [Errno 5] Input/output "
                             "error"]


def test_rank_0_waits_until_every_rank_has_read_the_answer() -> None:
    """Rank 0's process is the store's server: a rank 0 that answered and exited at once (the
    finished-run path: "nothing to train") left a later rank with "Failed to recv, got 0 bytes"."""
    assert _run("late") == ["rank 0 got ['fast']", "rank 1 got ['fast']"]
