"""Every srun of a stage asks for the stage's CPUs per task itself (lingjun_slurm/plan.py step_cpus):
Slurm 22.05/23.02's srun does not read SLURM_CPUS_PER_TASK, so `#SBATCH --cpus-per-task` alone
leaves each task 1 CPU (docs/slurm-versions.md, "CPUs per task reach every step")."""

from __future__ import annotations

from pathlib import Path

import yaml

from lingjun_slurm.plan import build_plan
from lingjun_slurm.render import render_plan
from lingjun_slurm.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def plan_of(tmp_path: Path, edit) -> object:  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((REPO / "examples" / "megatron-gpt.yaml").read_text())
    edit(doc)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return build_plan(load_spec(path).spec)


def cpus_words(stage) -> list[str]:  # type: ignore[no-untyped-def]
    return [w for w in stage.launcher if isinstance(w, str) and w.startswith(("--cpus-per-task", "-c"))]


def test_each_stage_srun_carries_its_own_cpus(tmp_path: Path) -> None:
    def edit(doc: dict) -> None:
        doc["cluster"].setdefault("stages", {})
        doc["cluster"]["stages"]["preprocess"] = {"cpus_per_task": 6}
        doc["cluster"]["stages"]["train"] = {**doc["cluster"]["stages"].get("train", {}), "cpus_per_task": 12}
    plan = plan_of(tmp_path, edit)
    assert cpus_words(plan.stage("train")) == ["--cpus-per-task=12"]
    assert cpus_words(plan.stage("preprocess")) == ["--cpus-per-task=6"]
    # The pre-flight step (one task per node) asks for the same CPUs as a training task.
    pre = plan.stage("train").vars["faults"]["preflight_launcher"]
    assert "--cpus-per-task=12" in pre
    scripts = render_plan(plan)
    assert "'--cpus-per-task=12'" in scripts["train.sbatch"] or "--cpus-per-task=12" in scripts["train.sbatch"]
    assert "#SBATCH --cpus-per-task=12" in scripts["train.sbatch"]


def test_no_cpus_per_task_no_option(tmp_path: Path) -> None:
    def edit(doc: dict) -> None:
        for res in [doc["cluster"].get("defaults", {})] + list(doc["cluster"].get("stages", {}).values()):
            res.pop("cpus_per_task", None)
    plan = plan_of(tmp_path, edit)
    assert all(cpus_words(s) == [] for s in plan.stages), [(s.name, cpus_words(s)) for s in plan.stages]


def test_the_step_keeps_the_jobs_memory(tmp_path: Path) -> None:
    """-c implies --exact, and an --exact step gets tasks x c x MemPerCPU where the job's memory
    comes from DefMemPerCPU: --mem=0 gives it the job's memory (srun.1)."""
    plan = plan_of(tmp_path, lambda doc: None)
    for name in ("preprocess", "train"):
        words = list(plan.stage(name).launcher)
        assert "--mem=0" in words and words.index("--mem=0") == words.index(cpus_words(plan.stage(name))[0]) + 1


def test_a_binding_that_names_the_nodes_cpus_takes_no_cpus_per_task(tmp_path: Path) -> None:
    """mask_cpu/map_cpu/ldom bindings name CPUs of the whole node, which an --exact step does not
    hold: the launch would fail ("CPU binding outside of job step allocation"). cores binds inside
    the step, so there -c stays (without it 22.05 gives each task one core)."""
    def with_bind(value: str):  # type: ignore[no-untyped-def]
        def edit(doc: dict) -> None:
            doc["training"]["cpu_bind"] = value
        return edit
    for value in ("mask_cpu:0xff,0xff00", "map_ldom:0,1", "ldoms"):
        train = plan_of(tmp_path, with_bind(value)).stage("train")
        assert cpus_words(train) == [] and "--mem=0" not in train.launcher and f"--cpu-bind={value}" in train.launcher
    train = plan_of(tmp_path, with_bind("cores")).stage("train")
    assert cpus_words(train) == ["--cpus-per-task=12"] and "--cpu-bind=cores" in train.launcher
