"""Where the image stage runs and how big it is (lingjun_slurm/plan.py image_resources; docs/images.md
"Resources"): on the train stage's partition (its architecture, its nodes' enroot credentials),
sized for enroot's parallel import (enroot v4.1.2 src/docker.sh:187, 316, 485; enroot.in:89)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from lingjun_slurm.plan import build_plan, image_resources
from lingjun_slurm.render import render_plan
from lingjun_slurm.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "megatron-gpt.yaml"


def spec_with(tmp_path: Path, **stages: dict | None) -> Path:
    """The example (train on `lingjun`, 8 tasks x 12 CPUs per node; preprocess, merge and checkpoint
    on `cpu`) with cluster.stages entries replaced (None removes one)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    for name, value in stages.items():
        if value is None:
            doc["cluster"]["stages"].pop(name, None)
        else:
            doc["cluster"]["stages"][name] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def resources(path: Path):
    return image_resources(load_spec(path).spec)


def test_by_default_the_image_stage_runs_on_the_train_partition_sized_for_an_import(tmp_path: Path) -> None:
    res = resources(EXAMPLE)
    assert res.partition == "lingjun"  # not `cpu`: another architecture / no enroot credentials there
    assert (res.cpus_per_task, res.mem, res.time_s) == (16, "32768M", 3 * 3600)
    assert (res.nodes, res.tasks_per_node, res.gpus_per_node, res.exclusive) == (1, 1, 0, False)


def test_the_rendered_image_script_asks_for_it(tmp_path: Path) -> None:
    script = render_plan(build_plan(load_spec(EXAMPLE).spec))["image.sbatch"]
    flags = dict(re.findall(r"^#SBATCH --([a-z-]+)=(.*)$", script, re.M))
    assert flags["partition"] == "lingjun" and flags["cpus-per-task"] == "16"
    assert flags["mem"] == "32768M" and flags["time"] == "03:00:00"


def test_cluster_stages_image_overrides_each(tmp_path: Path) -> None:
    res = resources(spec_with(tmp_path, image={"partition": "cpu-arm", "cpus_per_task": 32, "mem": "64G",
                                               "time": "06:00:00"}))
    assert (res.partition, res.cpus_per_task, res.mem, res.time_s) == ("cpu-arm", 32, "64G", 6 * 3600)
    res = resources(spec_with(tmp_path, image={"partition": "cpu-arm"}))
    assert (res.partition, res.cpus_per_task, res.mem) == ("cpu-arm", 16, "32768M")


def test_never_more_than_a_train_node_is_known_to_have(tmp_path: Path) -> None:
    """Train asks 2 tasks (one per GPU) x 1 CPU and 3G per node: a partition of small nodes (the test cluster's
    have 2 CPUs and 16000 MB) must still run the image job."""
    res = resources(spec_with(tmp_path, train={"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "mem": "3G"}))
    assert (res.partition, res.cpus_per_task, res.mem) == ("lingjun", 2, "3072M")
    res = resources(spec_with(tmp_path, train={"nodes": 2, "gpus_per_node": 8, "cpus_per_task": 1, "mem": "0"}))
    assert (res.cpus_per_task, res.mem) == (8, "16384M")  # --mem=0 is "all of it": no cap
