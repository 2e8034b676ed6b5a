"""`lingjun-slurm checkpoint verify|list|prune|pin|unpin|copy DIR`: Megatron torch_dist checkpoints.

Wired into the main CLI with `cli.add_command(checkpoint)`; `main()` runs the group on its
own with the same error handling. list, prune, pin and unpin never import torch; verify
and copy import torch and megatron-core when they run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

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
    """Verify, list, prune, pin and copy Megatron torch_dist checkpoints (DIR holds
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


def main(args: Optional[list[str]] = None) -> None:
    """Run the group on its own: errors print one message, no traceback (the CLI's own handling)."""
    from .main import _run

    _run(checkpoint, args, prog_name="lingjun-slurm checkpoint")
    sys.exit(0)


if __name__ == "__main__":
    main()
