"""The time-limit save and torch DataLoader workers (docs/fault-tolerance.md, "The time-limit save
and DataLoader workers").

At the time limit the train script runs `scancel --signal=TERM $SLURM_JOB_ID`
(slurm_templates/train.sbatch.j2, on_time_limit). Slurm signals every process of the step
(slurmstepd's _handle_signal_container -> proctrack_g_signal(job->cont_id, sig),
src/slurmd/slurmstepd/req.c:643, 820; proctrack/linuxproc: kill_proc_tree, slurm-22-05-8-1), so a
rank's DataLoader workers get SIGTERM with the rank. Modelled here: a "rank" in its own process group, signalled with
killpg(SIGTERM), as proctrack signals every process of the step.

What torch does with it (torch 2.13.0 in .venv; torch/csrc/DataLoader.cpp, pytorch 03d4ef67):
`_worker_loop` first calls `_set_worker_signal_handlers()` (torch/utils/data/_utils/worker.py),
whose C handler_SIGTERM exits 0 only when the sender is the worker's parent and otherwise dies
by SIGTERM; the rank's SIGCHLD handler (_utils/signal_handling.py `_set_SIGCHLD_handler`) then
calls `_error_if_any_worker_fails()`, which raises RuntimeError("DataLoader worker (pid N) is
killed by signal: Terminated.") in the rank's main thread at whatever line it runs: not at the next
batch fetch, so checking the stop flag before fetching does not help. test_plain_workers_lose_the_save
shows the save lost.

Why our runs are not exposed:
- Megatron-LM (>= core_v0.16.0, the supported range, docs/megatron-versions.md) installs its
  DistributedSignalHandler in every DataLoader worker when `--exit-signal-handler` is given
  (megatron/training/datasets/data_samplers.py:75-79 at core_v0.16.1 55ac708, added by 265af20c16,
  "add DistributedSignalHandler to DataLoader workers (#2068)"): a Python handler that replaces
  torch's, so a worker lives through the SIGTERM. The tool always renders `--exit-signal-handler`
  (lingjun_slurm/megatron/args.py). test_megatron_s_worker_handler_keeps_the_save and
  test_every_megatron_version_gets_the_exit_signal_handler.
- The builtin trainer makes no DataLoader (lingjun_slurm/injob/train/data.py Batches reads the
  dataset in the rank itself); test_the_builtin_trainer_starts_no_dataloader_workers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

RANK = r'''
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 10 ** 6
    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.tensor([i])

stop = []
signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

def megatron_worker_init_fn(_):
    # What Megatron-LM core_v0.16.1 data_samplers.py:75-76 does with --exit-signal-handler:
    # DistributedSignalHandler(args.exit_signal).__enter__(), a Python handler that sets a flag.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)

def train(out):
    init = megatron_worker_init_fn if sys.argv[1] == "megatron" else None
    # Megatron-LM's DataLoader: persistent workers (pin_memory is off without a GPU).
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers=True, worker_init_fn=init)
    batches = iter(loader)
    iteration = 0
    while True:
        next(batches)
        t = time.monotonic()
        while time.monotonic() - t < 0.05:  # the step
            pass
        iteration += 1
        if iteration == 4:  # both workers have delivered batches: started, worker_init_fn run
            print("ready", flush=True)
        if stop:  # checked after each step, before the next fetch, as Megatron-LM and the builtin do
            t = time.monotonic()
            while time.monotonic() - t < 1.0:  # the save
                pass
            with open(out, "w") as fh:
                fh.write(f"{iteration}\n")
            print(f"saved at iteration {iteration}", flush=True)
            return

train(sys.argv[2])
sys.exit(0)
'''


def run_rank(tmp_path: Path, mode: str) -> tuple[int, str, Path]:
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    saved = tmp_path / f"saved-{mode}"
    proc = subprocess.Popen([sys.executable, str(script), mode, str(saved)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # a few more iterations, workers busy
        os.killpg(proc.pid, signal.SIGTERM)  # every process of the step, as slurmstepd signals it
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, saved


def test_plain_workers_lose_the_save(tmp_path: Path) -> None:
    """torch's own worker handler: the workers die by SIGTERM and the rank raises before it saves."""
    rc, out, saved = run_rank(tmp_path, "plain")
    assert rc != 0 and not saved.exists(), out
    assert re.search(r"DataLoader worker \(pid \d+\) is killed by signal: Terminated", out), out


def test_megatron_s_worker_handler_keeps_the_save(tmp_path: Path) -> None:
    rc, out, saved = run_rank(tmp_path, "megatron")
    assert rc == 0 and saved.exists() and "saved at iteration" in out, out


@pytest.mark.parametrize("version", ["0.16.0", "0.16.1", "0.17.1", "0.18.2", "0.19.0", "0.20.0"])
def test_every_megatron_version_gets_the_exit_signal_handler(tmp_path: Path, version: str) -> None:
    """The condition under which Megatron-LM protects its workers (data_samplers.py:78-79 at
    core_v0.16.1: `args.exit_signal_handler and args.num_workers > 0`)."""
    from lingjun_slurm.plan import build_plan
    from lingjun_slurm.spec import load_spec

    text = (REPO / "examples" / "megatron-gpt.yaml").read_text()
    assert 'version: "0.16.1"' in text
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(text.replace('version: "0.16.1"', f'version: "{version}"'))
    argv = build_plan(load_spec(spec_file).spec).stage("train").commands[0]
    assert "--exit-signal-handler" in argv
    assert not any(str(a).startswith("--exit-signal=") or str(a) == "--exit-signal" for a in argv)


def test_the_builtin_trainer_starts_no_dataloader_workers() -> None:
    """A DataLoader with workers in lingjun_slurm/injob/train would need the protection above: its
    workers must live through the time limit's SIGTERM (see the module docstring)."""
    for path in sorted((REPO / "lingjun_slurm" / "injob" / "train").glob("*.py")):
        text = path.read_text()
        assert "DataLoader(" not in text and "num_workers" not in text, path
