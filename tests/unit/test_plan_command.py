"""`lingjun-slurm plan`, and validate / submit using it (issue 16 item 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm.planner import estimate as est_mod
from lingjun_slurm.presets import model_presets

from .clirun import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "megatron-gpt.yaml"
KNOWN = {"gpu": "H100-80GB", "transformer_engine": True, "vocab_size": 128256}


def _spec(tmp_path: Path, name: str = "spec.yaml", planning: dict[str, Any] | None = None,
          **sections: dict[str, Any]) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["run"]["workdir"] = doc["container"]["workdir"] = str(tmp_path / "work")
    doc["container"]["mounts"] = [f"{tmp_path}:{tmp_path}"]
    if planning is not None:
        doc["planning"] = planning
    for key, values in sections.items():
        doc.setdefault(key, {}).update(values)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _too_big(tmp_path: Path, planning: dict[str, Any] | None = None) -> Path:
    """Llama-3-8B at seq 8192, micro_batch 2, no TP, no recompute: about 129 GiB a GPU."""
    return _spec(tmp_path, planning=KNOWN if planning is None else planning,
                 parallelism={"tensor": 1, "sequence_parallel": False, "micro_batch": 2},
                 model={"seq_length": 8192, "max_position_embeddings": 8192},
                 training={"recompute": {"granularity": None}})


def test_json_has_the_pinned_shape(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "plan", str(EXAMPLE), "--json")
    assert code == 0, err
    doc = json.loads(out)
    per = doc["memory"]["per_gpu_bytes"]
    assert set(per) == {"weights", "gradients", "optimizer", "activations", "total"}
    assert all(isinstance(v, int) and v > 0 for v in per.values())
    assert per["total"] == per["weights"] + per["gradients"] + per["optimizer"] + per["activations"]
    # the Lingjun profile does not say which GPU: unknown, not guessed
    assert doc["memory"]["gpu_bytes"] is None and doc["memory"]["fits"] is None and doc["recommendation"] is None
    assert "gpu" in doc["unknown"] and doc["inputs"]["gpu"]["value"] is None
    # Llama-3-8B, TP 2: 8.03e9 parameters, half of the layers and vocab-parallel embeddings per rank
    assert per["weights"] == 2 * doc["memory"]["parameters_on_gpu"]


def test_a_known_gpu_gives_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "plan", str(_spec(tmp_path, planning=KNOWN)), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["memory"]["gpu_bytes"] == 81559 * 2 ** 20
    assert doc["memory"]["fits"] is True and doc["recommendation"] is None and doc["unknown"] == []
    assert doc["throughput"]["seconds_per_iteration"] > 0 and doc["throughput"]["gpu_hours"] > 0
    assert doc["inputs"]["gpu"]["source"] == "planning.gpu"


def test_the_profile_names_the_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, planning={"vocab_size": 128256}, cluster={"network": {"profile": "azure-nd-h200-v5"}})
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["network"].pop("instance_type", None)
    spec.write_text(yaml.safe_dump(doc))
    code, out, err = run_cli(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["inputs"]["gpu"] == {"value": "H200-141GB", "source": "network profile azure-nd-h200-v5"}


def test_the_recommendation_is_the_fewest_recompute_layers_that_fit(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    spec = _too_big(tmp_path)
    code, out, _ = run_cli(capsys, "plan", str(spec), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["memory"]["fits"] is False
    rec = doc["recommendation"]
    n = rec["recompute"]["num_layers"]
    assert rec["recompute"] == {"granularity": "full", "method": "block", "num_layers": n} and 1 <= n <= 32
    assert (rec["tensor"], rec["pipeline"]) == (1, 1) and "full recompute" in rec["reason"]
    # applied, it fits and nothing more is recommended; one layer fewer does not fit
    for layers, fits in ((n, True), (n - 1, False)):
        again = yaml.safe_load(spec.read_text())
        again["training"]["recompute"] = {"granularity": "full", "method": "block", "num_layers": layers}
        path = tmp_path / f"n{layers}.yaml"
        path.write_text(yaml.safe_dump(again))
        _, out, _ = run_cli(capsys, "plan", str(path), "--json")
        assert json.loads(out)["memory"]["fits"] is fits, layers
        if fits:
            assert json.loads(out)["recommendation"] is None


def test_when_recompute_is_not_enough_the_layout_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, planning={**KNOWN, "gpu": "A100-40GB"},
                 parallelism={"tensor": 1, "sequence_parallel": False, "micro_batch": 1})
    code, out, _ = run_cli(capsys, "plan", str(spec), "--json")
    rec = json.loads(out)["recommendation"]
    assert code == 0 and rec is not None and (rec["tensor"], rec["pipeline"]) != (1, 1)
    assert "tensor" in rec["reason"] and rec["per_gpu_bytes"] <= 40960 * 2 ** 20 * 0.9


def test_validate_warns_and_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "validate", str(_too_big(tmp_path)))
    assert code == 0 and "valid" in out
    assert err.startswith("warning: ") and "does not fit" in err and "num_layers:" in err


def test_submit_refuses_only_when_every_input_is_known(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no sbatch: the local executor, never reached
    code, out, err = run_cli(capsys, "submit", str(_too_big(tmp_path)), "--executor", "local")
    assert code == 2 and "does not fit" in err and "nothing submitted (--force submits anyway)" in err
    assert "Traceback" not in err and not (tmp_path / "work").exists()
    # an input not known here (the image's TransformerEngine): a warning, and the submit goes on
    (tmp_path / "u").mkdir()
    unsure = _too_big(tmp_path / "u", planning={"gpu": "H100-80GB", "vocab_size": 128256})
    code, out, err = run_cli(capsys, "submit", str(unsure), "--executor", "local", "--dry-run")
    assert code == 0 and "warning: " in err and "assumed, not known here: transformer_engine" in err
    code, out, err = run_cli(capsys, "submit", str(_too_big(tmp_path)), "--executor", "local", "--dry-run", "--force")
    assert code == 0 and err.startswith("warning: ") and "does not fit" in err


@pytest.mark.parametrize("preset", sorted(model_presets()))
def test_every_preset_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str], preset: str) -> None:
    seq = model_presets()[preset]["seq_length"]
    spec = _spec(tmp_path, planning=KNOWN, model={"preset": preset, "seq_length": seq, "max_position_embeddings": seq},
                 parallelism={"tensor": 1, "sequence_parallel": False, "global_batch": 32})
    code, out, err = run_cli(capsys, "plan", str(spec))
    assert code == 0, err
    for word in ("weights", "gradients", "optimizer", "activations", "total", "H100-80GB", "per iteration",
                 "checkpoint:"):
        assert word in out, (word, out)


@pytest.mark.parametrize("example", ["megatron-gpt.yaml", "tiny-gpt.yaml"])
def test_the_examples_plan(capsys: pytest.CaptureFixture[str], example: str) -> None:
    code, out, err = run_cli(capsys, "plan", str(REPO / "examples" / example))
    assert code == 0, err
    assert "total" in out and "Traceback" not in out + err


def test_no_train_stage_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "plan", str(REPO / "examples" / "command-chain.yaml"))
    assert code == 2 and err.strip().endswith("the spec has no train stage: nothing to plan")
    assert len(err.strip().splitlines()) == 1


def test_a_checkpoint_holds_every_parameter_once(tmp_path: Path) -> None:
    """14 bytes per parameter for bf16 (weights + fp32 master and Adam moments), counted once over TP and PP."""
    from lingjun_slurm.plan import build_plan
    from lingjun_slurm.spec import load_spec

    loaded = load_spec(_spec(tmp_path, planning=KNOWN, parallelism={"pipeline": 2}))
    got = est_mod.make(build_plan(loaded.spec, source="s"), loaded.spec.planning)
    params = got.checkpoint_bytes // 14
    assert got.checkpoint_bytes % 14 == 0 and 8.0e9 < params < 8.1e9  # Llama-3-8B: 8.03e9


def test_the_gpu_table_agrees_with_the_trainers_mfu_table() -> None:
    from lingjun_slurm.gpus import GPUS
    from lingjun_slurm.injob.train.metrics import peak_tflops

    for gpu in GPUS.values():
        assert peak_tflops("NVIDIA " + gpu.name.split("-")[0]) == gpu.peak_bf16_tflops, gpu.name


def test_a_cpu_train_stage_has_no_verdict_whatever_the_profile(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """gpus_per_node 0 on an H100 profile: host memory, never judged against (or refused for) a GPU."""
    spec = _spec(tmp_path, planning={"transformer_engine": True, "vocab_size": 128256},
                 cluster={"network": {"profile": "azure-nd-h100-v5"},
                          "stages": {"train": {"nodes": 1, "tasks_per_node": 2, "gpus_per_node": 0}}},
                 parallelism={"global_batch": 8}, training={"entrypoint": "builtin"})
    doc = yaml.safe_load(spec.read_text())
    doc["cluster"]["network"].pop("instance_type", None)
    spec.write_text(yaml.safe_dump(doc))
    code, out, err = run_cli(capsys, "plan", str(spec), "--json")
    got = json.loads(out)
    assert code == 0, err
    assert got["memory"]["fits"] is None and got["memory"]["gpu_bytes"] is None and got["recommendation"] is None
    assert got["inputs"]["attention"]["value"] == "local"
    code, _, err = run_cli(capsys, "validate", str(spec))
    # no fit warning for a CPU stage; the only warnings are the cluster paths absent here
    assert code == 0 and all("on this machine (it must exist on the cluster's nodes)" in line
                             for line in err.splitlines() if line.startswith("warning")), err


def test_validate_and_submit_read_no_tokenizer_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokenizers / sentencepiece packages are optional for the CLI, and with --host the files
    that count are the cluster's: validate and submit take the vocabulary from the spec or
    planning.vocab_size only, and say so; `plan` reads the files when it can, without a traceback
    when it cannot."""
    import sys

    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as on a CLI-only install
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    spec = _too_big(tmp_path, planning={"gpu": "H100-80GB", "transformer_engine": True})
    code, out, err = run_cli(capsys, "validate", str(spec))
    assert code == 0 and "does not fit" in err and "assumed, not known here: vocab_size" in err
    code, out, err = run_cli(capsys, "plan", str(spec), "--json")
    assert code == 0, err
    vocab = json.loads(out)["inputs"]["vocab_size"]
    assert "vocab_size" in json.loads(out)["unknown"] and "cannot be read here" in vocab["source"]


def test_the_recommendation_keeps_to_what_megatron_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TP divides the query groups (8 for Llama-3-8B), sequence parallel goes with TP > 1, and the
    advice, applied, validates and fits."""
    spec = _spec(tmp_path, planning={**KNOWN, "gpu": "A100-40GB"},
                 parallelism={"tensor": 1, "sequence_parallel": False, "micro_batch": 1})
    _, out, _ = run_cli(capsys, "plan", str(spec), "--json")
    rec = json.loads(out)["recommendation"]
    assert 8 % rec["tensor"] == 0 and rec["sequence_parallel"] is (rec["tensor"] > 1)
    doc = yaml.safe_load(spec.read_text())
    doc["parallelism"].update(tensor=rec["tensor"], pipeline=rec["pipeline"], sequence_parallel=rec["sequence_parallel"])
    if rec["recompute"]:
        doc["training"]["recompute"] = rec["recompute"]
    applied = tmp_path / "applied.yaml"
    applied.write_text(yaml.safe_dump(doc))
    code, out, err = run_cli(capsys, "plan", str(applied), "--json")
    assert code == 0, err
    assert json.loads(out)["memory"]["fits"] is True and json.loads(out)["recommendation"] is None


def test_the_search_bisects(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The fewest recompute layers are found in O(log layers) estimates, not one per layer."""
    from lingjun_slurm.plan import build_plan
    from lingjun_slurm.spec import load_spec

    loaded = load_spec(_too_big(tmp_path))
    i = est_mod.inputs(build_plan(loaded.spec, source="s"), loaded.spec.planning)
    calls = []
    real = est_mod.estimate
    monkeypatch.setattr(est_mod, "estimate", lambda *a, **k: calls.append(1) or real(*a, **k))
    usable = int(i.gpu.memory_bytes * 0.9)
    n, got = est_mod._fewest_block_layers(i, i.shape, i.layout, usable)
    assert got.total <= usable and len(calls) <= 6  # 32 layers: 5 or 6 probes
    assert est_mod._memory(i, est_mod.Recompute("full", "block", n - 1)).total > usable


def test_uniform_recompute_must_divide_the_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """megatron-core's uniform recompute steps num_layers at a time and asks for layers past the
    end otherwise: refused at validation, with the field."""
    spec = _spec(tmp_path, training={"recompute": {"granularity": "full", "method": "uniform", "num_layers": 5}})
    code, out, err = run_cli(capsys, "validate", str(spec))
    assert code == 2 and "training.recompute.num_layers" in err and "must divide the 32 layers" in err
