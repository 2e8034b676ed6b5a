"""`lingjun-slurm image list|prune`: the staged-image cache (lingjun_slurm/images/cache.py).

The cache is a directory on the cluster's shared storage: run these where it is mounted (a
login node). It is found from --cache-dir, or from a spec (container.cache_dir, by default
<workdir>/images).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import click

from ..common.bytesfmt import human_bytes
from ..common.errors import UsageError

DAY_S = 86400.0


def _cache_dir(spec_file: Optional[Path], cache_dir: Optional[Path]) -> Path:
    if (spec_file is None) == (cache_dir is None):
        raise UsageError("lingjun-slurm image: name the cache with a spec file (its container.cache_dir) or "
                         "--cache-dir DIR, one of the two")
    if cache_dir is not None:
        return cache_dir
    from ..plan import container_plan
    from ..spec import load_spec

    assert spec_file is not None
    spec = load_spec(spec_file).spec
    return Path(container_plan(spec, spec.run.name, spec.container.runtime == "pyxis").cache_dir)


SPEC = click.argument("spec_file", required=False, type=click.Path(path_type=Path, dir_okay=False))
CACHE = click.option("--cache-dir", type=click.Path(path_type=Path, file_okay=False), help="The cache directory.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def image() -> None:
    """Staged container images: one squashfs per image digest, imported once per run."""


@image.command("list")
@SPEC
@CACHE
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_images(spec_file: Optional[Path], cache_dir: Optional[Path], as_json: bool) -> None:
    """Every cached image: digest, image, size, last use; imports in progress."""
    from ..images.cache import ImageCache

    cache = ImageCache(_cache_dir(spec_file, cache_dir))
    entries, partials = cache.entries(), cache.partials()
    if as_json:
        click.echo(json.dumps({"cache_dir": str(cache.root),
                               "images": [e.__dict__ for e in entries],
                               "partial": [str(p) for p in partials]}, indent=2))
        return
    click.echo(f"{cache.root}: {len(entries)} image(s), {human_bytes(sum(e.size for e in entries))}")
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        click.echo(f"  {e.digest[:19]}  {human_bytes(e.size):>10}  last used {used}  {e.image}")
    for p in partials:
        click.echo(f"  (import in progress or interrupted: {p.name})")


@image.command()
@SPEC
@CACHE
@click.option("--older-than", "days", type=click.FloatRange(min=0), default=14.0, show_default=True,
              help="Remove images not used for this many days.")
@click.option("--digest", "digests", multiple=True, metavar="sha256:...", help="Remove this image (repeatable).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed.")
def prune(spec_file: Optional[Path], cache_dir: Optional[Path], days: float, digests: tuple[str, ...],
          dry_run: bool) -> None:
    """Remove images unused for --older-than days (or the --digest ones), and interrupted imports.

    An image being imported (its lock held) is never removed. A run whose image was pruned fails
    its next stage with a message; `lingjun-slurm resubmit RUN --from image` stages it again."""
    from ..common.holderlock import read_holder, run_squeue, slurm_job_alive
    from ..images.cache import PARTIAL_RE, ImageCache

    cache = ImageCache(_cache_dir(spec_file, cache_dir), job_alive=lambda job: slurm_job_alive(job, run_squeue))
    now = time.time()
    entries = cache.entries()
    if digests:
        chosen = [e for e in entries if e.digest in digests]
    else:
        chosen = [e for e in entries if now - e.last_used > days * DAY_S]
    unknown = set(digests) - {e.digest for e in entries}
    if unknown:
        raise UsageError(f"not in {cache.root}: {', '.join(sorted(unknown))}")
    freed = 0
    for e in chosen:
        if dry_run:
            click.echo(f"would remove {e.digest} ({e.image}, {human_bytes(e.size)})")
            freed += e.size
        elif cache.remove(e.digest):
            click.echo(f"removed {e.digest} ({e.image}, {human_bytes(e.size)})")
            freed += e.size
        else:
            click.echo(f"kept {e.digest}: it is being imported")
    for p in cache.partials():
        match = PARTIAL_RE.fullmatch(p.name)
        lock = cache.root / f"sha256-{match.group(1)}.lock" if match else None
        if lock is not None and lock.exists() and read_holder(lock) is not None:
            continue  # an import in progress
        if now - p.stat().st_mtime > DAY_S:
            click.echo(f"{'would remove' if dry_run else 'removed'} interrupted import {p.name}")
            if not dry_run:
                p.unlink(missing_ok=True)
    click.echo(f"{'would free' if dry_run else 'freed'} {human_bytes(freed)}")
