"""The collective smoke test's step in the rendered train scripts (slurm_templates/partials/faults.sh.j2,
lingjun_slurm/plan.py fault_vars and preflight_settings): builtin and Megatron-LM (run.ship_code),
off with preflight_collective_timeout 0, its srun the train step's own, hostile strings kept out of
the shell, and shellcheck clean."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from lingjun_slurm.plan import build_plan
from lingjun_slurm.render import render_plan
from lingjun_slurm.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "eth0'; touch /tmp/pwned; echo x"


def plan_of(tmp: Path, example: str, edit=None):  # type: ignore[no-untyped-def]
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    doc["training"]["preflight"] = True
    if edit:
        edit(doc)
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return build_plan(load_spec(path).spec)


def collective_block(script: str) -> str:
    start = script.index("  collective_dir=")
    return script[start:script.index('preflight_failed "$collective_rc"', start)]


@pytest.mark.parametrize("example", ["tiny-gpt.yaml", "megatron-gpt.yaml"])
def test_the_step_runs_after_the_node_judge_with_the_train_step_s_layout(tmp_path: Path, example: str) -> None:
    def edit(doc: dict) -> None:
        doc.setdefault("run", {})["ship_code"] = True
        doc["training"]["preflight_collective_timeout"] = 90

    plan = plan_of(tmp_path, example, edit)
    faults = plan.stage("train").vars["faults"]
    assert faults["collective"] is True
    launcher = [w for w in faults["collective_launcher"] if isinstance(w, str)]
    train = [w for w in plan.stage("train").launcher if isinstance(w, str)]
    assert launcher[:3] == ["srun", "--kill-on-bad-exit=0", "--time=3"]  # ceil(90 / 60) + 1 minutes
    assert launcher[3:] == [w for w in train[1:] if not w.startswith("--kill-on-bad-exit")]
    script = render_plan(plan)["train.sbatch"]
    judge_at = script.index("-m lingjun_slurm.stages preflight-judge")
    block = collective_block(script)
    assert script.index(block) > judge_at
    assert "python3 -m lingjun_slurm.stages collective --plan \"$RUN_DIR/plan.json\" --out \"$collective_dir\"" in block
    assert "-m lingjun_slurm.stages collective-judge --plan \"$RUN_DIR/plan.json\" --out \"$collective_dir\"" in block
    assert "--ntasks-per-node=1" not in block  # the training's ranks, not one task per node
    assert script.count("preflight_failed \"$") == 2  # one function for both verdicts
    assert script.index("  collective_dir=") < script.index("launch ")  # before training
    settings = plan.settings["preflight"]["collective"]
    assert settings["timeout_s"] == 90 and settings["profile"] == plan.stage("train").network.profile


def test_zero_turns_it_off(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "tiny-gpt.yaml", lambda d: d["training"].update(preflight_collective_timeout=0))
    assert plan.stage("train").vars["faults"]["collective"] is False
    script = render_plan(plan)["train.sbatch"]
    assert "collective" not in script.split("# Pre-flight:")[1]
    assert "preflight-judge" in script


def test_the_azure_floors_and_port_reach_the_plan_with_their_sources(tmp_path: Path) -> None:
    def edit(doc: dict) -> None:
        doc["cluster"]["network"] = {"profile": "azure-nd-h100-v5"}

    settings = plan_of(tmp_path, "megatron-gpt.yaml", edit).settings["preflight"]["collective"]
    assert settings["floors"][0]["busbw_gbps"] == 460.0 and settings["floors"][0]["gpu"] == "H100"
    assert "azurehpc-health-checks" in settings["floors"][0]["source"]
    assert settings["port"]["gbps"] == 400.0 and "NDR" in settings["port"]["source"]
    assert settings["network_vars"] and all(k.startswith(("NCCL_", "UCX_", "GLOO_")) or k for k in settings["network_vars"])


def test_hostile_values_stay_in_the_plan_not_the_shell(tmp_path: Path, shellcheck: str) -> None:
    def edit(doc: dict) -> None:
        doc["cluster"]["network"].setdefault("overrides", {})["NCCL_SOCKET_IFNAME"] = HOSTILE

    plan = plan_of(tmp_path, "tiny-gpt.yaml", edit)
    assert plan.settings["preflight"]["collective"]["network_vars"]["NCCL_SOCKET_IFNAME"] == HOSTILE
    files = render_plan(plan)
    block = collective_block(files["train.sbatch"])
    assert "pwned" not in block
    json.dumps(plan.settings)  # plan.json carries it as data
    scripts = []
    for name, text in files.items():
        if name.endswith((".sh", ".sbatch")):
            (tmp_path / name).write_text(text)
            scripts.append(str(tmp_path / name))
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=bash", *scripts], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
