"""training.init_from: convert a Hugging Face model once, before the first iteration (issue 29).

Runs in every task of the train step, before training:

  * builtin trainer: stages/train.py main() calls ensure(plan) before it builds the process group;
  * Megatron-LM: the train command is wrapped (plan.py _builtin_commands),
        python3 -m lingjun_slurm.injob.stages.hfinit --plan PLAN -- python3 .../pretrain_gpt.py ARGS...
    which calls ensure(plan) and then execs the rest of its arguments.

What ensure() does, decided from the run's own checkpoint directory (settings.checkpoint.dir):

  * it has a tracker (latest_checkpointed_iteration.txt): nothing. The run resumes from its own
    checkpoints; a requeue never goes back to the Hugging Face model.
  * else rank 0 converts settings.training.init_hf into settings.training.init_dir (<workdir>/hf-init)
    with import_checkpoint (hf/importer.py: the model shape checked against config.json first, an
    iteration-0 torch_dist checkpoint for this run's TP/PP and vocabulary padding, no optimizer or RNG
    state, the logits compared before it is left looking finished), unless a conversion for the same
    source and layout is already there (lingjun-init.json). The other ranks wait for it.
  * Megatron-LM then reads init_dir through --pretrained-checkpoint, which it loads only while --load has
    no checkpoint, with finetune semantics (megatron/training/checkpointing.py load_checkpoint,
    core_v0.16.1:1494-1502).
  * The builtin trainer resumes from its checkpoint directory only (entry.py), so rank 0 puts the
    converted iteration 0 there as iter_0000000 (hard links, else copies), writes its manifest, and
    writes the tracker last. train/ckpt.py load() sees the checkpoint's args.no_save_optim and loads it
    with finetune semantics (weights only, iteration 0, the optimizer's main parameters refreshed).

A failed conversion: rank 0 writes <init_dir>.failed (the reason, with this attempt's job id and
restart count), every rank exits 1 with the reason, and nothing is left that looks converted.
Standard library at import; torch only inside the conversion.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

MARKER = "lingjun-init.json"
POLL_S = 2.0


class InitError(Exception):
    """The conversion failed or cannot be done: one line, exit 1."""


def _say(line: str) -> None:
    print(f"init_from: {line}", flush=True)


def _attempt() -> str:
    return f"{os.environ.get('SLURM_JOB_ID', 'local')}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def _rank() -> int:
    for name in ("RANK", "SLURM_PROCID"):
        raw = os.environ.get(name, "")
        if raw.isdigit():
            return int(raw)
    return 0


def _has_own_checkpoint(ckpt_dir: str) -> bool:
    from ..checkpoint.layout import read_tracker

    return read_tracker(Path(ckpt_dir)).raw is not None


def _wanted(plan: dict[str, Any]) -> dict[str, Any]:
    s = plan["settings"]
    par = s.get("parallelism") or {}
    return {"init_from": s["training"]["init_from"], "tensor": int(par.get("tensor", 1)),
            "pipeline": int(par.get("pipeline", 1)), "model": s["model"]}


def _converted(init_dir: Path, wanted: dict[str, Any]) -> bool:
    try:
        have = json.loads((init_dir / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(have, dict) and all(have.get(k) == v for k, v in wanted.items())


def _failure(init_dir: Path) -> Path:
    return init_dir.with_name(init_dir.name + ".failed")


def _check_vocab(plan: dict[str, Any], run_padded: int) -> None:
    """The run's padded vocabulary (the builtin trainer's: the tokenizer's size, or model.vocab_size when
    larger, padded to 128 x TP as Megatron-LM's _vocab_size_with_padding) must be the one the import pads
    config.json's vocab_size to, or the load fails on the embedding's shape after the conversion."""
    from ..checkpoint.hf.megatron_io import padded_vocab_size

    tr = plan["settings"]["training"]
    cfg_path = Path(tr["init_hf"]) / "config.json"
    try:
        vocab = int(json.loads(cfg_path.read_text(encoding="utf-8"))["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InitError(f"cannot read vocab_size from {cfg_path}: {getattr(exc, 'strerror', None) or exc}") from None
    tp = _wanted(plan)["tensor"]
    hf_padded = padded_vocab_size(vocab, tp)
    if hf_padded != run_padded:
        raise InitError(f"{cfg_path} has vocab_size {vocab}, padded to {hf_padded} for TP {tp}, but this run's "
                        f"tokenizer gives a vocabulary padded to {run_padded}: the embedding would not load. Train "
                        "with the model's own tokenizer (data.tokenizer), whose size matches its config.json")


def convert(plan: dict[str, Any], padded_vocab: Optional[Callable[[], int]] = None) -> None:
    """Rank 0: the conversion into init_dir, unless the same one is there already. padded_vocab: the
    run's padded vocabulary (computed only when a conversion is needed), checked against config.json's."""
    tr = plan["settings"]["training"]
    init_dir = Path(tr["init_dir"])
    wanted = _wanted(plan)
    if padded_vocab is not None:
        _check_vocab(plan, padded_vocab())
    if _converted(init_dir, wanted):
        _say(f"{init_dir} already holds {wanted['init_from']} for TP {wanted['tensor']} x PP {wanted['pipeline']}")
        return
    if init_dir.exists():
        if not (init_dir / MARKER).exists() and any(init_dir.iterdir()):
            raise InitError(f"{init_dir} exists and was not written by init_from (no {MARKER}): move it away")
        _say(f"{init_dir} holds another conversion: replacing it")
        shutil.rmtree(init_dir)
    from ..checkpoint.hf.importer import import_checkpoint

    _say(f"converting {tr['init_hf']} to an iteration-0 torch_dist checkpoint in {init_dir} "
         f"(TP {wanted['tensor']} x PP {wanted['pipeline']})")
    # The model's shape is checked against config.json (families.shape_mismatches); its vocabulary is the
    # tokenizer's business (checked above for the builtin trainer), so vocab_size is left to config.json.
    model = {k: v for k, v in plan["settings"]["model"].items() if k != "vocab_size"}
    result = import_checkpoint(tr["init_hf"], str(init_dir), model=model,
                               tensor=wanted["tensor"], pipeline=wanted["pipeline"], check=True)
    for line in result.lines():
        _say(line)
    tmp = init_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(wanted, sort_keys=True), encoding="utf-8")
    os.replace(tmp, init_dir / MARKER)


def install(init_dir: Path, ckpt_dir: Path) -> None:
    """The builtin trainer's start: init_dir's iteration 0 as ckpt_dir/iter_0000000 (hard links, else
    copies), its manifest, then the tracker (last: a tracker names only a complete checkpoint)."""
    from ..checkpoint.layout import iter_name, write_tracker

    src, dst = init_dir / iter_name(0), ckpt_dir / iter_name(0)
    if dst.exists():
        shutil.rmtree(dst)  # no tracker names it: a start that did not finish
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)
    from ..checkpoint import verify

    report = verify(str(ckpt_dir), iteration=0, write_manifest=True)
    _say(report.summary())
    write_tracker(ckpt_dir, 0)


def ensure(plan: dict[str, Any], *, builtin: bool, rank: Optional[int] = None,
           sleep: Callable[[float], None] = time.sleep, timeout_s: Optional[float] = None,
           padded_vocab: Optional[Callable[[], int]] = None) -> None:
    """Rank 0 converts (and for the builtin trainer installs); the other ranks wait for it. Nothing
    when training.init_from is unset or the run already has a checkpoint of its own."""
    s = plan["settings"]
    tr = s["training"]
    if not tr.get("init_from"):
        return
    ckpt_dir = Path(s["checkpoint"]["dir"])
    init_dir = Path(tr["init_dir"])
    if _has_own_checkpoint(str(ckpt_dir)):
        return
    rank = _rank() if rank is None else rank
    failed = _failure(init_dir)
    if rank == 0:
        try:
            failed.unlink()
        except FileNotFoundError:
            pass
        try:
            convert(plan, padded_vocab)
            if builtin:
                install(init_dir, ckpt_dir)
        except BaseException as exc:
            reason = _reason(exc)
            try:
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text(json.dumps({"attempt": _attempt(), "reason": reason}), encoding="utf-8")
            except OSError:
                pass
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise InitError(reason) from None
        return
    wanted = _wanted(plan)
    start = time.monotonic()
    said = False
    while True:
        if builtin and _has_own_checkpoint(str(ckpt_dir)):
            return
        if not builtin and _converted(init_dir, wanted):
            return
        try:
            info = json.loads(failed.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict) and info.get("attempt") == _attempt():
            raise InitError(f"rank 0's conversion failed: {info.get('reason')}")
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise InitError(f"rank 0 did not convert {tr['init_from']} within {timeout_s:.0f} s")
        if not said:
            _say(f"rank {rank}: waiting for rank 0 to convert {tr['init_from']}")
            said = True
        sleep(POLL_S)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    from ..checkpoint.errors import CheckpointError

    if isinstance(exc, (CheckpointError, InitError)):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main(argv: list[str]) -> int:
    """python3 -m lingjun_slurm.injob.stages.hfinit --plan PLAN -- COMMAND...: ensure(), then exec COMMAND."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.injob.stages.hfinit")
    parser.add_argument("--plan", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        with open(args.plan, encoding="utf-8") as f:
            plan = json.load(f)
        ensure(plan, builtin=False)
    except (InitError, OSError, ValueError, KeyError) as exc:
        print(f"lingjun-slurm: train: init_from: {_reason(exc)}", file=sys.stderr, flush=True)
        return 1
    if not command:
        return 0
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
