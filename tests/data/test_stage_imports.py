"""A preprocess or merge task imports only what it needs (issue 18 item 2): numpy and the
tokenizer's package, never torch or megatron-core (data/writer.py writes the .bin/.idx format
itself). Each stage runs through its entry command's main() in a fresh interpreter, which then
reports its sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.data.helpers import TOKENIZERS, keys_for, make_plan

HEAVY = ("torch", "megatron", "transformers", "triton")

PROBE = """
import json, sys
from lingjun_slurm.injob.stages.dispatch import main
code = main(sys.argv[1:])
print("PROBE " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def run_stage(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                            "LINGJUN_PROGRESS_INTERVAL_S": "60"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, (proc.returncode, proc.stdout, proc.stderr)
    got = json.loads(lines[-1][len("PROBE "):])
    assert got["code"] == 0, proc.stderr
    return got


@pytest.mark.parametrize("name", ["null", "hf", "gpt2", "sp"])
def test_preprocess_and_merge_import_neither_torch_nor_megatron(name: str, tmp_path: Path) -> None:
    plan = make_plan(tmp_path, TOKENIZERS[name], keys_for(name), shards=2)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    for args in (["preprocess", "--plan", str(path), "--shard", "0"],
                 ["preprocess", "--plan", str(path), "--shard", "1"],
                 ["merge", "--plan", str(path)]):
        got = run_stage(args)
        heavy = [m for m in got["modules"] if m.split(".")[0] in HEAVY]
        assert heavy == [], (args, heavy[:10])
        assert "numpy" in got["modules"]
    for key in keys_for(name):
        assert (tmp_path / f"corpus_{key}_document.idx").is_file()


def test_the_data_stages_need_neither_torch_nor_megatron_core() -> None:
    from lingjun_slurm.injob.stages import runtime

    for stage in ("preprocess", "merge"):
        assert set(runtime.REQUIREMENTS[stage]) == {"numpy"}, stage
    assert {"torch", "megatron-core"} <= set(runtime.REQUIREMENTS["train"])
