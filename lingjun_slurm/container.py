"""pyxis container options (pyxis 0.24 flags only) and their lint.

Facts, read in the source (NVIDIA/pyxis v0.24.0 `10751994`, NVIDIA/enroot v4.1.2 `bd51f53b` and
v3.5.0 `c7dc4a6b`):

- Image references. pyxis does not parse a registry image: it prepends `docker://` and hands the
  value to enroot as written (pyxis_slurmstepd.c:728-736; v0.20.0: 632-639). enroot decides:
  - enroot >= 4.0 (commit f29a45c, first in v4.0.0) reads Docker-style `REGISTRY/IMAGE[:TAG]`
    when the first component holds a '.' or a ':' (src/docker.sh:208-250, `docker::_parse_uri`),
    and still reads its own `REGISTRY#IMAGE`; `localhost/x` is the Docker Hub namespace
    `localhost` there (no '.' or ':').
  - enroot 3.x reads only `[USER@][REGISTRY#]IMAGE[:TAG]` (v3.5.0 src/docker.sh:259-272): a
    `nvcr.io/nvidia/pytorch` is a Docker Hub image name, and `host:5000/ns/img` no reference at
    all (its tag pattern has no '/').
  So a Docker-style reference is accepted, and refused only where the enroot version is known to
  be 3.x (`lint_image(..., enroot_version=)`, from the spec's `container.enroot_version` when given).
- A squashfs file is recognised only when the value starts with '.' or '/'
  (`strspn(image, "./") > 0`, pyxis_slurmstepd.c:1356); the lint takes '/...' and './...'.
- Mounts are SRC:DST[:FLAGS] joined with ',', flags joined with '+'. Variables listed in
  --container-env win over the image's own ENV.
- Working directory. Without --container-workdir, pyxis starts every task in the directory the
  container's init process is in (container_get_cwd reads /proc/PID/cwd,
  pyxis_slurmstepd.c:945-970; the chdir at 1653-1664; v0.20.0: 725-740, 1303-1315), and enroot's
  /etc/rc has cd'd that process into the image's WorkingDir, or '/' when it has none (enroot
  v4.1.2 src/docker.sh:358-370, `docker::configure`). Not the job's directory: so every
  containerized srun passes --container-workdir (see `pyxis_flags`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .common.errors import Issue, Loc
from .common.shell import Shell, Word
from .spec.models import SAFE_PATH_RE, ContainerSpec, Mount

IMAGE_CHARS_RE = re.compile(r"^[A-Za-z0-9._:/@#+-]+$")
SQUASH_SUFFIXES = (".sqsh", ".squashfs", ".sqfs")
MOUNT_FLAGS = set(Mount.model_fields["flags"].annotation.__args__[0].__args__)  # type: ignore[union-attr]


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


def lint_image(image: str, enroot_version: tuple[int, ...] | None = None) -> str | None:
    """None if pyxis will find the image as the user meant, else an error with the fix.

    enroot_version: the cluster's enroot when known (enroot 3.x refuses Docker-style
    REGISTRY/IMAGE); None when it is not, and then both forms are accepted."""
    from .images.enroot import reads_docker_style
    from .images.reference import DOCKER_HUB, parse_image_ref

    if not IMAGE_CHARS_RE.fullmatch(image):
        return ("an image reference may hold letters, digits and . _ : / @ # + - only "
                "(pyxis splits on spaces and commas)")
    looks_like_path = image.endswith(SQUASH_SUFFIXES) or image.startswith(("/", ".", "~"))
    if looks_like_path:
        if not image.startswith(("/", "./")):
            return (f"pyxis reads a squashfs image only from a path starting with '/' or './'; "
                    f"{image!r} would be pulled from a registry: write './{image.lstrip('./~')}' or an absolute path")
        return None
    try:
        ref = parse_image_ref(image)
    except ValueError as exc:
        return str(exc)
    text = image.removeprefix("docker://")
    user = f"{ref.user}@" if ref.user else ""  # the text starts with it (docker.sh:208-289: ^docker://(USER@)?)
    old_enroot = enroot_version is not None and not reads_docker_style(enroot_version)
    if "#" not in image and ref.registry != DOCKER_HUB:
        # The user's text with the '/' after the registry made a '#' (tag and digest as written).
        cut = len(user) + len(ref.registry)
        hashed = f"{text[:cut]}#{text[cut + 1:]}"
        if old_enroot:
            assert enroot_version is not None
            return (f"enroot {_version_text(enroot_version)} (3.x) reads only REGISTRY#IMAGE: it would take "
                    f"{image!r} for a Docker Hub image, or refuse it (enroot v3.5.0 src/docker.sh:259-272); "
                    f"for enroot 3.x write {hashed!r}")
    elif "#" not in image and ref.repository.startswith("localhost/") and text.startswith(f"{user}localhost/"):
        # enroot v4.1.2 src/docker.sh:242-249: no '.' or ':' in the first component, so a namespace.
        rest = text[len(user) + len("localhost/"):]
        return (f"enroot reads 'localhost/...' as the Docker Hub namespace 'localhost' (a registry needs a '.' "
                f"or ':' in its name); write '{user}localhost:PORT/{rest}' or '{user}localhost#{rest}'")
    if old_enroot and ref.digest:
        assert enroot_version is not None
        return (f"enroot {_version_text(enroot_version)} (3.x) reads no @sha256: digest (v3.5.0 "
                "src/docker.sh:259-272; from 4.0.0 on it does): give a tag")
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
        version = None
        if spec.enroot_version is not None:
            from .images.enroot import parse_version

            try:
                version = parse_version(spec.enroot_version)
            except ValueError as exc:
                issues.append(Issue(loc + ("enroot_version",), str(exc)))
        problem = lint_image(spec.image, enroot_version=version)
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


# The stage's directory in the container: the batch script's own ($PWD when srun runs: the
# prelude has cd'd into the run directory, slurm_templates/partials/prelude.sh.j2). That directory
# is under run.workdir, which every container mounts at the same path (mounts_with_workdir), and
# the stages already read "$RUN_DIR/plan.json" there. Without the flag pyxis would start the task
# in the image's WorkingDir or '/' (see the module's docstring).
HOST_CWD_FLAG = Shell('--container-workdir="$PWD"')


def pyxis_flags(spec: ContainerSpec, workdir: str, env_names: list[str], *, image: Word | None = None,
                name: Word | None = None, cwd: Word | None = None) -> ContainerOptions:
    """srun flags for one stage; env_names are every variable the job sets.

    image and name replace --container-image=/--container-name= (e.g. with the staged image's path,
    which the batch script reads at run time). The task's directory is container.workdir when the
    spec sets one, else `cwd` (a whole --container-workdir= word), else the directory srun is run
    from (HOST_CWD_FLAG), as a srun without a container would: exactly one --container-workdir
    always (pyxis refuses two different ones, args.c:464-468)."""
    assert spec.image is not None
    flags: list[Word] = [image if image is not None else f"--container-image={spec.image}"]
    mounts = mounts_with_workdir(spec, workdir)
    if mounts:
        flags.append("--container-mounts=" + ",".join(format_mount(m) for m in mounts))
    if spec.workdir:
        flags.append(f"--container-workdir={spec.workdir}")
    else:
        flags.append(cwd if cwd is not None else HOST_CWD_FLAG)
    if name is not None:
        flags.append(name)
    flags.append("--container-mount-home" if spec.mount_home else "--no-container-mount-home")
    flags.append("--container-remap-root" if spec.remap_root else "--no-container-remap-root")
    flags.append("--container-writable" if spec.writable else "--container-readonly")
    names = sorted(set(env_names) | set(spec.env_passthrough))
    if names:
        flags.append("--container-env=" + ",".join(names))
    return ContainerOptions(tuple(flags))
