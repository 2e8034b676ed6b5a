"""The enroot commands the image stage runs on a cluster host (enroot 3.x and 4.x).

Behaviour read in NVIDIA/enroot's source (v4.1.2 unless said otherwise):
- `enroot version` prints the version and a newline, nothing else (enroot.in:289-291).
- `enroot digest [-a ARCH] docker://URI` exists from 4.0.0 on (enroot.in:189-201, 319-350;
  src/docker.sh:390-437) and prints `sha256:...` on stdout: the manifest digest of the image for
  that architecture (the per-platform manifest of a multi-arch tag). 3.x has no such command and
  answers with its general usage and exit 1, so the version decides, not a probe.
- `enroot import -o FILE docker://URI` refuses an existing FILE ("File already exists", exit 1,
  docker.sh:464-466), writes FILE in place with mksquashfs (not atomically: a failed import
  leaves a partial file, docker.sh:469-485), logs only to stderr. From 4.0.0 the URI may pin a
  digest, `REGISTRY#IMAGE@sha256:...` (docker.sh:198-304); 3.x takes only a tag.
- Credentials come from `$ENROOT_CONFIG_PATH/.credentials` (docker.sh:18), read by enroot itself.

Standard library only (runs on hosts without the project's dependencies).
"""

from __future__ import annotations

import re
import subprocess
from typing import Optional, Sequence


class EnrootError(Exception):
    """An enroot command failed; carries its argv, exit status and output."""

    def __init__(self, argv: Sequence[str], returncode: int, output: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-5:])
        super().__init__(f"{' '.join(argv[:2])} failed (exit {returncode}): {tail or 'no output'}")


DIGEST_MIN = (4, 0, 0)


def _run(argv: list[str], timeout: Optional[float]) -> str:
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise EnrootError(argv, 127, "enroot is not installed on this host (NVIDIA/enroot; the cluster-init "
                                     "project installs it)") from None
    except subprocess.TimeoutExpired as exc:
        raise EnrootError(argv, 124, f"no answer in {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise EnrootError(argv, proc.returncode, proc.stderr + proc.stdout)
    return proc.stdout


def version(exe: str = "enroot") -> tuple[int, ...]:
    out = _run([exe, "version"], 60).strip()
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    if not match:
        raise EnrootError([exe, "version"], 0, f"unexpected version {out!r}")
    return tuple(int(g or 0) for g in match.groups())


def has_digest(ver: tuple[int, ...]) -> bool:
    return ver >= DIGEST_MIN


def digest(uri: str, arch: Optional[str] = None, exe: str = "enroot", timeout: float = 300) -> str:
    argv = [exe, "digest"] + (["-a", arch] if arch else []) + [uri]
    out = _run(argv, timeout).strip().splitlines()
    value = out[-1].strip() if out else ""
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", value):
        raise EnrootError(argv, 0, f"unexpected digest {value!r}")
    return value


def import_image(uri: str, output: str, arch: Optional[str] = None, exe: str = "enroot",
                 timeout: Optional[float] = None) -> None:
    argv = [exe, "import"] + (["-a", arch] if arch else []) + ["-o", output, uri]
    _run(argv, timeout)
