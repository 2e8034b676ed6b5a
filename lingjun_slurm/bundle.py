"""Ship the code with the run: a wheel of the running lingjun_slurm, unpacked into <run_dir>/site.

Built-in stages run `python3 -m lingjun_slurm.stages` inside images that may not have
lingjun_slurm (or have another version). At submit, the package this CLI runs from is
written as a pure-Python wheel to <run_dir>/wheels/ and unpacked into <run_dir>/site/,
together with any wheels the spec lists (run.ship_wheels). The stage scripts put
<run_dir>/site first on PYTHONPATH and pass it into the container, so every job of the
run imports exactly the code that rendered it. The wheel is built here, from the
installed files: no network, no build backend, deterministic bytes for the same files.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path, PurePosixPath

from . import __version__
from .errors import UsageError
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
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
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


def ship(t: Transport, run_dir: str, extra_wheels: list[str]) -> list[str]:
    """Write the wheels to <run_dir>/wheels and unpack them into <run_dir>/site; returns the wheel names."""
    wheels = [build_wheel()]
    for wheel in extra_wheels:
        path = Path(wheel)
        if not path.is_file() or path.suffix != ".whl":
            raise UsageError(f"run.ship_wheels: {wheel} is not a wheel file on this machine")
        wheels.append((path.name, path.read_bytes()))
    t.mkdir(f"{run_dir}/wheels")
    site = f"{run_dir}/site"
    for name, data in wheels:
        t.write_atomic(f"{run_dir}/wheels/{name}", data)
        members = wheel_members(name, data)
        for directory in sorted({str(PurePosixPath(m).parent) for m, _ in members} - {"."}):
            t.mkdir(f"{site}/{directory}")
        for member, content in members:
            t.write_atomic(f"{site}/{member}", content)
    return [name for name, _ in wheels]
