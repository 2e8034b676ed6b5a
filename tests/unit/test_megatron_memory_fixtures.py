"""Internal consistency of tests/fixtures/megatron_memory (Megatron-LM's theoretical memory formulas).

Only the data is checked here (made by tools/megatron_memory_reference.py); the planner is compared
with it elsewhere.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "megatron_memory"
FILES = sorted(ROOT.glob("*.json"))
FUNCS = ("compute_weight_and_optimizer_memory", "compute_activation_memory")


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_are_fixtures():
    assert len(FILES) >= 2


def test_sources_md_names_every_file_and_every_file_exists():
    text = (ROOT / "SOURCES.md").read_text()
    named = set(re.findall(r"^\| *([\w.-]+\.json) *\|", text, re.M))
    assert named == {p.name for p in FILES}
    for p in FILES:
        data = load(p)
        row = next(l for l in text.splitlines() if l.startswith(f"| {p.name} "))
        assert data["commit"] in row and data["commit_date"] in row


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_provenance(path):
    data = load(path)
    assert data["repository"] == "https://github.com/NVIDIA/Megatron-LM"
    assert re.fullmatch(r"[0-9a-f]{40}", data["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", data["commit_date"])
    assert data["command"].startswith("tools/megatron_memory_reference.py MLM_GIT_DIR ")
    assert data["stubs"] and all({"import", "line", "stub"} <= set(s) for s in data["stubs"])
    for name in FUNCS:
        assert name in data["functions"]


def test_same_configurations_and_input_keys_across_files():
    first = load(FILES[0])
    ids = list(first["configs"])
    assert len(ids) >= 30
    keys = {cid: set(first["configs"][cid]["inputs"]) for cid in ids}
    for path in FILES[1:]:
        data = load(path)
        assert list(data["configs"]) == ids, path.name
        for cid in ids:
            assert set(data["configs"][cid]["inputs"]) == keys[cid], (path.name, cid)
            assert data["configs"][cid]["inputs"] == first["configs"][cid]["inputs"], (path.name, cid)
            assert data["configs"][cid]["context"] == first["configs"][cid]["context"], (path.name, cid)
    # every configuration has the same input keys
    assert len({frozenset(k) for k in keys.values()}) == 1


def positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_values(path):
    data = load(path)
    for cid, cfg in data["configs"].items():
        inputs = cfg["inputs"]
        for key in ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size", "kv_channels",
                    "padded_vocab_size", "seq_length", "micro_batch_size", "tensor_model_parallel_size",
                    "pipeline_model_parallel_size", "data_parallel_size", "world_size"):
            assert isinstance(inputs[key], int) and inputs[key] > 0, (cid, key)
        assert inputs["padded_vocab_size"] % (128 * inputs["tensor_model_parallel_size"]) == 0, cid
        assert inputs["world_size"] == (inputs["tensor_model_parallel_size"] * inputs["pipeline_model_parallel_size"]
                                        * inputs["data_parallel_size"] * cfg["context"]["context_parallel_size"])
        assert positive(cfg["context"]["num_microbatches"])
        for name, res in cfg["results"].items():
            assert "error" not in res, (cid, name, res.get("error"))
            if "skipped" in res:
                continue
            value = res["value"]
            values = value if isinstance(value, list) else [value]
            assert values and all(positive(v) for v in values), (cid, name, value)
            assert set(res["read"]) <= set(inputs), (cid, name, set(res["read"]) - set(inputs))
            # what it read at run time is among what its source reads (its callees included)
            assert set(res["read"]) <= set(data["functions"][name]["reads_with_callees"]) | {"hybrid_layer_pattern"}
        for name in FUNCS:
            assert name in cfg["results"], (cid, name)
        report = cfg["results"].get("report_theoretical_memory")
        if report:
            w, a, t = report["value"]
            assert w == pytest.approx(cfg["results"]["compute_weight_and_optimizer_memory"]["value"] / 2**20)
            assert t == pytest.approx(w + a)
