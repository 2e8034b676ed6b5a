"""Container-side paths mapped to the host side for the batch shell (issue 12, item 3)."""

from __future__ import annotations

import pytest

from lingjun_slurm.container import host_side, parse_mount, workdir_mount_problem
from lingjun_slurm.spec.models import ContainerSpec


@pytest.mark.parametrize("path,mounts,expected", [
    ("/ckpt/x", ["/lustre/ckpt:/ckpt"], "/lustre/ckpt/x"),
    ("/ckpt", ["/lustre/ckpt:/ckpt"], "/lustre/ckpt"),
    ("/ckptx/y", ["/lustre/ckpt:/ckpt"], "/ckptx/y"),           # a name prefix is not a path prefix
    ("/mnt/cpfs/a", ["/mnt/cpfs:/mnt/cpfs"], "/mnt/cpfs/a"),    # same-path mounts change nothing
    ("/data/tok", ["/srv/d:/data:ro"], "/srv/d/tok"),
    ("/opt/x", ["/srv/d:/data"], "/opt/x"),                     # not mounted: the same path on the host
    ("/a/b/c", ["/h1:/a", "/h2:/a/b"], "/h2/c"),                # the deeper mount, applied later, is seen
    ("/a/b/c", ["/h2:/a/b", "/h1:/a"], "/h1/b/c"),              # a later mount over it hides the first
    ("/ckpt/x", ["/lustre/ckpt/:/ckpt/"], "/lustre/ckpt/x"),
])
def test_host_side(path: str, mounts: list[str], expected: str) -> None:
    assert host_side(path, [parse_mount(m) for m in mounts]) == expected


def test_workdir_behind_a_foreign_mount_is_refused() -> None:
    spec = ContainerSpec(image="nvcr.io#nvidia/pytorch:25.04-py3", mounts=["/data:/data", "/lustre/w:/work"])
    index, reason = workdir_mount_problem(spec, "/work/run1")
    assert index == 1 and "/lustre/w/run1" in reason
    same = ContainerSpec(image="nvcr.io#nvidia/pytorch:25.04-py3", mounts=["/work:/work"])
    assert workdir_mount_problem(same, "/work/run1") is None
