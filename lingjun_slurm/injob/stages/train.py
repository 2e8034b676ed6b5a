"""The built-in train stage: Megatron GPT on megatron-core, one process per GPU (or CPU task).

    python3 -m lingjun_slurm.stages train --plan PLAN.json  ->  main(plan)

Started once per task by srun (or the local launcher); rank and world come from RANK /
WORLD_SIZE / LOCAL_RANK (else SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID), the rendezvous
from MASTER_ADDR / MASTER_PORT. Resumes from the checkpoint tracker, saves every
save_interval and at the end, and on SIGTERM finishes the step, saves and exits 0.
Everything heavy is imported inside main(): megatron's checkpoint writer starts a
spawn-context process. Under `python3 -m lingjun_slurm.stages` that child does not re-import
the package's __main__ (CPython's multiprocessing/spawn.py, _fixup_main_from_name, skips a
name ending in ".__main__"); under this module's own `-m` twin it re-imports this file as
__mp_main__, whose `if __name__ == "__main__"` guard keeps it from training again. See docs/training.md.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any


def main(plan: dict) -> int:
    """0: trained to the last iteration, or saved and stopped on SIGTERM; 1: an error (message on stderr)."""
    from .. import stacks

    stacks.install()  # SIGUSR2 -> every thread's traceback into $LINGJUN_STACKS_DIR (the hang watchdog)
    from ..train import TrainError
    from ..train.settings import from_plan

    from .hfinit import InitError, ensure

    try:
        settings = from_plan(plan)
        # training.init_from: rank 0 converts the Hugging Face model to this run's iteration 0 (once,
        # and only while the run has no checkpoint of its own), the other ranks wait (hfinit.py).
        ensure(plan, builtin=True, padded_vocab=lambda: _padded_vocab(settings))
        from ..train.entry import run

        return run(settings)
    except (TrainError, InitError) as exc:
        print(f"lingjun-slurm: train: {exc}", file=sys.stderr, flush=True)
        _note(plan, str(exc))
        return 1
    except KeyboardInterrupt:
        print("lingjun-slurm: train: interrupted", file=sys.stderr, flush=True)
        return 130
    except (SystemExit, GeneratorExit):
        raise
    except OSError as exc:
        from lingjun_slurm.common.diskspace import NO_SPACE, no_space_reason

        if exc.errno not in NO_SPACE:  # a full disk is one line; anything else a crash (below)
            return _crash(exc)
        print(f"lingjun-slurm: train: {no_space_reason(exc.filename, exc.errno)}", file=sys.stderr, flush=True)
        _note(plan, str(no_space_reason(exc.filename, exc.errno)))
        return 1
    except Exception as exc:  # a crash inside torch/megatron: the traceback, then one summary line
        return _crash(exc)
    except BaseException as exc:  # torch's CheckpointException (dist_checkpointing) is a BaseException
        from ..train.ckpt import describe_exception

        print(f"lingjun-slurm: train: {describe_exception(exc)}", file=sys.stderr, flush=True)
        return 1


def _padded_vocab(settings: Any) -> int:
    """The vocabulary the builtin trainer builds its model with (train/entry.py run: the tokenizer's size,
    or model.vocab_size when larger, padded for TP), for init_from's conversion to match."""
    from ..train import data
    from ..train.model import padded_vocab_size

    tok = data.dataset_tokenizer(settings.data.tokenizer)
    return padded_vocab_size(max(tok.vocab_size, settings.model.vocab_size or 0), settings.parallel.tensor)


def _note(plan: dict, text: str) -> None:
    """The failure's cause for `status` (rank 0's; stagenotes.py). Under Slurm the requeue decision
    after the step (retry.py) may replace it with why the job is not requeued."""
    from ..host import stagenotes

    stagenotes.note_failure(stagenotes.run_dir_of(plan), "train", text)


def _crash(exc: BaseException) -> int:
    traceback.print_exception(exc)
    print(f"lingjun-slurm: train: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":  # python3 -m lingjun_slurm.injob.stages.train --plan PLAN.json (the stage dispatcher's twin)
    from .contract import load_plan, parse

    _args = parse(["train", *sys.argv[1:]])
    sys.exit(main(load_plan(_args.plan)))
