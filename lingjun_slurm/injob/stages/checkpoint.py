"""The checkpoint stage: verify the latest checkpoint, write its manifest, prune, copy.

    python3 -m lingjun_slurm.stages checkpoint --plan plan.json

reads plan["settings"]["checkpoint"] = {"dir", "save_interval", "format", "keep_last",
"copy_to", "verify", "export_hf"?}. Order: verify the latest (writing lingjun-manifest.json when
absent) -> prune to keep_last -> copy to copy_to -> export to Hugging Face (export_hf). A damaged latest checkpoint stops the stage before
anything is deleted (exit 1, with every problem found). With verify false the stage only
checks that the tracker points at an existing iteration; copy always verifies, because
it must check the copy against the manifest.
"""

from __future__ import annotations

import sys
from typing import Any

from ..checkpoint import copy_checkpoint, prune, verify
from ..checkpoint.verify import resolve
from ..checkpoint.errors import CheckpointError
from lingjun_slurm.common.errors import LingjunError


def _say(line: str) -> None:
    print(f"checkpoint: {line}", flush=True)


def run(cfg: dict[str, Any], model: dict[str, Any] | None = None) -> None:
    """model: the run's resolved model settings (plan settings.model), for export_hf: what the
    checkpoint's own args do not record (export.py takes them over the args)."""
    ckpt_dir = cfg.get("dir")
    if not ckpt_dir:
        raise CheckpointError("the plan has no checkpoint.dir")
    fmt = cfg.get("format", "torch_dist")
    if fmt != "torch_dist":
        raise CheckpointError(f"checkpoint.format {fmt!r} is not supported; this stage handles torch_dist")
    from pathlib import Path

    if not Path(ckpt_dir).is_dir():
        raise CheckpointError(f"no checkpoint at all: {ckpt_dir} does not exist (did training save one?)")
    if cfg.get("verify", True):
        report = verify(ckpt_dir, write_manifest=True)
        if report.manifest == "matched":  # a hash check passed: what `checkpoint list` calls "verified"
            from ..checkpoint.layout import write_verified

            try:
                write_verified(report.path, report.iteration, True, [], "the checkpoint stage")
            except OSError as exc:
                _say(f"note: cannot record the hash check in {report.path}: {exc.strerror or exc}")
        _say(report.summary())
        for note in report.notes:
            _say(f"note: {note}")
    else:
        path, _ = resolve(ckpt_dir)
        _say(f"latest is {path} (checkpoint.verify is false: not verified)")
    keep = cfg.get("keep_last")
    if keep:
        for line in prune(ckpt_dir, int(keep)).lines(dry_run=False):
            _say(line)
    if cfg.get("copy_to"):
        for line in copy_checkpoint(ckpt_dir, str(cfg["copy_to"])).lines():
            _say(line)
    if cfg.get("export_hf"):
        export_hf(ckpt_dir, cfg["export_hf"], model)


def export_hf(ckpt_dir: str, exp: dict[str, Any], model: dict[str, Any] | None = None) -> None:
    """checkpoint.export_hf: the latest checkpoint as a Hugging Face model in
    <export_hf.dir>/iter_NNNNNNN (hf/export.py export_checkpoint: streamed tensor by tensor, the
    logits proven equal unless check is false; a failed proof leaves nothing that looks finished).
    An iteration exported before (its config.json and index there) is not exported again."""
    from pathlib import Path

    path, iteration = resolve(ckpt_dir)
    out = Path(exp["dir"]) / path.name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors*")):
        _say(f"{out} holds the Hugging Face export of {path.name} already")
        return
    from ..checkpoint.hf.export import export_checkpoint

    out.parent.mkdir(parents=True, exist_ok=True)
    result = export_checkpoint(ckpt_dir, str(out), iteration=iteration if isinstance(iteration, int) else None,
                               dtype=exp.get("dtype", "bf16"),
                               tokenizer_dir=exp.get("tokenizer_dir"), model=model,
                               check=bool(exp.get("check", True)))
    for line in result.lines():
        _say(f"export: {line}")


def main(plan: dict) -> int:
    """Run the stage for a plan dict; 0 when done, 1 with the reason on stderr otherwise."""
    try:
        run(plan["settings"]["checkpoint"], plan["settings"].get("model"))
    except LingjunError as exc:
        print(f"lingjun-slurm: checkpoint stage of run {plan.get('run_id', '?')} failed: {exc}",
              file=sys.stderr, flush=True)
        from ..host import stagenotes

        stagenotes.note_failure(stagenotes.run_dir_of(plan), "checkpoint", str(exc))
        return 1
    except KeyError as exc:
        print(f"lingjun-slurm: checkpoint stage: the plan has no settings.checkpoint ({exc})", file=sys.stderr)
        return 1
    return 0
