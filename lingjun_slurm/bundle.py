"""Ship the code with the run: a wheel of the running lingjun_slurm, unpacked into <run_dir>/site.

Built-in stages run `python3 -m lingjun_slurm.stages` inside images that may not have
lingjun_slurm (or have another version). At submit, the package this CLI runs from is
written as a pure-Python wheel to <run_dir>/wheels/ and unpacked into <run_dir>/site/,
together with any wheels the spec lists (run.ship_wheels). The stage scripts put
<run_dir>/site first on PYTHONPATH and pass it into the container, so every job of the
run imports exactly the code that rendered it. The wheel is built here, from the
installed files: no network, no build backend, deterministic bytes for the same files.

On another host (the SSH transport) each wheel is uploaded once and unpacked there by one
`python3 -c UNPACK` command: file by file over SFTP costs several round trips per file
(about 120 files for lingjun_slurm). The members are checked here first (wheel_members),
and UNPACK applies the same rules. Where the host has no python3, or the command fails,
the files go up one by one as on this machine.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
import sys
from pathlib import Path, PurePosixPath
from typing import Optional

from . import __version__
from .common.errors import UsageError
from .transport.base import Transport

PACKAGE = "lingjun_slurm"
DIST = "lingjun_slurm"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def package_files() -> list[tuple[str, bytes]]:
    """(path inside the wheel, bytes) for every file of the package, templates included."""
    from .render import templates_dir

    root = Path(__file__).resolve().parent
    files: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
            files[f"{PACKAGE}/{path.relative_to(root).as_posix()}"] = path.read_bytes()
    templates = templates_dir()
    if not str(templates).startswith(str(root)):  # an editable install: the repository's slurm_templates/
        for path in sorted(templates.rglob("*")):
            if path.is_file():
                files[f"{PACKAGE}/slurm_templates/{path.relative_to(templates).as_posix()}"] = path.read_bytes()
    return sorted(files.items())


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a py3-none-any wheel of the running package."""
    info = f"{DIST}-{__version__}.dist-info"
    entries = package_files()
    entries.append((f"{info}/METADATA", (f"Metadata-Version: 2.1\nName: lingjun-slurm\nVersion: {__version__}\n"
                                         "Summary: lingjun_slurm as shipped with a run\n").encode()))
    entries.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: lingjun-slurm\nRoot-Is-Purelib: true\n"
                                     b"Tag: py3-none-any\n"))
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    record += f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    return f"{DIST}-{__version__}-py3-none-any.whl", buf.getvalue()


def wheel_members(name: str, data: bytes) -> list[tuple[str, bytes]]:
    """The files a wheel installs into site-packages (purelib/platlib only), refusing unsafe names."""
    out = []
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise UsageError(f"{name}: not a wheel (a zip file): {exc}") from None
    with zf:
        for item in zf.infolist():
            if item.is_dir():
                continue
            path = PurePosixPath(item.filename)
            if path.is_absolute() or ".." in path.parts:
                raise UsageError(f"{name}: unsafe path {item.filename!r} in the wheel")
            parts = path.parts
            if len(parts) > 2 and parts[0].endswith(".data"):
                if parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not needed on PYTHONPATH
                path = PurePosixPath(*parts[2:])
            out.append((path.as_posix(), zf.read(item)))
    return out


# Runs on the remote host as `python3 -c UNPACK WHEEL SITE COUNT` (Python 3.6+): the rules of
# wheel_members, each file written to a temporary name and renamed; prints the file count.
UNPACK = r"""
import os, sys, zipfile
from pathlib import PurePosixPath
wheel, site, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
done = 0
with zipfile.ZipFile(wheel) as zf:
    for item in zf.infolist():
        if item.filename.endswith("/"):
            continue
        path = PurePosixPath(item.filename)
        if path.is_absolute() or ".." in path.parts:
            sys.exit("unsafe path %r in %s" % (item.filename, wheel))
        parts = path.parts
        if len(parts) > 2 and parts[0].endswith(".data"):
            if parts[1] not in ("purelib", "platlib"):
                continue
            path = PurePosixPath(*parts[2:])
        target = os.path.join(site, str(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = "%s.tmp%d" % (target, os.getpid())
        with open(tmp, "wb") as fh:
            fh.write(zf.read(item))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        done += 1
print(done)
sys.exit(0 if done == want else "unpacked %d files, expected %d" % (done, want))
"""


def _unpack_remotely(t: Transport, wheel: str, site: str, count: int) -> Optional[str]:
    """Unpack an uploaded wheel with one command on the host; None when done, else why not."""
    result = t.run(["python3", "-c", UNPACK, wheel, site, str(count)], timeout=600)
    if result.returncode == 0 and result.stdout.strip() == str(count):
        return None
    detail = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1][:200]
    return f"python3 could not unpack {wheel} on {t.host} (exit {result.returncode}: {detail})"


def ship(t: Transport, run_dir: str, extra_wheels: list[str], *, unpack_remotely: Optional[bool] = None) -> list[str]:
    """Write the wheels to <run_dir>/wheels and unpack them into <run_dir>/site; returns the wheel names.

    unpack_remotely: unpack with one python3 command on the host (default: for every transport
    but the local one); on failure the files are written one by one.
    """
    return upload(t, run_dir, collect(extra_wheels), unpack_remotely=unpack_remotely)


def collect(extra_wheels: list[str]) -> list[tuple[str, bytes, list[tuple[str, bytes]]]]:
    """(name, bytes, members) of every wheel to ship, all read and checked here before anything is
    written anywhere: a missing, unreadable or unsafe wheel is a UsageError (exit 2) that leaves no
    half-written run directory behind (on a cluster, nothing this machine could clean up later)."""
    wheels = [build_wheel()]
    for wheel in extra_wheels:
        path = Path(wheel)
        if not path.is_file() or path.suffix != ".whl":
            raise UsageError(f"run.ship_wheels: {wheel} is not a wheel file on this machine")
        try:
            wheels.append((path.name, path.read_bytes()))
        except OSError as exc:
            raise UsageError(f"run.ship_wheels: cannot read {wheel}: {exc.strerror}") from None
    return [(name, data, wheel_members(name, data)) for name, data in wheels]


def upload(t: Transport, run_dir: str, wheels: list[tuple[str, bytes, list[tuple[str, bytes]]]], *,
           unpack_remotely: Optional[bool] = None) -> list[str]:
    """Write collected wheels to <run_dir>/wheels and unpack them into <run_dir>/site."""
    remote = t.kind != "local" if unpack_remotely is None else unpack_remotely
    t.mkdir(f"{run_dir}/wheels")
    site = f"{run_dir}/site"
    for name, data, members in wheels:
        wheel_path = f"{run_dir}/wheels/{name}"
        t.write_atomic(wheel_path, data)
        if remote:
            t.mkdir(site)
            why = _unpack_remotely(t, wheel_path, site, len(members))
            if why is None:
                continue
            print(f"note: {why}; uploading its {len(members)} files one by one", file=sys.stderr)
        for directory in sorted({str(PurePosixPath(m).parent) for m, _ in members} - {"."}):
            t.mkdir(f"{site}/{directory}")
        for member, content in members:
            t.write_atomic(f"{site}/{member}", content)
    return [name for name, _data, _members in wheels]
