"""`lingjun-slurm checkpoint verify|list|prune|pin|unpin|copy|export|import DIR`: Megatron torch_dist checkpoints.

Wired into the main CLI with `cli.add_command(checkpoint)`; `main()` runs the group on its
own with the same error handling. list, prune, pin and unpin never import torch; verify
and copy import torch and megatron-core when they run; export and import (Hugging Face, issue 29)
import lingjun_slurm.injob.checkpoint.hf, torch, megatron-core and transformers only when they run.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import click

DIR = click.argument("ckpt_dir", metavar="DIR", type=click.Path(path_type=Path))


def _iteration(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    from ..injob.checkpoint.layout import parse_iteration

    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(parse_iteration(v) for v in value)
    return parse_iteration(value)


ITERATION = click.option("--iteration", callback=_iteration, metavar="N",
                         help="This iteration (30 or iter_0000030) instead of the tracker's.")


def _emit(data: dict) -> None:
    click.echo(json.dumps(data, indent=2))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def checkpoint() -> None:
    """Verify, list, prune, pin, copy, and export to / import from Hugging Face, Megatron torch_dist checkpoints (DIR holds
    latest_checkpointed_iteration.txt and iter_NNNNNNN/ directories).

    Exit codes: 0 ok, 1 refused or damaged, 2 usage (no such directory, unknown URL protocol).
    """


@checkpoint.command()
@DIR
@ITERATION
@click.option("--write-manifest", is_flag=True,
              help="After a successful verification, hash every file into iter_N/lingjun-manifest.json (if absent).")
@click.option("--load-tensors", is_flag=True,
              help="Also read every tensor through megatron-core (needs memory for the whole checkpoint).")
@click.option("--workers", type=click.IntRange(1, 64), help="Files hashed in parallel (default: CPUs, at most 8).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (also when damaged).")
def verify(ckpt_dir: Path, iteration: Optional[int], write_manifest: bool, load_tensors: bool,
           workers: Optional[int], as_json: bool) -> None:
    """Check the latest checkpoint (or --iteration N): tracker, files and sizes against the torch_dist
    metadata, metadata.json, common.pt, megatron-core's metadata load, and the manifest's hashes.
    A check against a manifest is recorded in iter_N/lingjun-verified.json (what `list` shows)."""
    from ..injob.checkpoint import CheckpointDamaged
    from ..injob.checkpoint.verify import verify as run_verify

    try:
        report = run_verify(ckpt_dir, iteration, write_manifest=write_manifest, load_tensors=load_tensors,
                            workers=workers)
    except CheckpointDamaged as exc:
        _record(Path(exc.path), False, exc.problems)
        if as_json:
            _emit({"ok": False, "path": exc.path, "problems": exc.problems})
        raise
    if report.manifest == "matched":  # hashed against the manifest: a hash check that passed
        _record(report.path, True, [])
    if as_json:
        _emit(report.to_json())
        return
    click.echo(report.summary())
    for note in report.notes:
        click.echo(f"  note: {note}")


def _record(iter_dir: Path, ok: bool, problems: list[str]) -> None:
    """lingjun-verified.json after a hash check (only in an iteration directory with a manifest: a
    verification without one checked no hash). A checkpoint directory that cannot be written is a
    note on stderr, not a failure of verify."""
    from ..injob.checkpoint.layout import ITER_RE, MANIFEST, parse_iteration, write_verified

    if not (ITER_RE.fullmatch(iter_dir.name) and (iter_dir / MANIFEST).is_file()):
        return
    try:
        write_verified(iter_dir, parse_iteration(iter_dir.name), ok, problems, "lingjun-slurm checkpoint verify")
    except OSError as exc:
        click.echo(f"note: cannot record the check in {iter_dir}: {exc.strerror or exc}", err=True)


@checkpoint.command("list")
@DIR
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the tracker and every iteration.")
def list_(ckpt_dir: Path, as_json: bool) -> None:
    """Show every iteration: state (verified, damaged, complete, incomplete, in-progress), what is known of
    its bytes (CHECK: "sha256 ok <time>" only after a hash check that nothing changed since; "sizes ok"
    when only the sizes match the manifest), latest, pinned, size. Reads no checkpoint file whole."""
    from ..injob.checkpoint.layout import human_size, scan

    tracker, infos = scan(ckpt_dir)
    if as_json:
        _emit({"dir": str(ckpt_dir), "tracker": {"value": tracker.raw.strip() if tracker.raw is not None else None,
                                                 "iteration": tracker.iteration, "release": tracker.release,
                                                 "problem": tracker.problem},
               "iterations": [i.to_json() for i in infos]})
        return
    click.echo(f"{ckpt_dir}  tracker: {tracker.problem or tracker.name}")
    if not infos:
        click.echo("  (no iter_* directories)")
        return
    width = max(len("CHECK"), *(len(i.check) for i in infos))
    click.echo(f"  {'ITERATION':14} {'STATE':12} {'CHECK':{width}} {'SIZE':>10}")
    for i in infos:
        flags = ", ".join(f for f, on in (("latest", i.latest), ("pinned", i.pinned)) if on)
        click.echo(f"  {i.name:14} {i.state:12} {i.check:{width}} {human_size(i.size_bytes):>10}  {flags}".rstrip())


@checkpoint.command()
@DIR
@click.option("--keep", type=click.IntRange(min=1), required=True, help="Keep this many newest complete iterations.")
@click.option("--pin", "pins", multiple=True, callback=_iteration, metavar="ITER",
              help="Pin this iteration first (kept now and by later prunes). Repeatable.")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; change nothing.")
def prune(ckpt_dir: Path, keep: int, pins: tuple[int, ...], dry_run: bool) -> None:
    """Delete old iterations oldest first; never the tracker's, a pinned one, or one newer than the tracker."""
    from ..injob.checkpoint.layout import iter_name
    from ..injob.checkpoint.retention import prune as run_prune

    plan = run_prune(ckpt_dir, keep, pins, dry_run=dry_run)
    for it in pins:
        click.echo(f"{'would pin' if dry_run else 'pinned'} {iter_name(it)}")
    for line in plan.lines(dry_run):
        click.echo(line)


@checkpoint.command()
@DIR
@click.argument("iteration", metavar="ITER", callback=_iteration)
@click.option("--note", default="", help="Why it is pinned (stored in the marker).")
def pin(ckpt_dir: Path, iteration: int, note: str) -> None:
    """Pin an iteration: retention never deletes it (marker file iter_N/.lingjun-pin)."""
    from ..injob.checkpoint.layout import pin as run_pin

    click.echo(f"pinned: {run_pin(ckpt_dir, iteration, note).parent}")


@checkpoint.command()
@DIR
@click.argument("iteration", metavar="ITER", callback=_iteration)
def unpin(ckpt_dir: Path, iteration: int) -> None:
    """Remove an iteration's pin."""
    from ..injob.checkpoint.layout import iter_name, unpin as run_unpin

    done = run_unpin(ckpt_dir, iteration)
    click.echo(f"{'unpinned' if done else 'was not pinned'}: {iter_name(iteration)}")


@checkpoint.command()
@DIR
@click.argument("target", metavar="TARGET")
@ITERATION
@click.option("--workers", type=click.IntRange(1, 64), help="Files hashed in parallel (default: CPUs, at most 8).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def copy(ckpt_dir: Path, target: str, iteration: Optional[int], workers: Optional[int], as_json: bool) -> None:
    """Verify, then copy the latest checkpoint (or --iteration N) to TARGET: a path or an fsspec URL
    (file://, az://, s3://, ...). The copy's hashes are checked before its tracker is written."""
    from ..injob.checkpoint.transfer import copy_checkpoint

    result = copy_checkpoint(ckpt_dir, target, iteration, workers)
    if as_json:
        _emit(result.to_json())
        return
    for line in result.lines():
        click.echo(line)


def _hf_package() -> Any:
    """The Hugging Face conversion package, imported only by export/import (it needs torch,
    megatron-core, transformers and safetensors)."""
    import os
    import warnings

    from ..injob.checkpoint.errors import CheckpointUsageError

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron-core's "Apex / TransformerEngine not installed"
            import megatron.core  # noqa: F401
            import megatron.core.optimizer  # noqa: F401
            import megatron.core.models.gpt  # noqa: F401
            import safetensors  # noqa: F401
            import torch  # noqa: F401
            import transformers  # noqa: F401
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError as exc:
        raise CheckpointUsageError(f"converting checkpoints needs torch, megatron-core, transformers and "
                                   f"safetensors ({exc}): pip install 'lingjun-slurm[megatron]' transformers "
                                   "safetensors") from None
    from ..injob.checkpoint import hf

    return hf


@contextlib.contextmanager
def _no_library_warnings() -> Iterator[None]:
    """megatron-core's and transformers' UserWarnings (Apex/TE missing, deprecations) off the terminal."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _spec_model(spec_path: Optional[Path]) -> tuple[Optional[dict], Any, Any]:
    """(model settings, loaded spec, where(field) -> "SPEC:LINE") of --spec, or (None, None, None)."""
    if spec_path is None:
        return None, None, None
    from ..spec.load import load_spec
    from ..spec.resolve import resolve_model

    loaded = load_spec(spec_path)
    model = resolve_model(loaded.spec)

    def where(field: str) -> str:
        line = loaded.doc.line_of(("model", field))
        return f"{loaded.source}:{line}" if line else str(loaded.source)

    return model, loaded, where


def _max_shard(text: str) -> int:
    from ..injob.checkpoint.errors import CheckpointUsageError

    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    try:
        value = float(num) * units[t[len(num):]]
    except (ValueError, KeyError):
        raise CheckpointUsageError(f"--max-shard-size {text!r}: a size such as 5GB, 500MB or 2GiB") from None
    if value < 1:
        raise CheckpointUsageError(f"--max-shard-size {text!r}: must be positive")
    return int(value)


@checkpoint.command("export")
@DIR
@click.option("--to", "fmt", type=click.Choice(["huggingface"]), required=True, help="Output format.")
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@ITERATION
@click.option("--dtype", type=click.Choice(["bf16", "fp32"]), default="bf16", show_default=True,
              help="Dtype of the written weights.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path),
              help="The run's Hugging Face tokenizer directory: its files are copied into OUT.")
@click.option("--spec", "spec_path", type=click.Path(path_type=Path),
              help="The run's spec: its model settings win over what the checkpoint records.")
@click.option("--max-shard-size", default="5GB", show_default=True, help="Largest safetensors shard.")
@click.option("--no-check", is_flag=True, help="Skip the logits comparison of the two models.")
@click.option("--check-device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the logits comparison runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def export_(ckpt_dir: Path, fmt: str, out: Path, iteration: Optional[int], dtype: str, tokenizer_dir: Optional[Path],
            spec_path: Optional[Path], max_shard_size: str, no_check: bool, check_device: str, as_json: bool) -> None:
    """Export the latest checkpoint (or --iteration N) of DIR as a Hugging Face model directory OUT
    (sharded safetensors, config.json, generation_config.json, tokenizer files when given), then
    compare both models' logits on a fixed batch. OUT appears only after the comparison passed."""
    model, _loaded, _where = _spec_model(spec_path)
    shard = _max_shard(max_shard_size)
    _hf_package()
    from ..injob.checkpoint.hf.export import export_checkpoint

    with _no_library_warnings():
        result = export_checkpoint(ckpt_dir, out, iteration=iteration, dtype=dtype, tokenizer_dir=tokenizer_dir,
                                   model=model, check=not no_check, check_device=check_device, max_shard_bytes=shard)
    if as_json:
        _emit(result.to_json())
        return
    for line in result.lines():
        click.echo(line)


MODEL_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
               "seq_length")


@checkpoint.command("import")
@click.argument("hf_dir", metavar="HF_DIR", type=click.Path(path_type=Path))
@click.option("--to", "fmt", type=click.Choice(["megatron"]), required=True, help="Output format.")
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--spec", "spec_path", type=click.Path(path_type=Path),
              help="The spec to train with: its model is checked against config.json, its TP/PP used.")
@click.option("--num-layers", type=click.IntRange(min=1), help="Expected num_layers (checked against config.json).")
@click.option("--hidden-size", type=click.IntRange(min=1), help="Expected hidden_size.")
@click.option("--num-attention-heads", type=click.IntRange(min=1), help="Expected num_attention_heads.")
@click.option("--num-query-groups", type=click.IntRange(min=1), help="Expected num_query_groups.")
@click.option("--ffn-hidden-size", type=click.IntRange(min=1), help="Expected ffn_hidden_size.")
@click.option("--seq-length", type=click.IntRange(min=1), help="The training sequence length (recorded in args).")
@click.option("--tensor", type=click.IntRange(min=1), help="Tensor parallel size (vocabulary padding; default "
                                                             "the spec's, else 1).")
@click.option("--pipeline", type=click.IntRange(min=1), help="Pipeline parallel size (default the spec's, else 1).")
@click.option("--no-check", is_flag=True, help="Skip the logits comparison of the two models.")
@click.option("--check-device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the logits comparison runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def import_(hf_dir: Path, fmt: str, out: Path, spec_path: Optional[Path], tensor: Optional[int],
            pipeline: Optional[int], no_check: bool, check_device: str, as_json: bool, **flags: Any) -> None:
    """Convert a Hugging Face model directory (safetensors + config.json; Llama or GPT-2 family) into a
    Megatron torch_dist checkpoint OUT at iteration 0 (model only: --finetune semantics), then compare
    both models' logits. The spec's model (or the model flags) is checked against config.json first."""
    model, loaded, where = _spec_model(spec_path)
    given = {k: v for k, v in flags.items() if k in MODEL_FLAGS and v is not None}
    only = None
    if given:
        only = None if model is not None else list(given)  # flags alone: check just those fields
        model = {**(model or {}), **given}
        if where is None:
            def where(field: str) -> str:
                return f"--{field.replace('_', '-')}" if field in given else "the model flags"
    if loaded is not None:
        tensor = tensor or loaded.spec.parallelism.tensor
        pipeline = pipeline or loaded.spec.parallelism.pipeline
    _hf_package()
    from ..injob.checkpoint.hf.importer import import_checkpoint

    with _no_library_warnings():
        result = import_checkpoint(hf_dir, out, model=model, tensor=tensor or 1, pipeline=pipeline or 1,
                                   check=not no_check, check_device=check_device, where=where, only=only)
    if as_json:
        _emit(result.to_json())
        return
    for line in result.lines():
        click.echo(line)


def main(args: Optional[list[str]] = None) -> None:
    """Run the group on its own: errors print one message, no traceback (the CLI's own handling)."""
    from .main import _run

    _run(checkpoint, args, prog_name="lingjun-slurm checkpoint")
    sys.exit(0)


if __name__ == "__main__":
    main()
