"""Issue 26 item 12: `plan`'s parameter count is the trainer's. The tiny example (a null tokenizer
with vocab_size 512) is planned with the CLI and trained for two iterations from its own rendered
plan.json by the real train stage; the trainer records its parameter count in metrics.jsonl's
"start" record (train/entry.py). Before the fix `plan` counted a vocabulary of 512 (padded: 512)
where the trainer has 513 (the null tokenizer's eod, Megatron-LM's _NullTokenizer; padded: 640)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .helpers import REPO, metrics, run_stage, write_plan

EXAMPLE = REPO / "examples" / "tiny-gpt.yaml"


def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=str(REPO))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_plan_counts_the_parameters_the_trainer_builds(corpus: Path, tmp_path: Path) -> None:
    planned = json.loads(_cli("plan", str(EXAMPLE), "--json"))
    _cli("render", str(EXAMPLE), "-o", str(tmp_path / "out"), "--executor", "local")
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    plan.update(run_id="p", workdir=str(tmp_path))
    s = plan["settings"]
    s["data"]["train_prefix"] = str(corpus)  # the trainer tests' corpus: null tokenizer ids < 512, eod 512
    s["training"].update(iterations=2, lr_warmup_iters=1, eval_iters=0, eval_interval=1000, log_interval=1)
    s["checkpoint"].update(dir=str(tmp_path / "ckpt"), save_interval=1000)
    proc = run_stage(write_plan(tmp_path, plan))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    start = metrics(tmp_path / "runs" / "p", "start")[0]
    assert planned["inputs"]["padded_vocab_size"]["value"] == start["padded_vocab_size"]
    assert planned["memory"]["parameters_on_gpu"] == start["parameters"]  # TP 1, PP 1: the whole model
    assert f"{start['parameters']:,} parameters on this rank" in proc.stdout
