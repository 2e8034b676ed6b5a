"""The installer's package path with the real apt-get, apt-mark, dpkg and dpkg-query (issue 14,
items 1 and 3), on packages these tests build themselves (dpkg-deb --build), in a dpkg database
and apt state under the node's sandbox root (tests/cluster_init/node.py RealApt): nothing outside
the test's temporary directory is read or written by apt or dpkg.

The node is what cyclecloud-slurm 4.0.x leaves on an Azure HPC image: enroot and enroot+caps
4.0.1 installed from its artifacts and held (Azure/cyclecloud-slurm 4.0.9,
azure-slurm-install/ubuntu.sh:11,41-54,153), /etc/enroot/enroot.conf rewritten by its install.py
(_configure_enroot_pyxis, 929-968), libnvidia-container-tools and libnvidia-container1 held by
the image (Azure/azhpc-images components/install_nvidia_container_toolkit.sh:19-22)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cluster_init.node import NVCLI_NAMES, RealApt, deb_arch, dummy_deb

HOST_APT_STATE = [Path("/var/lib/dpkg/status"), Path("/var/lib/apt/extended_states"), Path("/var/log/apt/history.log"),
                  Path("/var/log/dpkg.log")]


def _need_real_apt() -> None:
    missing = [tool for tool in ("apt-get", "apt-mark", "dpkg", "dpkg-query", "dpkg-deb") if shutil.which(tool) is None]
    reason = ""
    if missing:
        reason = f"the real {', '.join(missing)} is not installed"
    elif os.geteuid() != 0:
        reason = "dpkg --root installs files owned by root: run as root (CI does)"
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs these tests on Debian 12 as root: {reason}")
        pytest.skip(reason)


@pytest.fixture
def host_apt_untouched():
    """The host's own dpkg database and apt logs are the same after the test."""
    def stamp():
        return {p: (p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None for p in HOST_APT_STATE}
    before = stamp()
    yield
    assert stamp() == before, "real apt/dpkg touched the host's package state"


@pytest.fixture
def cyclecloud_node(make_node, tmp_path, host_apt_untouched):
    """make(config, enroot="4.0.1", nvcli="1.17.8", ...) -> (node, apt): an Ubuntu node with real
    apt state in its root, prepared like a cyclecloud-slurm 4.0.x node on an Azure HPC image."""
    _need_real_apt()
    count = 0

    def make(config: dict[str, str] | None = None, *, enroot: str | None = "4.0.1", hold_enroot: bool = True,
             nvcli: str | None = "1.17.8", toolkit_pins_nvcli: bool = False, held_extras: bool = False):
        nonlocal count
        count += 1
        node = make_node(config=config)
        apt = RealApt(node, tmp_path / f"repo{count}")
        debs = tmp_path / f"debs{count}"
        debs.mkdir()
        # what enroot.extra_packages names and the pyxis build may need, for apt-get to find
        extras = [dummy_deb(debs, name, "1.0-1") for name in ("pigz", "squashfuse", "fuse-overlayfs", "make", "gcc")]
        apt.publish(*extras)
        if held_extras:
            apt.install(*extras[:3], hold=("pigz", "squashfuse", "fuse-overlayfs"))
        if enroot:
            pkgs = [dummy_deb(debs, "enroot", f"{enroot}-1"),
                    dummy_deb(debs, "enroot+caps", f"{enroot}-1", f"enroot (= {enroot}-1)")]
            apt.install(*pkgs, hold=("enroot", "enroot+caps") if hold_enroot else ())
            # cyclecloud-slurm's install.py writes its own enroot.conf (a conffile of the package)
            node.path("/etc/enroot/enroot.conf").write_text(
                "# written by cyclecloud-slurm's install.py from templates/enroot.conf.template\n"
                "ENROOT_RUNTIME_PATH /mnt/enroot/enroot-run/user-$(id -u)\n")
        if nvcli:
            pkgs = [dummy_deb(debs, "libnvidia-container1", f"{nvcli}-1"),
                    dummy_deb(debs, "libnvidia-container-tools", f"{nvcli}-1", f"libnvidia-container1 (= {nvcli}-1)")]
            held = list(NVCLI_NAMES)
            if toolkit_pins_nvcli:
                # nvidia-container-toolkit 1.18.0 and later depend on exactly their
                # libnvidia-container-tools (stable/deb/amd64/Packages of NVIDIA/libnvidia-container)
                pkgs.append(dummy_deb(debs, "nvidia-container-toolkit", f"{nvcli}-1",
                                      f"libnvidia-container-tools (= {nvcli}-1)"))
                held.append("nvidia-container-toolkit")
            apt.install(*pkgs, hold=tuple(held))
        return node, apt

    return make


def run(node, apt, role: str = "execute"):
    return node.run(role, extra_env=apt.env)


def apt_installs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "] run: " in line and " apt-get install " in line]


def test_held_enroot_below_the_floor_is_upgraded_and_held_again(cyclecloud_node):
    """The default floor is enroot.version: cyclecloud-slurm's held 4.0.1 is upgraded to 4.2.1 and
    held again. apt-get refuses to change a held package (exit 100, "Held packages were changed
    and -y was used without --allow-change-held-packages"), and dpkg asks about the conffile
    cyclecloud-slurm changed ("end of file on stdin at conffile prompt"): both failed before."""
    node, apt = cyclecloud_node()
    assert apt.status("enroot") == "hold ok installed|4.0.1-1"
    first = run(node, apt)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    assert apt.status("enroot") == "hold ok installed|4.2.1-1"
    assert apt.status("enroot+caps") == "hold ok installed|4.2.1-1"
    log = node.log()
    assert ("enroot: upgrading the held enroot 4.0.1 (held), enroot+caps 4.0.1 (held) to the pinned 4.2.1 "
            "(below the floor 4.2.1, lingjun_slurm.enroot.min_version)") in log
    assert "run: apt-mark unhold enroot enroot+caps" in log
    assert "changed: held again: enroot enroot+caps" in log
    assert "# enroot 4.2.1" not in node.path("/etc/enroot/enroot.conf").read_text()
    assert node.path("/etc/enroot/enroot.conf").read_text().startswith("# Managed by lingjun-slurm")
    assert node.mode("/etc/enroot/hooks.d/50-slurm-pmi.sh") == 0o755
    # the image's libnvidia-container is at least the floor (1.16.2): kept, held, not reinstalled
    assert apt.status("libnvidia-container-tools") == "hold ok installed|1.17.8-1"
    assert "nvidia-container-cli: keeping libnvidia-container-tools 1.17.8 (held)" in log
    assert [line for line in apt_installs(first.stdout) if "libnvidia" in line] == []

    again = run(node, apt)
    assert again.returncode == 0, again.stderr
    assert "enroot 4.2.1 is installed" in again.stdout
    assert apt_installs(again.stdout) == []
    assert [line for line in again.stdout.splitlines() if "] changed: " in line] == []
    assert apt.status("enroot") == "hold ok installed|4.2.1-1"


def test_held_enroot_at_the_floor_is_adopted(cyclecloud_node):
    node, apt = cyclecloud_node({"lingjun_slurm.enroot.min_version": "4.0.1"})
    result = run(node, apt)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert ("enroot: adopting the installed enroot 4.0.1 (held), enroot+caps 4.0.1 (held): at least 4.0.1 "
            "(lingjun_slurm.enroot.min_version), so the pinned 4.2.1 is not installed") in result.stdout
    assert apt.status("enroot") == "hold ok installed|4.0.1-1"
    assert apt.status("enroot+caps") == "hold ok installed|4.0.1-1"
    assert [line for line in apt_installs(result.stdout) if "enroot" in line] == []
    assert "apt-mark" not in node.log()
    assert node.mode("/etc/enroot/hooks.d/50-slurm-pytorch.sh") == 0o755


CYCLECLOUD_UBUNTU_SH = Path(__file__).resolve().parent / "fixtures" / "cyclecloud-slurm-install" / \
    "cyclecloud-slurm-4.0.9-ubuntu.sh"


def cyclecloud_reinstalls_enroot(node, apt, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """cyclecloud-slurm's ubuntu.sh as install.py reruns it (no /etc/azslurm-bins.installed, or
    one naming another Slurm version, role or a failed run): its own dpkg_pkg_install (lines 18-60
    of the fixture, run as they are) on its enroot and enroot+caps 4.0.1 files (line 153), with
    the real apt on the node's sandboxed dpkg database, stdin not a terminal (/dev/null)."""
    text = CYCLECLOUD_UBUNTU_SH.read_text()
    start, end = text.index("dpkg_pkg_install() {"), text.index("\ndependency_packages=")
    assert text.count("--allow-downgrades --allow-change-held-packages") == 1 and 'ENROOT_VERSION="4.0.1"' in text
    artifacts = tmp_path / "cyclecloud-artifacts"
    artifacts.mkdir(exist_ok=True)
    debs = [dummy_deb(artifacts, "enroot", "4.0.1-1"), dummy_deb(artifacts, "enroot+caps", "4.0.1-1", "enroot (= 4.0.1-1)")]
    script = tmp_path / "cyclecloud-dpkg-pkg-install.sh"
    script.write_text("set -e\nSLURM_VERSION=25.05.5\n" + text[start:end] + '\ndpkg_pkg_install "$1 $2"\n')
    return subprocess.run(["bash", str(script), *map(str, debs)], env=node.env(apt.env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)


def test_a_cyclecloud_rerun_over_the_upgraded_enroot_stops_at_the_conffile_prompt(cyclecloud_node, tmp_path):
    """docs/admin-guide.md, "enroot": when cyclecloud-slurm's install.py reruns ubuntu.sh, its
    dpkg_pkg_install does not find 4.0.1 installed (dpkg -l | grep 4.0.1, line 41) and puts it back
    over the held 4.2.1 (apt install -y --allow-downgrades --allow-change-held-packages, line 51).
    /etc/enroot/enroot.conf is a conffile that the node changed (cyclecloud-slurm's install.py and
    this installer both write it) and that differs between the two packages (as enroot's own
    conf/enroot.conf.in does between v4.0.1 and v4.1.2), and ubuntu.sh passes no --force-conf*
    option: dpkg asks, reads end of file, and apt exits 100, leaving enroot unconfigured; with
    set -e, ubuntu.sh stops there. With enroot.min_version = 4.0.1 (cyclecloud-slurm's enroot
    adopted) the rerun finds 4.0.1 and installs nothing."""
    node, apt = cyclecloud_node()
    assert run(node, apt).returncode == 0
    assert apt.status("enroot") == "hold ok installed|4.2.1-1"
    rerun = cyclecloud_reinstalls_enroot(node, apt, tmp_path)
    assert rerun.returncode == 100, rerun.stdout[-3000:] + rerun.stderr
    assert "The following packages need to be installed" in rerun.stdout
    assert "end of file on stdin at conffile prompt" in rerun.stdout + rerun.stderr
    assert "Successfully installed all required packages" not in rerun.stdout
    # unpacked, not configured, and no longer held (apt-mark hold, line 54, never ran)
    assert apt.status("enroot") == "install ok unpacked|4.0.1-1"
    # install.py writes /etc/azslurm-bins.installed only after a success, so the next converge
    # reruns it: "iU" is not "^[hi]i", it installs again and stops at the same prompt
    again = cyclecloud_reinstalls_enroot(node, apt, tmp_path)
    assert again.returncode == 100 and "end of file on stdin at conffile prompt" in again.stdout + again.stderr
    # the way out the admin guide gives: configure it keeping the node's enroot.conf; the rerun then
    # finds 4.0.1 and succeeds, and this installer upgrades it again
    fixed = subprocess.run(["dpkg", f"--log={node.root}/var/log/dpkg.log", "--configure", "-a", "--force-confdef",
                            "--force-confold"], env=node.env(apt.env),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert apt.status("enroot") == "install ok installed|4.0.1-1"
    assert cyclecloud_reinstalls_enroot(node, apt, tmp_path).returncode == 0
    assert run(node, apt).returncode == 0 and apt.status("enroot") == "install ok installed|4.2.1-1"

    kept, kept_apt = cyclecloud_node({"lingjun_slurm.enroot.min_version": "4.0.1"})
    assert run(kept, kept_apt).returncode == 0
    rerun = cyclecloud_reinstalls_enroot(kept, kept_apt, tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr
    assert "All required packages are already installed" in rerun.stdout
    assert kept_apt.status("enroot") == "hold ok installed|4.0.1-1"


def test_the_admin_guide_says_what_the_rerun_does():
    """docs/admin-guide.md describes the rerun as the test above shows it, citing the fixture's lines,
    and the fixture is the file its SOURCES.md names (no real apt needed)."""
    import hashlib
    sources = (CYCLECLOUD_UBUNTU_SH.parent / "SOURCES.md").read_text()
    assert hashlib.sha256(CYCLECLOUD_UBUNTU_SH.read_bytes()).hexdigest() in sources
    lines = CYCLECLOUD_UBUNTU_SH.read_text().splitlines()
    assert lines[40].strip().startswith('if ! dpkg -l | grep "^[hi]i  ${base_pkg}"')  # line 41
    assert "--allow-downgrades --allow-change-held-packages" in lines[50]  # line 51
    assert lines[53].strip() == "apt-mark hold $packages_to_hold"  # line 54
    guide = " ".join((Path(__file__).resolve().parents[2] / "docs" / "admin-guide.md").read_text().split())
    for words in ("`run_installer`, lines 256-291", "(line 41)", "--allow-change-held-packages` (line 51)",
                  "`end of file on stdin at conffile prompt`",
                  "test_a_cyclecloud_rerun_over_the_upgraded_enroot_stops_at_the_conffile_prompt",
                  "sudo dpkg --configure -a --force-confdef --force-confold"):
        assert words in guide, words


def test_unheld_old_enroot_is_upgraded_and_not_held(cyclecloud_node):
    node, apt = cyclecloud_node(hold_enroot=False)
    result = run(node, apt)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr
    assert apt.status("enroot") == "install ok installed|4.2.1-1"
    assert "apt-mark" not in node.log()


def test_held_packages_count_as_installed(cyclecloud_node):
    """lj_pkg_version takes dpkg's "hold ok installed" for installed: held extra packages are not
    installed again at every run (before, each run logged "changed: installed packages: pigz ...")."""
    node, apt = cyclecloud_node(enroot=None, held_extras=True)
    assert apt.status("pigz") == "hold ok installed|1.0-1"
    first = run(node, apt)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    installs = apt_installs(first.stdout)
    assert [line for line in installs if "enroot_4.2.1" in line], installs
    assert [line for line in installs if any(name in line for name in ("pigz", "squashfuse", "fuse-overlayfs"))] == []
    assert "installed packages: pigz" not in first.stdout
    assert apt.status("enroot") == "install ok installed|4.2.1-1"


def test_gpu_node_without_nvidia_container_cli_gets_the_pinned_packages(cyclecloud_node):
    """Not an Azure HPC image: nothing provides nvidia-container-cli, which enroot's 98-nvidia.sh
    hook needs for every GPU container. The pinned libnvidia-container1 and -tools are installed
    (real apt orders them: -tools depends on exactly its libnvidia-container1)."""
    node, apt = cyclecloud_node(enroot=None, nvcli=None)
    assert not node.path("/usr/bin/nvidia-container-cli").exists()
    first = run(node, apt)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    assert "nvidia-container-cli: installing the pinned libnvidia-container 1.20.1 (found none; floor 1.16.2)" in first.stdout
    assert apt.status("libnvidia-container1") == "install ok installed|1.20.1-1"
    assert apt.status("libnvidia-container-tools") == "install ok installed|1.20.1-1"
    assert node.mode("/usr/bin/nvidia-container-cli") == 0o755
    again = run(node, apt)
    assert again.returncode == 0, again.stderr
    assert "nvidia-container-cli: keeping libnvidia-container-tools 1.20.1" in again.stdout
    assert apt_installs(again.stdout) == []


def test_upgrade_that_a_held_package_forbids_fails_and_keeps_the_holds(cyclecloud_node):
    """The image holds nvidia-container-toolkit 1.18.0, which depends on exactly
    libnvidia-container-tools 1.18.0: raising the floor to 1.20.1 cannot upgrade -tools alone.
    Only our two packages are released for the upgrade, so apt-get refuses (exit 100) instead of
    changing or removing the toolkit; the installer says so, exits 1 and holds them again."""
    node, apt = cyclecloud_node({"lingjun_slurm.enroot.libnvidia_container_min_version": "1.20.1"},
                                enroot=None, nvcli="1.18.0", toolkit_pins_nvcli=True)
    result = run(node, apt)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    arch = deb_arch()
    assert (f"libnvidia-container: installing libnvidia-container1_1.20.1-1_{arch}.deb "
            f"libnvidia-container-tools_1.20.1-1_{arch}.deb failed (exit 100") in result.stderr
    assert "libnvidia-container1 libnvidia-container-tools are held again, as they were" in result.stderr
    for name in (*NVCLI_NAMES, "nvidia-container-toolkit"):
        assert apt.status(name) == "hold ok installed|1.18.0-1", name


# -- the pins against NVIDIA's own index (no apt needed) -----------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "packages"


def stanzas(path: Path) -> list[dict[str, str]]:
    """The stanzas of an apt Packages index (RFC 822 style; continuation lines are skipped)."""
    out = []
    for block in path.read_text().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line and not line[0].isspace():
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields:
            out.append(fields)
    return out


def test_pins_match_nvidias_index():
    from tests.cluster_init.node import PROJECT
    pins = {row[0]: row for row in (line.split("\t") for line in
            (PROJECT / "specs/default/cluster-init/files/pins.tsv").read_text().splitlines())
            if row and not row[0].startswith("#")}
    index = stanzas(FIXTURES / "libnvidia-container-1.20.1-amd64.Packages")
    assert {s["Package"] for s in index} == set(NVCLI_NAMES)
    for stanza in index:
        name = stanza["Filename"].removeprefix("./")
        _file, digest, url, source = pins[name]
        assert digest == stanza["SHA256"], name
        assert url == f"https://github.com/NVIDIA/libnvidia-container/raw/gh-pages/stable/deb/amd64/{name}"
        assert "69f4ab797b0c6df3892f9136f7c734dac72d67fe" in source


def test_toolkit_pins_its_tools_exactly():
    """What the held-toolkit test above models: the toolkit and -tools depend on exact versions."""
    from tests.cluster_init.node import DEPENDS
    tools = {s["Package"]: s for s in stanzas(FIXTURES / "libnvidia-container-1.20.1-amd64.Packages")}
    assert tools["libnvidia-container-tools"]["Depends"].startswith("libnvidia-container1 (= 1.20.1-1)")
    assert DEPENDS["libnvidia-container-tools"] == "libnvidia-container1 (= {v})"
    (toolkit,) = stanzas(FIXTURES / "nvidia-container-toolkit-1.18.0-amd64.Packages")
    assert "libnvidia-container-tools (= 1.18.0-1)" in toolkit["Depends"]
