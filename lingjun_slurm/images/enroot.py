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
- Docker-style `REGISTRY/IMAGE` references (a '.' or ':' in the first component) from 4.0.0 on
  (docker.sh:198-250); 3.x reads only `[USER@][REGISTRY#]IMAGE[:TAG]` (v3.5.0 docker.sh:259-272).

The version thresholds are data: enroot_versions.json, each with its source.

Standard library only (runs on hosts without the project's dependencies).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Optional, Sequence


class EnrootError(Exception):
    """An enroot command failed; carries its argv, exit status and output."""

    def __init__(self, argv: Sequence[str], returncode: int, output: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-5:])
        super().__init__(f"{' '.join(argv[:2])} failed (exit {returncode}): {tail or 'no output'}")


def _thresholds() -> dict:
    return json.loads((Path(__file__).with_name("enroot_versions.json")).read_text(encoding="utf-8"))


def parse_version(text: str) -> tuple[int, ...]:
    """'4.1.2' -> (4, 1, 2); ValueError for anything else."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise ValueError(f"not an enroot version: {text!r} (expected MAJOR.MINOR[.PATCH])")
    return tuple(int(g or 0) for g in match.groups())


_TABLE = _thresholds()
DIGEST_MIN = parse_version(_TABLE["digest_command"]["min"])
DOCKER_STYLE_MIN = parse_version(_TABLE["docker_style_reference"]["min"])


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


def reads_docker_style(ver: tuple[int, ...]) -> bool:
    """Whether this enroot reads `REGISTRY/IMAGE` as a registry reference (else only `REGISTRY#IMAGE`)."""
    return ver >= DOCKER_STYLE_MIN


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


# enroot's own configuration, for the one request the image stage makes without enroot: the
# digest on enroot 3.x (images/registry.py). enroot reads it in `config::init "@sysconfdir@/
# enroot.conf"` before anything else (enroot.in:27-61 at v4.1.2 and v3.5.0): the file, then
# FILE.d/*.conf in glob order; each line `IFS=$' \t=' read -r key value`, keys ENROOT_*,
# MELLANOX_*/NVIDIA_*, SSL_CERT_DIR/FILE and the proxies, value `$(eval echo "${value}")`;
# `config::export` keeps a variable already set and not empty (the environment, then the first
# file that sets it). Seen on the real enroot 3.5.0: ENROOT_ALLOW_HTTP in enroot.conf let enroot
# use http, but the stage's own request went to https and failed
# (tests/fixtures/real_pyxis_enroot/SOURCES.md).
_CONF_KEY = re.compile(r"^(?:ENROOT_[A-Z_]+|(?:MELLANOX_|NVIDIA_)\S*|SSL_CERT_(?:DIR|FILE)|(?:all|no|http|https)_proxy)$")
_INIT = re.compile(r'^config::init\s+"([^"$`]+)"', re.M)


def config_file(exe: str = "enroot") -> Path:
    """The enroot.conf the `enroot` on PATH reads: its `config::init "..."` line (enroot is a bash
    script whose sysconfdir is filled in at install time); /etc/enroot/enroot.conf (the packages')
    when the script cannot be read."""
    import shutil

    path = shutil.which(exe)
    if path:
        try:
            with open(path, "rb") as fh:
                head = fh.read(64 * 1024).decode("utf-8", errors="replace")
            m = _INIT.search(head)
            if m:
                return Path(m.group(1))
        except OSError:
            pass
    return Path("/etc/enroot/enroot.conf")


def _eval_echo(value: str, env: dict) -> Optional[str]:
    """`eval echo VALUE` for the forms enroot.conf files use (quotes, $VAR, ${VAR}, ${VAR:-x},
    $(id -u), $(id -g), a trailing # comment); None for any other command substitution."""
    import os
    import shlex

    text = value.replace("$(id -u)", str(os.getuid())).replace("$(id -g)", str(os.getgid()))
    if "$(" in text or "`" in text:
        return None
    text = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), text)
    text = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text)
    try:
        return " ".join(shlex.split(text, comments=True))
    except ValueError:
        return None


def environment(environ=None, conf: Optional[Path] = None) -> dict:
    """The environment enroot runs with: `environ` (default os.environ) plus enroot.conf and its
    drop-ins as config::init applies them (see above). An unreadable or missing file adds nothing,
    as with enroot (a file that fails `bash -n` makes enroot refuse to run; not checked here). A
    value this cannot evaluate as enroot would (a command substitution other than $(id -u/-g)) is
    left out, and said on stderr: the request then runs without it."""
    import os
    import sys

    env = dict(os.environ if environ is None else environ)
    conf = conf if conf is not None else config_file()
    files = [conf] + (sorted(conf.parent.joinpath(conf.name + ".d").glob("*.conf"))
                      if conf.parent.joinpath(conf.name + ".d").is_dir() else [])
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        lines = text.split("\n")
        if not text.endswith("\n"):
            lines = lines[:-1]  # `read` does not return a last line without its newline
        for n, line in enumerate(lines, 1):
            parts = re.split(r"[ \t]*=[ \t]*|[ \t]+", line.lstrip(" \t"), maxsplit=1)
            key, value = parts[0], (parts[1] if len(parts) > 1 else "")
            if not _CONF_KEY.match(key) or env.get(key):
                continue
            got = _eval_echo(value.rstrip(" \t"), env)
            if got is None:
                print(f"lingjun-slurm: note: {path}:{n}: {key}'s value cannot be evaluated here as enroot "
                      "would (a command substitution): not applied to this host-side request", file=sys.stderr)
            else:
                env[key] = got
    return env
