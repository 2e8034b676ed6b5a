"""Where enroot's and pyxis's paths go: local NVMe (RAID0 of the unused disks), else /mnt,
else /tmp; and which disks are never touched."""

from __future__ import annotations

from tests.cluster_init.node import Node


def enroot_base(node: Node) -> str:
    for line in node.path("/etc/enroot/enroot.conf").read_text().splitlines():
        if line.startswith("ENROOT_DATA_PATH "):
            return line.split()[1].rsplit("/enroot/", 1)[0]
    raise AssertionError("no ENROOT_DATA_PATH")


def test_two_or_more_nvme_disks_become_a_raid0(make_node):
    node = make_node()
    disks = node.add_nvme(4)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    calls = node.calls()
    create = [c for c in calls if c.startswith("mdadm --create")]
    assert create == ["mdadm --create /dev/md/lingjun-nvme --run --level=0 --raid-devices=4 --name=lingjun-nvme "
                      + " ".join(f"/dev/{d}" for d in disks)]
    assert "mkfs.xfs -f -q -L lingjun-nvme /dev/md/lingjun-nvme" in calls
    assert "mount -o noatime /dev/md/lingjun-nvme /mnt/nvme" in calls
    assert enroot_base(node) == "/mnt/nvme"
    assert "runtime_path=/mnt/nvme/enroot/pyxis" in node.path("/etc/slurm/plugstack.conf.d/pyxis.conf").read_text()
    assert node.mode("/mnt/nvme/enroot/cache") == 0o1777
    node.clear_calls()
    again = node.run("execute")
    assert again.returncode == 0 and "0 change(s)" in again.stdout
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]


def test_one_nvme_disk_is_formatted_without_raid(make_node):
    node = make_node()
    node.add_nvme(1)
    assert node.run("execute").returncode == 0
    calls = node.calls()
    assert not [c for c in calls if c.startswith("mdadm")]
    assert "mkfs.xfs -f -q -L lingjun-nvme /dev/nvme0n1" in calls and "mount -o noatime /dev/nvme0n1 /mnt/nvme" in calls
    assert enroot_base(node) == "/mnt/nvme"


def test_disks_in_use_or_remote_are_never_touched(make_node):
    node = make_node()
    node.add_nvme(1, model="MSFT NVMe Accelerator v1.0")       # Azure's remote OS/data disk controller
    node.mount("/dev/sdb1", "/mnt")
    for name, setup in {"nvme1n1": "partition", "nvme2n1": "holder", "nvme3n1": "mounted", "nvme4n1": "filesystem"}.items():
        base = node.path(f"/sys/block/{name}")
        (base / "device").mkdir(parents=True)
        (base / "device/model").write_text("Microsoft NVMe Direct Disk v2\n")
        (base / "holders").mkdir()
        node.path(f"/dev/{name}").write_text("")
        if setup == "partition":
            (base / f"{name}p1").mkdir()
        elif setup == "holder":
            (base / "holders/dm-0").mkdir()
        elif setup == "mounted":
            node.mount(f"/dev/{name}", "/data")
        else:
            (node.state / "fstype" / f"_dev_{name}").write_text("ext4")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]
    assert "no unused local NVMe disk" in result.stdout
    assert enroot_base(node) == "/mnt", "falls back to /mnt, a mount point"


def test_existing_nvme_mount_is_used(make_node):
    node = make_node()
    node.add_nvme(2)
    node.path("/mnt/nvme").mkdir()
    node.mount("/dev/md127", "/mnt/nvme")
    assert node.run("execute").returncode == 0
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]
    assert enroot_base(node) == "/mnt/nvme"


def test_reassembled_array_is_mounted_without_formatting(make_node):
    node = make_node()
    node.path("/dev/md").mkdir()
    node.path("/dev/md/lingjun-nvme").write_text("")
    (node.state / "fstype" / "_dev_md_lingjun-nvme").write_text("xfs")
    assert node.run("execute").returncode == 0
    calls = node.calls()
    assert "mount -o noatime /dev/md/lingjun-nvme /mnt/nvme" in calls
    assert not [c for c in calls if c.startswith(("mdadm", "mkfs"))]


def test_mnt_fallback_and_raid_disabled(make_node):
    node = make_node(config={"lingjun_slurm.storage.nvme_raid": "false"})
    node.add_nvme(2)
    node.mount("/dev/sdb1", "/mnt")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "scratch: /mnt (no local NVMe; /mnt is a mount point)" in result.stdout
    assert enroot_base(node) == "/mnt"
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]


def test_tmp_fallback_warns(make_node):
    node = make_node()
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "scratch: /tmp (no local NVMe and /mnt is not a mount point)" in result.stderr
    assert enroot_base(node) == "/tmp"


def test_configured_scratch(make_node):
    node = make_node(config={"lingjun_slurm.storage.scratch": "/local/scratch"})
    node.add_nvme(2)
    assert node.run("execute").returncode == 0
    assert enroot_base(node) == "/local/scratch"
    assert node.mode("/local/scratch/enroot/tmp") == 0o1777
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]


def reboot(node: Node) -> None:
    """What a reboot (not a deallocation) leaves: the disks and their file systems, no mounts."""
    node.path("/proc/mounts").write_text("/dev/sda1 / ext4 rw 0 0\n")


def test_single_disk_is_mounted_again_after_a_reboot(make_node):
    node = make_node()
    node.add_nvme(1)
    assert node.run("execute").returncode == 0
    conf = node.path("/etc/enroot/enroot.conf").read_text()
    reboot(node)
    node.clear_calls()
    again = node.run("execute")
    assert again.returncode == 0, again.stderr
    calls = node.calls()
    assert "mount -o noatime /dev/nvme0n1 /mnt/nvme" in calls
    assert not [c for c in calls if c.startswith(("mkfs", "mdadm"))], "its own file system is never reformatted"
    assert enroot_base(node) == "/mnt/nvme" and node.path("/etc/enroot/enroot.conf").read_text() == conf
    assert [line for line in again.stdout.splitlines() if "] changed: " in line] == [
        "[lingjun-slurm] changed: mounted /dev/nvme0n1 at /mnt/nvme"]


def test_a_foreign_file_system_is_not_taken_for_ours(make_node):
    node = make_node()
    node.add_nvme(1)
    (node.state / "fstype" / "_dev_nvme0n1").write_text("xfs")
    (node.state / "fstype" / "_dev_nvme0n1.label").write_text("data")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]
    assert enroot_base(node) == "/tmp"


def test_blkid_failing_otherwise_than_nothing_found_never_formats(make_node):
    node = make_node()
    node.add_nvme(2)
    result = node.run("execute", extra_env={"STANDIN_BLKID_RC": "8"})  # 8: ambivalent probing result
    assert result.returncode == 0, result.stderr
    assert not [c for c in node.calls() if c.startswith(("mdadm", "mkfs", "mount"))]
    assert "no unused local NVMe disk" in result.stdout


def test_configured_scratch_keeps_the_mode_of_an_existing_directory(make_node):
    node = make_node(config={"lingjun_slurm.storage.scratch": "/tmp"})
    node.path("/tmp").chmod(0o1777)
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert node.mode("/tmp") == 0o1777, "never chmod an existing /tmp (or shared scratch) to 0755"
    assert "changed: /tmp (mode" not in result.stdout
    assert enroot_base(node) == "/tmp" and node.mode("/tmp/enroot/data") == 0o1777
