"""A sandboxed node for the cluster-init installer.

The installer runs for real, with LINGJUN_NODE_ROOT pointing at a temporary directory that
plays the node's `/`. What cannot run here (jetpack, systemctl, package managers, mdadm,
mkfs, mount, blkid, scontrol, nvidia-smi, logger) is replaced by small stand-ins on PATH
that record each call in calls.log and emulate just enough: the apt-get stand-in extracts a
.deb with `dpkg-deb -x` into the node root and records the package in a fake package
database, mount appends to the node's /proc/mounts, and so on. The real apt-get, apt-mark,
dpkg and dpkg-query run against a node root in tests/cluster_init/test_packages_real.py
(RealApt below); these stand-ins only model them, after what that real apt did here:
`dpkg-query -W -f='${Status}|${Version}'` prints "hold ok installed|4.0.1-1" for a held
package, and apt-get install of a held package's new version without
--allow-change-held-packages exits 100 with "E: Held packages were changed and -y was used
without --allow-change-held-packages." (apt 2.6.1, Debian 12).

A node is modelled on an Azure HPC image by default: libnvidia-container-tools and
libnvidia-container1 are installed and held (Azure/azhpc-images
components/install_nvidia_container_toolkit.sh:19-22), nvidia-container-cli is on the node.
"""

from __future__ import annotations

import hashlib
import textwrap
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "cluster_init" / "lingjun-slurm"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
OS_RELEASE = {"ubuntu": FIXTURES / "os-release" / "ubuntu-22.04",
              "rhel": FIXTURES / "os-release" / "rhel-8.7"}
ENROOT_VERSION = "4.2.1"
PYXIS_VERSION = "0.24.0"
NVCLI_VERSION = "1.20.1"  # lingjun_slurm.enroot.libnvidia_container_version
IMAGE_NVCLI_VERSION = "1.17.8"  # what the modelled Azure HPC image has installed and held
NVCLI_NAMES = ("libnvidia-container1", "libnvidia-container-tools")
SHIMS = {"default": "00-lingjun-slurm-default.sh", "execute": "20-lingjun-slurm-execute.sh",
         "scheduler": "20-lingjun-slurm-scheduler.sh", "login": "20-lingjun-slurm-login.sh"}

_HEADER = """#!/usr/bin/env bash
set -euo pipefail
printf '%s\\n' "${0##*/} $*" >>"$STANDIN_DIR/calls.log"
R=$LINGJUN_NODE_ROOT
"""

STANDINS = {
    "jetpack": r"""
[ "${1-}" = config ] || { echo "jetpack stand-in: only 'jetpack config KEY [DEFAULT]'" >&2; exit 1; }
if line=$(awk -F'\t' -v k="$2" '$1 == k { print; found = 1; exit } END { exit !found }' "$STANDIN_DIR/jetpack.tsv"); then
    printf '%s\n' "${line#*$'\t'}"
elif [ $# -ge 3 ]; then
    printf '%s\n' "$3"
else
    echo "jetpack: no configuration key $2" >&2; exit 1
fi
""",
    "systemctl": r"""
case ${1-} in
is-active) shift; [ "${1-}" = --quiet ] && shift; [ -e "$STANDIN_DIR/active/$1" ] ;;
*) exit 0 ;;
esac
""",
    "apt-get": r"""
case " $* " in *" install "*) ;; *) exit 0 ;; esac
allow_held=0
case " $* " in *" --allow-change-held-packages "*) allow_held=1 ;; esac
args=()
while [ $# -gt 0 ]; do
    case $1 in
    -o) shift ;; # -o NAME=VALUE (apt configuration)
    -* | install) ;;
    *) args+=("$1") ;;
    esac
    shift
done
set -- "${args[@]}"
for a in "$@"; do
    case $a in
    *.deb) name=$(dpkg-deb -f "$a" Package) ;;
    *) name=$a ;;
    esac
    if [ -f "$STANDIN_DIR/pkgdb/$name.hold" ] && [ $allow_held -eq 0 ] &&
        { [[ $a != *.deb ]] || [ "$(cat "$STANDIN_DIR/pkgdb/$name")" != "$(dpkg-deb -f "$a" Version)" ]; }; then
        [[ $a != *.deb ]] && [ -f "$STANDIN_DIR/pkgdb/$name" ] && continue
        echo "E: Held packages were changed and -y was used without --allow-change-held-packages." >&2
        exit 100
    fi
done
for a in "$@"; do
    case $a in
    *.deb)
        dpkg-deb -x "$a" "$R"
        printf '%s' "$(dpkg-deb -f "$a" Version)" >"$STANDIN_DIR/pkgdb/$(dpkg-deb -f "$a" Package)"
        # apt drops the hold of a package it changed (what the real apt-get did here)
        rm -f "$STANDIN_DIR/pkgdb/$(dpkg-deb -f "$a" Package).hold" ;;
    *) [ -f "$STANDIN_DIR/pkgdb/$a" ] || printf '1.0-1' >"$STANDIN_DIR/pkgdb/$a" ;;
    esac
done
""",
    "apt-mark": r"""
op=${1-}
shift || true
for name in "$@"; do
    case $op in
    hold) : >"$STANDIN_DIR/pkgdb/$name.hold"; echo "$name set on hold." ;;
    unhold) rm -f "$STANDIN_DIR/pkgdb/$name.hold"; echo "Canceled hold on $name." ;;
    *) echo "apt-mark stand-in: only hold and unhold" >&2; exit 1 ;;
    esac
done
""",
    "dpkg-query": r"""
name=${!#}
want=install
[ ! -f "$STANDIN_DIR/pkgdb/$name.hold" ] || want=hold
if [ -f "$STANDIN_DIR/pkgdb/$name" ]; then
    printf '%s ok installed|%s' "$want" "$(cat "$STANDIN_DIR/pkgdb/$name")"
else
    echo "dpkg-query: no packages found matching $name" >&2; exit 1
fi
""",
    "dnf": r"""
for a in "$@"; do
    case $a in
    -* | install) ;;
    *.rpm)
        tar -xzf "$a" -C "$R"
        nvr=$(basename "$a" .rpm); nvr=${nvr%.*}; name=${nvr%-*-*}; vr=${nvr#"$name"-}
        printf '%s' "${vr%%-*}" >"$STANDIN_DIR/pkgdb/$name" ;;
    *) printf '1.0' >"$STANDIN_DIR/pkgdb/$a" ;;
    esac
done
""",
    "rpm": r"""
name=${!#}
if [ -f "$STANDIN_DIR/pkgdb/$name" ]; then
    printf '%s' "$(cat "$STANDIN_DIR/pkgdb/$name")"
else
    echo "package $name is not installed"; exit 1
fi
""",
    "mdadm": r"""
[ "${1-}" = --create ] || exit 0
dev=$2
mkdir -p "$(dirname "$R$dev")"; : >"$R$dev"
for a in "$@"; do
    case $a in /dev/nvme*) mkdir -p "$R/sys/block/${a#/dev/}/holders/md127" ;; esac
done
""",
    "mkfs.xfs": r"""
dev=${!#} label=""
[ -e "$R$dev" ] || { echo "mkfs.xfs: $dev: no such device" >&2; exit 1; }
while [ $# -gt 1 ]; do [ "$1" = -L ] && label=$2; shift; done
printf xfs >"$STANDIN_DIR/fstype/$(printf '%s' "$dev" | tr / _)"
if [ -n "$label" ]; then printf '%s' "$label" >"$STANDIN_DIR/fstype/$(printf '%s' "$dev" | tr / _).label"; fi
""",
    "blkid": r"""
# blkid -p [-s TYPE|LABEL -o value] DEV; STANDIN_BLKID_RC=N: exit N (8 = ambivalent result)
[ -z "${STANDIN_BLKID_RC-}" ] || exit "$STANDIN_BLKID_RC"
marker="$STANDIN_DIR/fstype/$(printf '%s' "${!#}" | tr / _)"
[ -f "$marker" ] || exit 2
case " $* " in
*" -s LABEL "*) [ -f "$marker.label" ] || exit 2; cat "$marker.label"; echo ;;
*) cat "$marker"; echo ;;
esac
""",
    "mount": r"""
dev=${*: -2:1}; dir=${!#}
[ -e "$R$dev" ] || { echo "mount: $dev: no such device" >&2; exit 32; }
[ -d "$R$dir" ] || { echo "mount: $dir: no such directory" >&2; exit 32; }
printf '%s %s xfs rw,noatime 0 0\n' "$dev" "$dir" >>"$R/proc/mounts"
""",
    "scontrol": "exit 0\n",
    "nvidia-smi": "exit 0\n",
    "logger": "exit 0\n",
}

HEALTH_STANDIN = """#!/usr/bin/env bash
# Test stand-in for the generated lingjun-health program: records the call.
printf 'lingjun-health %s\\n' "$*" >>"$STANDIN_DIR/calls.log"
exit "${STANDIN_HEALTH_RC:-0}"
"""

SLURM_CONF = """# slurm.conf as CycleCloud's template writes it (excerpt)
ClusterName=lingjun
SlurmctldHost=scheduler
Prolog=/etc/slurm/prolog.d/*
PrologFlags=alloc
HealthCheckInterval=60
HealthCheckNodeState=ANY
HealthCheckProgram=/sched/lingjun/health.sh
Include azure.conf
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def deb_arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def enroot_files(os_family: str, version: str = ENROOT_VERSION) -> list[str]:
    if os_family == "ubuntu":
        return [f"enroot_{version}-1_{deb_arch()}.deb", f"enroot+caps_{version}-1_{deb_arch()}.deb"]
    arch = os.uname().machine
    return [f"enroot-{version}-1.el8.{arch}.rpm", f"enroot+caps-{version}-1.el8.{arch}.rpm"]


def nvcli_files(os_family: str, version: str = NVCLI_VERSION) -> list[str]:
    """NVIDIA's file names (stable/deb/ARCH/ and stable/rpm/ARCH/ of nvidia.github.io/libnvidia-container)."""
    if os_family == "ubuntu":
        return [f"{name}_{version}-1_{deb_arch()}.deb" for name in NVCLI_NAMES]
    return [f"{name}-{version}-1.{os.uname().machine}.rpm" for name in NVCLI_NAMES]


NVCLI_SCRIPT = """#!/bin/sh
# stand-in nvidia-container-cli: what --version prints (libnvidia-container src/cli/main.c print_version)
case "$1" in --version) printf 'cli-version: {v}\\nlib-version: {v}\\n' ;; *) echo "stand-in: no GPU here" >&2; exit 1 ;; esac
"""


def control(name: str, version: str, depends: str = "") -> str:
    """A DEBIAN/control for a dummy package (the fields dpkg-deb --build needs)."""
    text = (f"Package: {name}\nVersion: {version}\nArchitecture: {deb_arch()}\n"
            "Maintainer: lingjun-slurm tests <tests@example.invalid>\n")
    if depends:
        text += f"Depends: {depends}\n"
    return text + f"Description: test stand-in for the {name} package\n"


def build_deb(tree: Path, out: Path, name: str, version: str, depends: str = "") -> Path:
    """dpkg-deb --build TREE (with a control file for NAME VERSION) into OUT (a directory or file)."""
    _write(tree / "DEBIAN/control", control(name, version, depends))
    # every file under /etc is a conffile, as debhelper's dh_installdeb makes them (enroot's
    # package is built with dh, NVIDIA/enroot pkg/deb/rules; /etc/enroot/enroot.conf, Makefile:149)
    etc = sorted("/" + str(p.relative_to(tree)) for p in (tree / "etc").rglob("*") if p.is_file()) \
        if (tree / "etc").is_dir() else []
    if etc:
        _write(tree / "DEBIAN/conffiles", "".join(f"{path}\n" for path in etc))
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree), str(out)],
                   check=True, capture_output=True, text=True)
    return out if out.suffix == ".deb" else out / f"{name}_{version}_{deb_arch()}.deb"


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _package_tree(root: Path, name: str, version: str) -> None:
    if name == "enroot":
        _write(root / "usr/bin/enroot", f"#!/bin/sh\necho {version}\n", 0o755)
        _write(root / "etc/enroot/enroot.conf", f"# enroot {version}\n#ENROOT_RUNTIME_PATH ${{XDG_RUNTIME_DIR}}/enroot\n")
        for hook in ("50-slurm-pmi.sh", "50-slurm-pytorch.sh", "50-mig-config.sh"):
            _write(root / f"usr/share/enroot/hooks.d/{hook}", f"#!/usr/bin/env bash\n# {hook} stand-in\n", 0o755)
    elif name == "libnvidia-container-tools":
        _write(root / "usr/bin/nvidia-container-cli", NVCLI_SCRIPT.replace("{v}", version.split("-")[0]), 0o755)
    else:
        _write(root / f"usr/share/doc/{name}/README", f"{name} {version}\n")


# What the real packages depend on among themselves: enroot+caps on exactly its enroot
# (NVIDIA/enroot pkg/deb/control, "#PACKAGE# (= ${binary:Version})"), libnvidia-container-tools
# on exactly its libnvidia-container1 (stable/deb/amd64/Packages of NVIDIA/libnvidia-container,
# 1.20.1-1: "libnvidia-container1 (= 1.20.1-1)").
DEPENDS = {"enroot+caps": "enroot (= {v})", "libnvidia-container-tools": "libnvidia-container1 (= {v})"}


def build_artifacts(dest: Path) -> dict[str, Path]:
    """Dummy release artifacts: real .debs (dpkg-deb), rpm-like tarballs, a pyxis source tarball;
    enroot, enroot+caps, libnvidia-container1 and libnvidia-container-tools."""
    dest.mkdir(parents=True, exist_ok=True)
    work = dest / ".build"
    out: dict[str, Path] = {}
    sets = ((("enroot", "enroot+caps"), ENROOT_VERSION, enroot_files),
            (NVCLI_NAMES, NVCLI_VERSION, nvcli_files))
    for names, version, files in sets:
        for name, deb in zip(names, files("ubuntu")):
            tree = work / deb
            _package_tree(tree, name, version)
            out[deb] = build_deb(tree, dest / deb, name, f"{version}-1",
                                 DEPENDS.get(name, "").replace("{v}", f"{version}-1"))
        for name, rpm in zip(names, files("rhel")):
            tree = work / rpm
            _package_tree(tree, name, version)
            subprocess.run(["tar", "-czf", str(dest / rpm), "-C", str(tree), "."], check=True)
            out[rpm] = dest / rpm
    out[f"pyxis-{PYXIS_VERSION}.tar.gz"] = build_pyxis_tarball(dest, work)
    shutil.rmtree(work)
    return out


PYXIS_MAKEFILE = """\
prefix ?= /usr/local
libdir ?= $(prefix)/lib
PLUGINDIR := $(abspath $(DESTDIR)/$(libdir)/slurm)
CPPFLAGS := -D_GNU_SOURCE -DPYXIS_VERSION=\\"0.24.0\\" $(CPPFLAGS)
INCDIR := $(patsubst -I%,%,$(firstword $(filter -I%,$(CPPFLAGS))))

all: spank_pyxis.so

spank_pyxis.so: pyxis.c
\ttest -f "$(INCDIR)/slurm/spank.h"
\tprintf 'fake spank_pyxis.so; flags: %s; built against:\\n' '$(filter -D%,$(CPPFLAGS))' > $@
\tcat "$(INCDIR)/slurm/spank.h" >> $@

install: all
\tinstall -d -m 755 $(PLUGINDIR)
\tinstall -m 644 spank_pyxis.so $(PLUGINDIR)
"""


def build_pyxis_tarball(dest: Path, work: Path) -> Path:
    src = work / f"pyxis-{PYXIS_VERSION}"
    _write(src / "Makefile", PYXIS_MAKEFILE)
    _write(src / "pyxis.c", "/* stand-in source */\n")
    out = dest / f"pyxis-{PYXIS_VERSION}.tar.gz"
    subprocess.run(["tar", "-czf", str(out), "-C", str(work), src.name], check=True)
    return out


def write_pins(path: Path, artifacts: dict[str, Path], upstream: str, missing: tuple[str, ...] = ()) -> Path:
    lines = ["# test pins: file, sha256, upstream URL, source"]
    for name, art in sorted(artifacts.items()):
        digest = "-" if name in missing else sha256(art)
        lines.append(f"{name}\t{digest}\t{upstream}/{name}\ttest artifact built by tests/cluster_init/node.py")
    return _write(path, "\n".join(lines) + "\n")


@dataclass
class Node:
    """One sandboxed node: its root, stand-ins, a copy of the project and its configuration."""

    base: Path
    os_family: str = "ubuntu"
    config: dict[str, str] = field(default_factory=dict)
    jetpack_extra: dict[str, str] = field(default_factory=dict)
    real_health: bool = False  # keep the generated lingjun-health instead of the recording stand-in
    image_nvcli: str | None = IMAGE_NVCLI_VERSION  # libnvidia-container the image has (None: none)

    def __post_init__(self) -> None:
        self.root = self.base / "root"
        self.state = self.base / "standin"
        self.bin = self.base / "bin"
        self.project = self.base / "project" / "lingjun-slurm"
        for sub in ("pkgdb", "active", "fstype"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        (self.state / "calls.log").touch()
        for name, body in STANDINS.items():
            _write(self.bin / name, _HEADER + body, 0o755)
        # The awk each distribution ships: mawk on Ubuntu, gawk on RHEL (when installed here).
        awk = shutil.which({"ubuntu": "mawk", "rhel": "gawk"}[self.os_family])
        if awk:
            (self.bin / "awk").symlink_to(awk)
        shutil.copytree(PROJECT, self.project)
        self._health_standin()
        self._skeleton()

    # -- setup -----------------------------------------------------------------------------

    def _health_standin(self) -> None:
        health = self.project / "specs/execute/cluster-init/files/health"
        if self.real_health and (health / "lingjun-health").is_file():
            return
        _write(health / "lingjun-health", HEALTH_STANDIN, 0o755)
        if not any((health / "thresholds").glob("*.conf")):
            for sku in ("Standard_ND96isr_H100_v5", "lingjun"):
                _write(health / "thresholds" / f"{sku}.conf", f"# test thresholds for {sku}\nGPU_COUNT=8\n")

    def _skeleton(self) -> None:
        r = self.root
        shutil.copy(OS_RELEASE[self.os_family], _ensure(r / "etc") / "os-release")
        _write(r / "proc/mounts", "/dev/sda1 / ext4 rw 0 0\n")
        _write(r / "proc/sys/kernel/random/boot_id", "3f1b3c8e-0000-4000-8000-000000000001\n")
        _write(r / "usr/include/slurm/spank.h", "/* spank.h of Slurm 23.11 (stand-in) */\n")
        _write(r / "usr/include/slurm/slurm_version.h", "#define SLURM_VERSION_STRING \"23.11.10\"\n")
        _write(r / "usr/lib64/slurm/select_cons_tres.so", "stand-in plugin\n")
        _write(r / "etc/slurm/slurm.conf", SLURM_CONF)
        _write(r / "etc/slurm/plugstack.conf", "include /etc/slurm/plugstack.conf.d/*\n")
        for d in ("run", "tmp", "var/tmp", "mnt", "dev", "etc/slurm/plugstack.conf.d", "etc/slurm/prolog.d"):
            _ensure(r / d)
        if self.image_nvcli:
            self.preinstall(NVCLI_NAMES, self.image_nvcli, hold=True)
            _write(r / "usr/bin/nvidia-container-cli", NVCLI_SCRIPT.replace("{v}", self.image_nvcli), 0o755)

    def preinstall(self, names, version: str, hold: bool = False) -> None:
        """Record packages as installed (and held, on Ubuntu) in the stand-ins' package database."""
        for name in names:
            (self.state / "pkgdb" / name).write_text(f"{version}-1" if self.os_family == "ubuntu" else version)
            if hold and self.os_family == "ubuntu":
                (self.state / "pkgdb" / f"{name}.hold").touch()

    def held(self, name: str) -> bool:
        return (self.state / "pkgdb" / f"{name}.hold").exists()

    def pkg_version(self, name: str) -> str | None:
        db = self.state / "pkgdb" / name
        return db.read_text() if db.exists() else None

    def remove_nvcli(self) -> None:
        """A node that is not an Azure HPC image: no libnvidia-container, no nvidia-container-cli."""
        for name in NVCLI_NAMES:
            for path in (self.state / "pkgdb" / name, self.state / "pkgdb" / f"{name}.hold"):
                path.unlink(missing_ok=True)
        self.path("/usr/bin/nvidia-container-cli").unlink(missing_ok=True)

    def add_nvme(self, count: int, model: str = "Microsoft NVMe Direct Disk v2") -> list[str]:
        names = []
        for i in range(count):
            name = f"nvme{i}n1"
            _write(self.root / f"sys/block/{name}/device/model", model + "          \n")
            _ensure(self.root / f"sys/block/{name}/holders")
            _write(self.root / f"dev/{name}", "")
            names.append(name)
        return names

    def mount(self, device: str, path: str) -> None:
        with open(self.root / "proc/mounts", "a") as fh:
            fh.write(f"{device} {path} ext4 rw 0 0\n")

    def service_running(self, name: str, running: bool = True) -> None:
        marker = self.state / "active" / name
        if running:
            marker.touch()
        else:
            marker.unlink(missing_ok=True)

    def put_artifacts(self, artifacts: dict[str, Path], where: Path | None = None) -> Path:
        target = where or self.project / "specs/default/cluster-init/files/artifacts"
        target.mkdir(parents=True, exist_ok=True)
        for name, path in artifacts.items():
            shutil.copy(path, target / name)
        return target

    # -- running ---------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env.update(PATH=f"{self.bin}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                   LINGJUN_NODE_ROOT=str(self.root), STANDIN_DIR=str(self.state),
                   no_proxy="127.0.0.1,localhost", TMPDIR=str(_ensure(self.base / "tmp")))
        env.update(extra or {})
        return env

    def run(self, role: str, mode: str = "jetpack", extra_env: dict[str, str] | None = None,
            config_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a role: through its CycleCloud shim (jetpack mode) or install.sh --config (file mode)."""
        if mode == "jetpack":
            self.write_jetpack()
            cmd = ["bash", str(self.project / f"specs/{role}/cluster-init/scripts/{SHIMS[role]}")]
        else:
            yaml = self.base / "node.yaml"
            _write(yaml, config_text if config_text is not None else to_yaml(self.config))
            cmd = ["bash", str(self.project / "specs/default/cluster-init/files/install.sh"),
                   "--config", str(yaml), "--role", role]
            (self.bin / "jetpack").unlink(missing_ok=True)
        return subprocess.run(cmd, env=self.env(extra_env), capture_output=True, text=True, timeout=60)

    def write_jetpack(self) -> None:
        """What the jetpack stand-in answers: the node's config plus CycleCloud's own keys."""
        rows = {**self.config, **self.jetpack_extra}
        _write(self.state / "jetpack.tsv", "".join(f"{k}\t{v}\n" for k, v in rows.items()))

    # -- inspecting ------------------------------------------------------------------------

    def calls(self) -> list[str]:
        return (self.state / "calls.log").read_text().splitlines()

    def clear_calls(self) -> None:
        (self.state / "calls.log").write_text("")

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def mode(self, node_path: str) -> int:
        return self.path(node_path).stat().st_mode & 0o7777

    def share_slurm_conf(self, shared: str = "/sched/lingjun/slurm.conf") -> Path:
        """Make /etc/slurm/slurm.conf a symlink into /sched, as CycleCloud's cyclecloud-slurm does
        (the real file on the scheduler's shared /sched); returns the link."""
        target = self.path(shared)
        target.parent.mkdir(parents=True)
        link = self.path("/etc/slurm/slurm.conf")
        target.write_text(link.read_text())
        link.unlink()
        link.symlink_to(target)
        return link

    def log(self) -> str:
        return self.path("/var/log/lingjun-slurm/install.log").read_text()

    def snapshot(self) -> dict[str, tuple]:
        """Every entry under the node root: type, mode, mtime and (for files) content digest."""
        out = {}
        skip = self.path("/var/log/lingjun-slurm")
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                if p == skip or skip in p.parents:
                    continue
                st = p.lstat()
                digest = sha256(p) if p.is_file() and not p.is_symlink() else None
                out[str(p.relative_to(self.root))] = (st.st_mode, st.st_mtime_ns, digest)
        return out

    def tree(self) -> dict[str, tuple]:
        """Like snapshot, without times: what two equivalent installs must share."""
        return {k: (v[0], v[2]) for k, v in self.snapshot().items()}


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def to_yaml(config: dict[str, str]) -> str:
    lines = ["# node.yaml written by the tests", "---"]
    for key, value in config.items():
        lines.append(f'{key}: "{value}"' if value == "" or " #" in value or ": " in value else f"{key}: {value}")
    return "\n".join(lines) + "\n"


class RealApt:
    """The real apt-get, apt-mark, dpkg and dpkg-query on a node's root, nothing outside it.

    APT_CONFIG names an apt.conf that moves every apt directory under the node root (Dir) and
    hands dpkg --root/--admindir/--log there (dpkg takes its log path from the host's
    /etc/dpkg/dpkg.cfg otherwise, even with --root); DPKG_ROOT and DPKG_ADMINDIR do the same for dpkg-query
    and dpkg run directly (dpkg 1.21). Packages come from the test's own .debs, published in a
    flat file: repository (a Packages index written here, apt's [trusted=yes]); the installer's
    own `apt-get update` reads it. The node's apt stand-ins are removed, so the installer runs
    the real tools with this environment."""

    def __init__(self, node: Node, repo: Path) -> None:
        self.node, self.repo, root = node, repo, node.root
        for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "etc/apt/apt.conf.d",
                  "etc/apt/preferences.d", "etc/apt/sources.list.d", "var/lib/apt/lists/partial",
                  "var/cache/apt/archives/partial", "var/log/apt"):
            _ensure(root / d)
        for f in ("var/lib/dpkg/status", "var/lib/dpkg/available"):
            (root / f).touch()
        _ensure(repo)
        self.publish()
        _write(root / "etc/apt/sources.list", f"deb [trusted=yes] file:{repo} ./\n")
        self.conf = _write(node.base / "apt.conf", textwrap.dedent(f"""\
            Dir "{root}/";
            Dir::State::status "{root}/var/lib/dpkg/status";
            DPkg::Options {{ "--root={root}"; "--admindir={root}/var/lib/dpkg"; "--log={root}/var/log/dpkg.log"; }};
            APT::Sandbox::User "root";
            """))
        for name in ("apt-get", "apt-mark", "dpkg-query"):
            (node.bin / name).unlink(missing_ok=True)
        node.remove_nvcli()  # the stand-ins' package database plays no part any more

    @property
    def env(self) -> dict[str, str]:
        return {"APT_CONFIG": str(self.conf), "DPKG_ROOT": str(self.node.root),
                "DPKG_ADMINDIR": str(self.node.root / "var/lib/dpkg"), "DEBIAN_FRONTEND": "noninteractive"}

    def publish(self, *debs: Path) -> None:
        """Copy .debs into the repository and rewrite its Packages index (control + Filename, Size, SHA256)."""
        for deb in debs:
            shutil.copy(deb, self.repo / deb.name)
        stanzas = []
        for deb in sorted(self.repo.glob("*.deb")):
            fields = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
            stanzas.append(fields.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\n"
                           f"SHA256: {sha256(deb)}\n")
        (self.repo / "Packages").write_text("\n".join(stanzas))

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), env=self.node.env(self.env), capture_output=True, text=True,
                              timeout=120, check=check)

    def install(self, *debs: Path, hold: tuple[str, ...] = ()) -> None:
        """What another installer did before ours: apt-get install the files, apt-mark hold NAMES."""
        self.run("apt-get", "update", "-qq")
        self.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *map(str, debs))
        if hold:
            self.run("apt-mark", "hold", *hold)

    def status(self, name: str) -> str | None:
        """dpkg-query's "WANT FLAG STATUS|VERSION" for NAME, or None when dpkg does not know it."""
        proc = self.run("dpkg-query", "-W", "-f=${Status}|${Version}", name, check=False)
        return proc.stdout if proc.returncode == 0 else None


def dummy_deb(out_dir: Path, name: str, version: str, depends: str = "") -> Path:
    """A dummy .deb NAME_VERSION_ARCH.deb in OUT_DIR, with the files _package_tree gives NAME."""
    tree = out_dir / ".build" / f"{name}_{version}"
    if tree.exists():
        shutil.rmtree(tree)
    _package_tree(tree, name, version)
    return build_deb(tree, out_dir / f"{name}_{version}_{deb_arch()}.deb", name, version, depends)
