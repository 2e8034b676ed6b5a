"""pyxis's plugstack entry next to cyclecloud-slurm's writer of the same file, in both orders.

cyclecloud-slurm's installer rewrites <conf dir>/plugstack.conf.d/pyxis.conf on every run, with
no container_scope (so pyxis's default, global). Whichever of the two installers runs last, what
slurmd loads must be one pyxis entry with lingjun-slurm's container_scope (job unless the admin
says otherwise), plugin and runtime_path. "What slurmd loads" is computed here the way Slurm's
src/common/spank.c reads the plugstack, and "slurmd starts" runs what systemd would run first
(the ExecStartPre= lines of slurmd.service.d/*.conf).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cluster_init.node import Node
from tests.cluster_init.test_install import assert_idempotent, changes, node_test

CONF_D = "/etc/slurm/plugstack.conf.d"
OURS = "/usr/lib64/slurm/spank_pyxis.so"
THEIRS = "/opt/pyxis/spank_pyxis.so"
THEIR_RUNTIME = "/tmp/enroot/enroot-runtime"  # their scratch is /tmp/enroot when /nvme and /mnt are not mounts


def cyclecloud_writes_pyxis_conf(node: Node, interrupted: bool = False) -> None:
    """What cyclecloud-slurm's installer does to pyxis.conf on every run (Azure/cyclecloud-slurm
    049346f6, azure-slurm-install/install.py:991-997): ilib.file(dest, content=...), which
    (installlib.py:153-166) appends the content, with no final newline, to dest + ".tmp", chowns
    and chmods that, and shutil.move()s it over dest. Its pyxis is built into /opt/pyxis when
    missing (ubuntu.sh:155-163). interrupted: the process dies before the move."""
    plugin = node.path(THEIRS)
    if not plugin.exists():
        plugin.parent.mkdir(parents=True, exist_ok=True)
        plugin.write_text("cyclecloud-slurm's pyxis 0.21.0 build\n")
    enroot_scratch_dir = "/tmp/enroot"  # install.py:934-947: /nvme or /mnt when mounted, else /tmp
    pyxis_config = f"required /opt/pyxis/spank_pyxis.so runtime_path={enroot_scratch_dir}/enroot-runtime"
    dest = str(node.path(f"{CONF_D}/pyxis.conf"))
    tmp_dest = dest + ".tmp"
    with open(tmp_dest, "a") as fw:
        fw.write(pyxis_config)
    os.chmod(tmp_dest, 0o644)
    if interrupted:
        return
    shutil.move(tmp_dest, dest)


def effective_plugstack(node: Node, conf: str = "/etc/slurm/plugstack.conf") -> list[tuple[str, str, list[str], str]]:
    """(type, plugin, args, file) of each plugin line slurmd would load, in order, read as
    SchedMD/slurm src/common/spank.c (284c3b95f0) does: '#' starts a comment (306-307), fields
    split on space, tab, newline (293), the first is required|optional|include (272-285),
    `include PATTERN` loads each glob(3) match in sorted order, dot files not matched, a relative
    pattern relative to the including file (586-638); a plugin listed twice is loaded twice
    (plugin_in_list compares pointers, 242-255)."""
    entries: list[tuple[str, str, list[str], str]] = []

    def load(node_path: str) -> None:
        path = node.path(node_path)
        if not path.exists():
            return  # a missing file is an empty one (spank.c:562-570)
        for raw in path.read_text().splitlines():
            fields = raw.split("#", 1)[0].split()
            if not fields:
                continue
            kind, target, args = fields[0], fields[1], fields[2:]
            assert kind in ("required", "optional", "include"), f"{node_path}: {raw}"
            if kind == "include":
                pattern = target if target.startswith("/") else f"{os.path.dirname(node_path)}/{target}"
                root = str(node.root)
                for match in sorted(glob.glob(root + pattern)):
                    load(match[len(root):])
            else:
                entries.append((kind, target, args, node_path))

    load(conf)
    return entries


def pyxis_entries(node: Node) -> list[tuple[str, str, list[str], str]]:
    return [e for e in effective_plugstack(node) if os.path.basename(e[1]) == "spank_pyxis.so"]


def systemd_runs(node: Node, unit_dir: str, key: str) -> list[subprocess.CompletedProcess[str]]:
    """Run the KEY= commands of the unit files in UNIT_DIR (node path), as systemd would."""
    done = []
    for unit in sorted(glob.glob(str(node.path(unit_dir)))):
        for line in Path(unit).read_text().splitlines():
            if line.startswith(key + "="):
                command = line.split("=", 1)[1].lstrip("-").split()
                result = subprocess.run([str(node.path(command[0])), *command[1:]], env=node.env(),
                                        capture_output=True, text=True, timeout=30)
                assert result.returncode == 0, result.stderr
                done.append(result)
    return done


def slurmd_starts(node: Node) -> list[subprocess.CompletedProcess[str]]:
    return systemd_runs(node, "/etc/systemd/system/slurmd.service.d/*.conf", "ExecStartPre")


def pyxis_conf_changes(node: Node) -> list[subprocess.CompletedProcess[str]]:
    """lingjun-pyxis-plugstack.path fires: its PathChanged= is pyxis.conf; run its service."""
    path_unit = node.path("/etc/systemd/system/lingjun-pyxis-plugstack.path")
    assert f"PathChanged={CONF_D}/pyxis.conf\n" in path_unit.read_text()
    assert "Unit=lingjun-pyxis-plugstack.service\n" in path_unit.read_text()
    return systemd_runs(node, "/etc/systemd/system/lingjun-pyxis-plugstack.service", "ExecStart")


def assert_one_pyxis(node: Node, plugin: str, runtime_path: str, scope: str = "job") -> None:
    entries = pyxis_entries(node)
    assert len(entries) == 1, f"slurmd would load pyxis {len(entries)} times: {entries}"
    kind, path, args, _ = entries[0]
    assert (kind, path) == ("required", plugin)
    assert [a for a in args if a.startswith("runtime_path=")] == [f"runtime_path={runtime_path}"]
    assert [a for a in args if a.startswith("container_scope=")] == [f"container_scope={scope}"]


@pytest.mark.parametrize("scope", [None, "global"])
def test_ours_after_cyclecloud(make_node, scope):
    node = make_node(config={"lingjun_slurm.pyxis.container_scope": scope} if scope else {})
    node.service_running("slurmd")
    cyclecloud_writes_pyxis_conf(node)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert_one_pyxis(node, OURS, "/tmp/enroot/pyxis", scope or "job")
    assert node_test(node, "execute").returncode == 0
    assert_idempotent(node, "execute")
    before = node.snapshot()
    assert [r.stdout for r in slurmd_starts(node)] == [""], "slurmd's start re-applies the entry, changing nothing"
    assert node.snapshot() == before
    assert_one_pyxis(node, OURS, "/tmp/enroot/pyxis", scope or "job")


@pytest.mark.parametrize("scope", [None, "global"])
def test_cyclecloud_after_ours_is_undone_before_slurmd_starts(make_node, scope):
    node = make_node(config={"lingjun_slurm.pyxis.container_scope": scope} if scope else {})
    assert node.run("execute").returncode == 0
    cyclecloud_writes_pyxis_conf(node)
    assert pyxis_entries(node)[0][2] == [f"runtime_path={THEIR_RUNTIME}"], "theirs has no scope"
    node_check = node_test(node, "execute")
    assert [r.stdout for r in slurmd_starts(node)] == [f"changed: {CONF_D}/pyxis.conf\n"]
    assert node_check.returncode == 1 and "FAIL pyxis container_scope" in node_check.stdout
    assert_one_pyxis(node, OURS, "/tmp/enroot/pyxis", scope or "job")
    assert node_test(node, "execute").returncode == 0
    again = node.run("execute")
    assert again.returncode == 0 and changes(again.stdout) == []


@pytest.mark.parametrize("role", ["login", "scheduler", "execute"])
def test_cyclecloud_after_ours_is_undone_when_pyxis_conf_changes(make_node, role):
    """No slurmd on login nodes, but srun/sbatch load the plugstack there too."""
    node = make_node()
    assert node.run(role).returncode == 0
    assert "systemctl enable --now lingjun-pyxis-plugstack.path" in node.calls()
    assert node.path("/etc/systemd/system/slurmd.service.d/lingjun-pyxis.conf").exists() == (role == "execute")
    runtime = "/tmp/enroot/pyxis" if role == "execute" else "/run/pyxis"
    cyclecloud_writes_pyxis_conf(node)
    assert [r.stdout for r in pyxis_conf_changes(node)] == [f"changed: {CONF_D}/pyxis.conf\n"]
    assert_one_pyxis(node, OURS, runtime)
    assert [r.stdout for r in pyxis_conf_changes(node)] == [""], "our own write triggers the unit once more: no change"
    assert_idempotent(node, role)


@pytest.mark.parametrize("order", ["cyclecloud-first", "ours-first"])
def test_skip_mode_keeps_cyclecloud_pyxis_with_our_scope(make_node, order):
    node = make_node(config={"lingjun_slurm.pyxis.mode": "skip"})
    if order == "cyclecloud-first":
        cyclecloud_writes_pyxis_conf(node)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    if order == "ours-first":
        assert not node.path(f"{CONF_D}/pyxis.conf").exists(), "no pyxis to keep yet: nothing written"
        cyclecloud_writes_pyxis_conf(node)
        slurmd_starts(node)
    assert_one_pyxis(node, THEIRS, THEIR_RUNTIME)
    assert not node.path(OURS).exists(), "skip installs no plugin"
    assert_idempotent(node, "execute")
    cyclecloud_writes_pyxis_conf(node)  # the next boot: theirs runs again, after ours
    slurmd_starts(node)
    assert_one_pyxis(node, THEIRS, THEIR_RUNTIME)


def test_an_interrupted_cyclecloud_write_leaves_no_second_pyxis(make_node):
    """ilib.file's pyxis.conf.tmp matches the include glob: a leftover is a second pyxis entry
    (and the next ilib.file would append to it, two entries on one line)."""
    node = make_node()
    node.service_running("slurmd")
    cyclecloud_writes_pyxis_conf(node)
    cyclecloud_writes_pyxis_conf(node, interrupted=True)
    assert len(pyxis_entries(node)) == 2
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert f"changed: {CONF_D}/pyxis.conf.tmp" in result.stdout
    assert_one_pyxis(node, OURS, "/tmp/enroot/pyxis")
    assert_idempotent(node, "execute")


def test_container_scope_in_pyxis_options_is_refused(make_node):
    node = make_node(config={"lingjun_slurm.pyxis.options": "container_scope=global sbatch_support=1"})
    result = node.run("login")
    assert result.returncode == 2
    assert "lingjun_slurm.pyxis.options: container_scope is set by lingjun_slurm.pyxis.container_scope" in result.stderr
    assert not node.path(f"{CONF_D}/pyxis.conf").exists()


def test_print_shows_the_entry_and_changes_nothing(make_node):
    node = make_node(config={"lingjun_slurm.pyxis.options": "sbatch_support=0"})
    assert node.run("login").returncode == 0
    cyclecloud_writes_pyxis_conf(node)
    before = node.snapshot()
    shown = subprocess.run([str(node.path("/usr/local/sbin/lingjun-pyxis-plugstack")), "--print"], env=node.env(),
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == f"required {OURS} runtime_path=/run/pyxis container_scope=job sbatch_support=0"
    assert node.snapshot() == before
