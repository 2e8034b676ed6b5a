"""The dev cluster's slurm.conf for scale (issue 31): MaxArraySize and per-node Features, and their
bad input; no cluster started (tests/cluster/test_scale64.py runs them on a real 64-node one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError
from tests.unit.clirun import run_cli


def conf_lines(tmp: Path, **kw: object) -> list[str]:
    return DevCluster(DevClusterConfig(root=tmp / "c", **kw))._slurm_conf().splitlines()  # type: ignore[arg-type]


def test_max_array_size_is_written_and_bounded(tmp_path: Path) -> None:
    assert "MaxArraySize=4001" in conf_lines(tmp_path)
    assert "MaxArraySize=0" in conf_lines(tmp_path, max_array_size=0)
    # read_config.c (slurm-22-05-8-1) errors above 4000001
    with pytest.raises(DevClusterError, match=r"max_array_size must be 0\.\.4000001"):
        DevClusterConfig(root=tmp_path / "c", max_array_size=4000002)


def test_node_features_split_the_node_lines_and_keep_each_port(tmp_path: Path) -> None:
    lines = [line for line in conf_lines(tmp_path, nodes=6, base_port=23000,
                                         node_features={"node3": ("ib", "fast"), "node4": ["ib", "fast"]})
             if line.startswith("NodeName=")]
    assert [line.split()[0] for line in lines] == ["NodeName=node[1-2]", "NodeName=node[3-4]", "NodeName=node[5-6]"]
    assert [next(w for w in line.split() if w.startswith("Port=")) for line in lines] == [
        "Port=[23200-23201]", "Port=[23202-23203]", "Port=[23204-23205]"]
    assert ["Features=ib,fast" in line for line in lines] == [False, True, False]
    one = [line for line in conf_lines(tmp_path, nodes=3, base_port=23000, node_features={"node2": ("ib",)})
           if line.startswith("NodeName=")]
    assert [line.split()[0] for line in one] == ["NodeName=node1", "NodeName=node2", "NodeName=node3"]
    assert "Port=23201" in one[1].split() and "Features=ib" in one[1].split()


def test_the_saved_shape_with_features_matches_so_a_second_up_is_a_no_op(tmp_path: Path) -> None:
    cluster = DevCluster(DevClusterConfig(root=tmp_path / "c", node_features={"node2": ("ib",)}))
    cluster.root.mkdir()
    cluster._save_state({})
    assert cluster._saved_config() == cluster._config_dict()
    assert DevCluster.from_root(cluster.root).config.node_features == {"node2": ("ib",)}


@pytest.mark.parametrize("features, message", [
    ({"node9": ("ib",)}, "node_features names 'node9', not a node of this cluster (node1..node4)"),
    ({"node2": ("i b",)}, "node_features of node2: 'i b' is not a feature name"),
    ({"node2": ("",)}, "node_features of node2: '' is not a feature name"),
])
def test_bad_node_features_are_refused_by_name(tmp_path: Path, features: dict, message: str) -> None:
    with pytest.raises(DevClusterError) as err:
        DevClusterConfig(root=tmp_path / "c", node_features=features)
    assert message in str(err.value)


@pytest.mark.parametrize("args, message", [
    (["--feature", "node9=ib"], "node_features names 'node9', not a node of this cluster"),
    (["--feature", "node2"], "expected NODE=FEATURE[,FEATURE...]"),
    (["--max-array-size", "4000002"], "4000002 is not in the range 0<=x<=4000001"),
])
def test_the_cli_says_what_is_wrong_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 args: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "dev-cluster", "up", "--root", str(tmp_path / "c"), *args)
    assert code == 2, (out, err)
    assert message in err
    assert "Traceback" not in out + err and not (tmp_path / "c").exists()
