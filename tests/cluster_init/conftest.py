"""Fixtures for the cluster-init installer tests: dummy release artifacts and sandboxed nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster_init.node import Node, build_artifacts, write_pins

UNREACHABLE = "http://127.0.0.1:9/upstream"  # the discard port: nothing listens, nothing leaves the host


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    return build_artifacts(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture
def make_node(tmp_path, artifacts):
    """make_node(os_family="ubuntu", config={key: value}) -> a Node whose project carries test pins for the
    dummy artifacts and the artifacts themselves in files/artifacts/ (air-gapped by default)."""
    count = 0

    def factory(os_family: str = "ubuntu", config: dict[str, str] | None = None, *,
                artifacts_in_files: bool = True, missing: tuple[str, ...] = (),
                upstream: str = UNREACHABLE, real_health: bool = False) -> Node:
        nonlocal count
        count += 1
        node = Node(tmp_path / f"node{count}", os_family=os_family, real_health=real_health)
        write_pins(node.project / "specs/default/cluster-init/files/pins.tsv", artifacts, upstream, missing)
        if artifacts_in_files:
            node.put_artifacts(artifacts)
        node.config = {"lingjun_slurm.artifacts.offline": "true", **(config or {})}
        node.jetpack_extra = {"azure.metadata.compute.vmSize": "Standard_ND96isr_H100_v5"}
        return node

    return factory
