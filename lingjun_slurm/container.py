"""pyxis container options (pyxis 0.24 flags only) and their lint.

Facts (NVIDIA/pyxis README and wiki): an image reference is
[USER@][REGISTRY#]IMAGE[:TAG]; without '#', the first path component is *not* a registry
and the image is looked up on Docker Hub. A squashfs file is recognised only when the
value starts with '/' or './'. Mounts are SRC:DST[:FLAGS] joined with ',', flags joined
with '+'. Variables listed in --container-env win over the image's own ENV.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import Issue, Loc
from .shell import Word
from .spec.models import SAFE_PATH_RE, ContainerSpec, Mount

IMAGE_CHARS_RE = re.compile(r"^[A-Za-z0-9._:/@#+-]+$")
SQUASH_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")
MOUNT_FLAGS = set(Mount.model_fields["flags"].annotation.__args__[0].__args__)  # type: ignore[union-attr]


def lint_image(image: str) -> str | None:
    """None if pyxis will find the image as the user meant, else an error with the fix."""
    if not IMAGE_CHARS_RE.fullmatch(image):
        return ("an image reference may hold letters, digits and . _ : / @ # + - only "
                "(pyxis splits on spaces and commas)")
    looks_like_path = image.endswith(SQUASH_SUFFIXES) or image.startswith(("/", ".", "~"))
    if looks_like_path:
        if not image.startswith(("/", "./")):
            return (f"pyxis reads a squashfs image only from a path starting with '/' or './'; "
                    f"{image!r} would be pulled from a registry: write './{image.lstrip('./~')}' or an absolute path")
        return None
    rest = image.split("@", 1)[1] if "@" in image.split("#", 1)[0] else image
    if "#" in rest:
        registry, name = rest.split("#", 1)
        if not registry or not name or "#" in name:
            return "expected [USER@][REGISTRY#]IMAGE[:TAG] with one '#' between registry and image"
        return None
    first = rest.split("/", 1)[0]
    if "/" in rest and ("." in first or ":" in first or first == "localhost"):
        fixed = image.replace(f"{first}/", f"{first}#", 1)
        return (f"{first!r} looks like a registry, but without '#' pyxis looks the image up on Docker Hub; "
                f"write {fixed!r}")
    return None


def parse_mount(raw: str | Mount) -> Mount:
    """'SRC:DST[:FLAGS]' -> Mount (ValueError with the reason if it is malformed)."""
    if isinstance(raw, Mount):
        return raw
    if "," in raw:
        raise ValueError("one mount per list item: ',' separates pyxis mounts and cannot appear inside one")
    parts = raw.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"expected SRC:DST[:FLAGS] (flags joined with '+'), got {raw!r}")
    src, dst = parts[0], parts[1]
    flags = parts[2].split("+") if len(parts) == 3 and parts[2] else []
    for path, what in ((src, "SRC"), (dst, "DST")):
        if not re.fullmatch(SAFE_PATH_RE, path):
            raise ValueError(f"{what} {path!r} must be an absolute path of letters, digits and . _ + @ = / - "
                             "(pyxis and enroot split on ',', ':' and spaces)")
    bad = [f for f in flags if f not in MOUNT_FLAGS]
    if bad:
        raise ValueError(f"unknown mount flag(s) {bad}; known: {sorted(MOUNT_FLAGS)}")
    return Mount(src=src, dst=dst, flags=flags)


def format_mount(mount: Mount) -> str:
    text = f"{mount.src}:{mount.dst}"
    return text + (":" + "+".join(mount.flags) if mount.flags else "")


@dataclass(frozen=True)
class ContainerOptions:
    """The pyxis flags of one srun, as argv words (quoted when rendered)."""

    flags: tuple[Word, ...]


def lint(spec: ContainerSpec, loc: Loc = ("container",)) -> list[Issue]:
    issues: list[Issue] = []
    if spec.runtime == "none":
        return issues
    if not spec.image:
        issues.append(Issue(loc + ("image",), "an image is required when runtime is 'pyxis' "
                                              "(or set runtime: none to run on the host)"))
    else:
        problem = lint_image(spec.image)
        if problem:
            issues.append(Issue(loc + ("image",), problem))
    seen: set[str] = set()
    for i, raw in enumerate(spec.mounts):
        try:
            mount = parse_mount(raw)
        except ValueError as exc:
            issues.append(Issue(loc + ("mounts", i), str(exc)))
            continue
        if mount.dst in seen:
            issues.append(Issue(loc + ("mounts", i), f"two mounts share the destination {mount.dst!r}"))
        seen.add(mount.dst)
    return issues


def mounts_with_workdir(spec: ContainerSpec, workdir: str) -> list[Mount]:
    """The user's mounts plus the run directory at the same path, unless already covered."""
    mounts = [parse_mount(m) for m in spec.mounts]
    covered = any(_covers(m.dst, workdir) for m in mounts)
    if not covered:
        mounts.append(Mount(src=workdir, dst=workdir))
    return mounts


def _covers(dst: str, path: str) -> bool:
    return path == dst or path.startswith(dst.rstrip("/") + "/")


def host_side(path: str, mounts: list[Mount]) -> str:
    """The host path behind a container-side path, for code that runs outside the container.

    The batch shell (and the login node) see the host's filesystem; the stages see pyxis's bind
    mounts. pyxis hands `--container-mounts` to enroot in order, and enroot applies them in that
    order (NVIDIA/enroot src/runtime.sh, `runtime::_mount` over the fstab pyxis writes), so of
    several mounts that cover a path the last one is what the container sees. A path no mount
    covers is taken as the same path on the host (enroot's own mounts.d entries, e.g. /lustre,
    mount at the same place).
    """
    chosen = None
    for mount in mounts:
        if _covers(mount.dst, path):
            chosen = mount
    if chosen is None:
        return path
    rest = path[len(chosen.dst.rstrip("/")):]
    return chosen.src.rstrip("/") + rest if rest else chosen.src


def workdir_mount_problem(spec: ContainerSpec, workdir: str) -> tuple[int, str] | None:
    """(mount index, reason) when a user mount puts another host directory at the run's workdir.

    The workdir is a host path: submit writes plan.json and the scripts there, on the host. A
    mount whose DST covers it with another SRC would show the stages a different directory.
    """
    found = None
    for i, raw in enumerate(spec.mounts):
        mount = parse_mount(raw)
        if _covers(mount.dst, workdir):
            found = (i, mount)
    if found is None:
        return None
    i, mount = found
    if host_side(workdir, [mount]) == workdir:
        return None
    return i, (f"this mount puts host {host_side(workdir, [mount])} at the run's workdir {workdir}; run.workdir is "
               "a host path (the scripts and plan.json are written there), so the stages would see another "
               "directory: mount it at the same path or change run.workdir")


def is_squashfs_path(image: str) -> bool:
    """pyxis takes an image as a file when it starts with '.' or '/' (`strspn(image, "./") > 0`,
    pyxis_slurmstepd.c); lint_image refuses the forms other than '/...' and './...'."""
    return image.startswith((".", "/"))


def pyxis_flags(spec: ContainerSpec, workdir: str, env_names: list[str], *, image: Word | None = None,
                name: Word | None = None) -> ContainerOptions:
    """srun flags for one stage; env_names are every variable the job sets.

    image and name replace --container-image=/--container-name= (e.g. with the staged image's path,
    which the batch script reads at run time)."""
    assert spec.image is not None
    flags: list[Word] = [image if image is not None else f"--container-image={spec.image}"]
    mounts = mounts_with_workdir(spec, workdir)
    if mounts:
        flags.append("--container-mounts=" + ",".join(format_mount(m) for m in mounts))
    if spec.workdir:
        flags.append(f"--container-workdir={spec.workdir}")
    if name is not None:
        flags.append(name)
    flags.append("--container-mount-home" if spec.mount_home else "--no-container-mount-home")
    flags.append("--container-remap-root" if spec.remap_root else "--no-container-remap-root")
    flags.append("--container-writable" if spec.writable else "--container-readonly")
    names = sorted(set(env_names) | set(spec.env_passthrough))
    if names:
        flags.append("--container-env=" + ",".join(names))
    return ContainerOptions(tuple(flags))
