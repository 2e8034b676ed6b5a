"""Helpers for the trainer tests: a tiny Megatron dataset, plans, running the stage in subprocesses."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GOLDEN_PLAN = REPO / "tests" / "golden" / "expected" / "example-tiny-gpt" / "plan.json"
VOCAB = 512  # the null tokenizer's vocab_size: ids 0..511, eod 512
USED = 64  # the documents use ids 0..63 only: a tiny GPT sees the loss fall within a few steps


def _counting_corpus(prefix: Path, docs: int, seed: int, eod: int) -> Path:
    """{prefix}.bin/.idx as preprocess writes them for the null tokenizer (uint16, `eod` appended).

    Each document counts up by a small per-document stride from a random start (ids 0..USED-1):
    next-token structure a tiny GPT learns within a few steps, so a falling loss is a real signal.
    """
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for _ in range(docs):
        length = int(rng.integers(40, 160))
        start, stride = int(rng.integers(0, USED)), int(rng.integers(1, 4))
        ids = (start + stride * np.arange(length)) % USED
        builder.add_document(np.append(ids, eod).astype(np.int64), [length + 1])
    builder.finalize(f"{prefix}.idx")
    return prefix


def make_dataset(prefix: Path, docs: int = 400, seed: int = 0) -> Path:
    """The trainer tests' corpus: ids 0..63, eod VOCAB (512)."""
    return _counting_corpus(prefix, docs, seed, VOCAB)


# The settings the tests rely on, fixed here so that a change to the example spec (whose rendered
# plan.json the other fields come from) does not change what these tests train.
BASE_SETTINGS: dict[str, Any] = {
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 4,
              "ffn_hidden_size": 256, "seq_length": 64, "max_position_embeddings": 64, "vocab_size": VOCAB,
              "normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute",
              "rotary_base": None, "untie_embeddings": False, "bias_linear": True, "hidden_dropout": 0.0,
              "attention_dropout": 0.0},
    "parallelism": {"tensor": 1, "pipeline": 1, "context": 1, "sequence_parallel": False, "micro_batch": 4,
                    "global_batch": 8, "distributed_optimizer": False, "overlap_grad_reduce": False,
                    "overlap_param_gather": False},
    "training": {"entrypoint": "builtin", "iterations": 40, "lr": 1.0e-3, "min_lr": 1.0e-4,
                 "lr_decay_style": "cosine", "lr_warmup_iters": 4, "lr_decay_iters": None, "weight_decay": 0.1,
                 "clip_grad": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.95, "precision": "fp32", "seed": 1234,
                 "recompute": {"granularity": None, "method": None, "num_layers": None}, "log_interval": 5,
                 "eval_interval": 20, "eval_iters": 2, "save_grace_s": 60, "max_restarts": 3, "extra_args": []},
    "checkpoint": {"dir": "/tmp/lingjun-slurm/tiny-gpt/checkpoints", "save_interval": 20, "format": "torch_dist",
                   "keep_last": 2, "copy_to": None, "verify": True},
    "tokenizer": {"type": "null", "path": None, "vocab_file": None, "merge_file": None, "vocab_size": VOCAB},
}


def base_plan() -> dict[str, Any]:
    """The tiny-gpt example's rendered plan with BASE_SETTINGS (run tiny-gpt, workdir /tmp/lingjun-slurm/tiny-gpt)."""
    plan = copy.deepcopy(json.loads(GOLDEN_PLAN.read_text()))
    plan.update(run_id="tiny-gpt", workdir="/tmp/lingjun-slurm/tiny-gpt")
    s = plan["settings"]
    for key in ("model", "parallelism", "training", "checkpoint"):
        s[key] = copy.deepcopy(BASE_SETTINGS[key])
    s["data"].update(tokenizer=copy.deepcopy(BASE_SETTINGS["tokenizer"]), split="969,30,1",
                     train_prefix="/tmp/lingjun-slurm/tiny-gpt/data/corpus_text_document")
    return plan


def make_plan(tmp: Path, prefix: Path, *, iterations: int = 20, save_interval: int = 10, tensor: int = 1,
              pipeline: int = 1, global_batch: int = 8, micro_batch: int = 4, distributed_optimizer: bool = False,
              dropout: float = 0.0, eval_interval: int = 10, eval_iters: int = 1, log_interval: int = 5,
              run_id: str = "t", ckpt_dir: Path | None = None, **training: Any) -> dict[str, Any]:
    """base_plan(), pointed at tmp and the test dataset."""
    plan = base_plan()
    plan["run_id"] = run_id
    plan["workdir"] = str(tmp)
    s = plan["settings"]
    s["data"]["train_prefix"] = str(prefix)
    s["model"].update(hidden_dropout=dropout, attention_dropout=dropout)
    s["parallelism"].update(tensor=tensor, pipeline=pipeline, global_batch=global_batch, micro_batch=micro_batch,
                            distributed_optimizer=distributed_optimizer)
    s["training"].update(iterations=iterations, eval_interval=eval_interval, eval_iters=eval_iters,
                         log_interval=log_interval, lr_warmup_iters=2, **training)
    s["checkpoint"].update(dir=str(ckpt_dir or tmp / "ckpt"), save_interval=save_interval)
    return plan


def write_plan(tmp: Path, plan: dict[str, Any], name: str = "plan.json") -> Path:
    path = tmp / name
    path.write_text(json.dumps(plan, indent=1))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stage_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def dispatcher_wired() -> bool:
    """Whether `python -m lingjun_slurm.stages train` reaches stages/train.py yet."""
    return "train.main(" in (REPO / "lingjun_slurm" / "injob" / "stages" / "dispatch.py").read_text()


def stage_command(plan_path: Path, ntasks: int = 1) -> list[str]:
    """The command the rendered scripts run (`python3 -m lingjun_slurm.stages train --plan P`), behind
    the local launcher when ntasks > 1. Until the dispatcher calls stages/train.py, its twin
    `python -m lingjun_slurm.injob.stages.train --plan P` (same main, same __main__ guard)."""
    entry = ["lingjun_slurm.stages", "train"] if dispatcher_wired() else ["lingjun_slurm.injob.stages.train"]
    cmd = [sys.executable, "-m", *entry, "--plan", str(plan_path)]
    if ntasks > 1:
        cmd = [sys.executable, "-m", "lingjun_slurm.executors.launch", "--ntasks", str(ntasks),
               "--kill-on-bad-exit", "--", *cmd]
    return cmd


def launch_env(ntasks: int, **env: str) -> dict[str, str]:
    extra = dict(env)
    if ntasks > 1:  # what the batch script exports (the launcher is srun's stand-in)
        extra.setdefault("MASTER_ADDR", "127.0.0.1")
        extra.setdefault("MASTER_PORT", str(free_port()))
    return stage_env(**extra)


def run_stage(plan_path: Path, ntasks: int = 1, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(stage_command(plan_path, ntasks), capture_output=True, text=True, timeout=timeout,
                          env=launch_env(ntasks, **env), cwd=str(REPO))


def metrics(run_dir: Path, kind: str = "train") -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    return [r for r in (json.loads(line) for line in path.read_text().splitlines()) if r["type"] == kind]


def losses(tmp: Path, run_id: str = "t") -> dict[int, float]:
    """iteration -> loss; a later record of the same iteration (after a restart) wins."""
    return {r["iteration"]: r["loss"] for r in metrics(tmp / "runs" / run_id)}


# The tiny GPT that tools/megatron_checkpoints.py trains with Megatron-LM's pretrain_gpt.py: its
# argv (CROSS_ARGV there) and this plan describe the same run, so that checkpoints cross between
# the two trainers (tests/train/test_cross_trainer.py).
CROSS_VOCAB = 127  # null tokenizer: ids 0..126 and eod 127 (core_v0.16: --vocab-size 127 -> 128 ids)
CROSS_MODEL: dict[str, Any] = {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 4,
                               "ffn_hidden_size": 128, "seq_length": 32, "max_position_embeddings": 32,
                               "vocab_size": CROSS_VOCAB, "hidden_dropout": 0.1, "attention_dropout": 0.1}
CROSS_ITERATIONS, CROSS_SAVED_AT = 6, 3


def make_cross_dataset(prefix: Path, docs: int = 200, seed: int = 0) -> Path:
    """The corpus of the cross-trainer checkpoints (committed beside them): ids 0..63, eod 127."""
    return _counting_corpus(prefix, docs, seed, CROSS_VOCAB)


def cross_plan(tmp: Path, prefix: Path, *, tensor: int = 1, pipeline: int = 1, distributed_optimizer: bool = False,
               iterations: int = CROSS_ITERATIONS, save_interval: int = CROSS_SAVED_AT,
               ckpt_dir: Path | None = None, version: str | None = None) -> dict[str, Any]:
    plan = make_plan(tmp, prefix, iterations=iterations, save_interval=save_interval, tensor=tensor,
                     pipeline=pipeline, distributed_optimizer=distributed_optimizer, eval_interval=1000,
                     eval_iters=0, log_interval=1, ckpt_dir=ckpt_dir)
    s = plan["settings"]
    s["model"].update(CROSS_MODEL)
    s["data"].update(split="100,0,0", tokenizer={"type": "null", "path": None, "vocab_file": None,
                                                  "merge_file": None, "vocab_size": CROSS_VOCAB})
    if version:
        s["megatron_lm"] = {"version": version}
    return plan
