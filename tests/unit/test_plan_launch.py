"""Launch details of the plan (issue 12, item 4): whole-node memory with --exclusive."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.plan import build_plan
from lingjun_slurm.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def train_sbatch(tmp_path: Path, edit) -> dict[str, str | None]:
    text = edit((REPO / "examples" / "megatron-gpt.yaml").read_text())
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return dict(build_plan(load_spec(path).spec).stage("train").sbatch)


def test_exclusive_without_mem_asks_for_the_whole_node(tmp_path: Path) -> None:
    opts = train_sbatch(tmp_path, lambda t: t)
    assert "exclusive" in opts and opts["mem"] == "0"


def test_an_explicit_mem_wins(tmp_path: Path) -> None:
    opts = train_sbatch(tmp_path, lambda t: t.replace("cpus_per_task: 12,", "cpus_per_task: 12, mem: 1500G,"))
    assert opts["mem"] == "1500G"


def test_no_mem_beside_another_memory_option(tmp_path: Path) -> None:
    option = "mem-per-gpu"  # sbatch refuses --mem together with --mem-per-gpu
    opts = train_sbatch(tmp_path, lambda t: t.replace("    mail-type: FAIL\n", f"    mail-type: FAIL\n    {option}: 200G\n"))
    assert "mem" not in opts and opts[option] == "200G"


def test_not_exclusive_leaves_mem_to_slurm(tmp_path: Path) -> None:
    opts = train_sbatch(tmp_path, lambda t: t.replace("  exclusive: true\n", ""))
    assert "mem" not in opts and "exclusive" not in opts


def azure_h100(tmp_path: Path, cpu_bind: str, tasks: int = 8) -> Path:
    text = (REPO / "examples" / "megatron-gpt.yaml").read_text()
    text = text.replace("    instance_type: ml.gu7xf.8xlarge-gu108        # selects the 'lingjun' NCCL profile\n",
                        "    profile: azure-nd-h100-v5\n")
    text = text.replace("  iterations:", f"  cpu_bind: {cpu_bind!r}\n  iterations:", 1)
    if tasks != 8:
        text = text.replace("train: {nodes: 4, gpus_per_node: 8,", f"train: {{nodes: 4, gpus_per_node: {tasks},")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


def test_cpu_bind_from_the_profile_topology(tmp_path: Path) -> None:
    """Issue 12 item 4: per-task binding where the profile knows the topology (hopper.conf's CPU_BIND)."""
    plan = build_plan(load_spec(azure_h100(tmp_path, "profile")).spec)  # the example has exclusive: true
    launcher = plan.stage("train").launcher
    assert "--cpu-bind=mask_cpu:ffffff000000,ffffff000000,ffffff,ffffff," in " ".join(map(str, launcher))
    assert not any("cpu-bind" in str(w) for w in plan.stage("preprocess").launcher)


def test_cpu_bind_value_and_refusals(tmp_path: Path, capsys) -> None:
    from lingjun_slurm.cli.main import main

    plan = build_plan(load_spec(azure_h100(tmp_path, "map_ldom:0,0,0,0,1,1,1,1")).spec)
    assert "--cpu-bind=map_ldom:0,0,0,0,1,1,1,1" in plan.stage("train").launcher
    for value, expect in (("profile", "for 8 tasks per node, the train stage runs 4"),
                          ("cores; rm -rf /", "expected a value matching")):
        spec = azure_h100(tmp_path, value, tasks=4)
        with pytest.raises(SystemExit) as info:
            main(["validate", str(spec)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "training.cpu_bind" in err and expect in err, err
    lingjun = tmp_path / "l.yaml"
    lingjun.write_text((REPO / "examples" / "megatron-gpt.yaml").read_text().replace(
        "  iterations:", "  cpu_bind: profile\n  iterations:", 1))
    with pytest.raises(SystemExit):
        main(["validate", str(lingjun)])
    assert "publishes no CPU/GPU topology" in capsys.readouterr().err


def test_cpu_bind_profile_needs_whole_nodes(tmp_path: Path, capsys) -> None:
    from lingjun_slurm.cli.main import main

    spec = azure_h100(tmp_path, "profile")
    spec.write_text(spec.read_text().replace("  exclusive: true\n", ""))
    with pytest.raises(SystemExit) as info:
        main(["validate", str(spec)])
    assert info.value.code == 2 and "needs whole nodes" in capsys.readouterr().err


def test_image_stage_resources_ignore_the_training_defaults(tmp_path: Path) -> None:
    """The image job runs on the train stage's partition (its architecture, its registry
    credentials) with its own size, not cluster.defaults' mem and cpus (docs/images.md)."""
    text = (REPO / "examples" / "megatron-gpt.yaml").read_text().replace(
        '    partition: lingjun\n', '    partition: lingjun\n    mem: 1800G\n    cpus_per_task: 12\n')
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    opts = dict(build_plan(load_spec(path).spec).stage("image").sbatch)
    assert opts["partition"] == "lingjun" and opts["cpus-per-task"] == "16" and opts["mem"] == "32768M"
    assert opts["time"] == "03:00:00"


def test_staging_needs_the_shipped_code(tmp_path: Path, capsys) -> None:
    from lingjun_slurm.cli.main import main

    path = tmp_path / "spec.yaml"
    path.write_text((REPO / "examples" / "megatron-gpt.yaml").read_text().replace(
        "  workdir: /mnt/cpfs/runs/llama8b-pretrain      # shared by every node (CPFS)\n",
        "  workdir: /mnt/cpfs/runs/llama8b-pretrain\n  ship_code: false\n"))
    with pytest.raises(SystemExit) as info:
        main(["validate", str(path)])
    assert info.value.code == 2 and "container.stage" in capsys.readouterr().err
