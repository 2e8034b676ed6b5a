"""The image stage: resolve the image's digest, import it once into the cache, record it for the run.

Runs on a cluster host outside any container (it calls enroot), first in the chain. Every later
stage runs `--container-image=<the cached .sqsh>` (pyxis takes a path starting with '/' as a
squashfs file, pyxis_slurmstepd.c; args.c), so the registry is read once per run instead of once
per node per srun step, and a requeued train starts from the same file.

    <run_dir>/image/sqsh      the squashfs path (host side), one line
    <run_dir>/image/digest    sha256:... of the image used, one line

Digest: `enroot digest` on enroot >= 4.0 (it reads enroot's own credentials file); older enroot
has none, so the registry's manifest is asked directly (images/registry.py), with the same
credentials file. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lingjun_slurm.common.holderlock import LockHeld, run_squeue, slurm_job_alive
from lingjun_slurm.images import enroot
from lingjun_slurm.images.cache import CacheError, ImageCache
from lingjun_slurm.images.registry import RegistryError, parse_image_ref, resolve_digest


def enroot3_pinned_uri(ref, digest: str) -> str:
    user = f"{ref.user}@" if ref.user else ""
    return f"docker://{user}{ref.registry}#{ref.repository}:{digest}"


def write_record(run_dir: Path, sqsh: str, digest: str) -> None:
    out = run_dir / "image"
    out.mkdir(exist_ok=True)
    for name, value in (("sqsh", sqsh), ("digest", digest)):
        tmp = out / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(value + "\n", encoding="utf-8")
        os.replace(tmp, out / name)


def say(msg: str) -> None:
    print(f"lingjun-slurm: image: {msg}", flush=True)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(plan: dict, plan_path: Path) -> int:
    # scancel and the time limit send SIGTERM: unwind, so an import in progress removes its partial
    # file and releases the lock (images/cache.py) instead of leaving gigabytes and a stale holder.
    signal.signal(signal.SIGTERM, _terminated)
    conf = (plan.get("settings") or {}).get("container") or {}
    image, cache_dir, arch = conf.get("image"), conf.get("cache_dir"), conf.get("arch")
    if not image or not cache_dir:
        print("lingjun-slurm: image: the plan names no image to stage (re-render the run)", file=sys.stderr)
        return 1
    try:
        ref = parse_image_ref(image)
        ver = enroot.version()
        say(f"enroot {'.'.join(map(str, ver))} on {os.uname().nodename}")
        if enroot.has_digest(ver):
            digest = enroot.digest(ref.uri(), arch)
            uri = ref.uri(digest=digest)  # pinned: the file is the digest we name it by
        else:
            # enroot itself is not asked here, so apply its enroot.conf (ENROOT_ALLOW_HTTP, the
            # credentials' ENROOT_CONFIG_PATH, proxies) as enroot would (images/enroot.py).
            digest = resolve_digest(ref, arch=arch, environ=enroot.environment())
            # enroot 3.x parses no @sha256 (v3.5.0 src/docker.sh:259-272), but its tag pattern
            # [[:alnum:]._:-]+ takes "sha256:<hex>" and fetches manifests/<tag> as it is
            # (docker.sh:136, 262-265): the manifest named by the digest we resolved.
            uri = enroot3_pinned_uri(ref, digest)
        say(f"{image} is {digest}")
        cache = ImageCache(cache_dir, job_alive=lambda job: slurm_job_alive(job, run_squeue))
        started = time.monotonic()
        path, imported = cache.stage(image, digest, lambda out: enroot.import_image(uri, out, arch),
                                     on_wait=lambda who: say(f"waiting for {who}"))
    except LockHeld as exc:
        print(f"lingjun-slurm: image: {image}: gave up waiting: {exc}", file=sys.stderr)
        return 1
    except (ValueError, RegistryError, enroot.EnrootError, CacheError, OSError) as exc:
        print(f"lingjun-slurm: image: {image}: {exc}", file=sys.stderr)
        return 1
    if imported:
        say(f"imported {uri} into {path} in {time.monotonic() - started:.0f} s")
    else:
        say(f"reusing {path} (digest unchanged)")
    write_record(plan_path.resolve().parent, str(path), digest)
    return 0
