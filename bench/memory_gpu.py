"""GPU memory as `lingjun-slurm plan` predicts it against what the builtin trainer allocates (issue 16 item 3).

    python bench/memory_gpu.py [--iterations 30] [--only NAME ...] [--keep DIR]

Needs one CUDA GPU; without one it says so and exits 1 (it never measures the CPU instead).
For each configuration below it writes a spec (examples/tiny-gpt.yaml's chain: the synthetic
corpus, preprocess, merge, the builtin trainer, on one GPU, bf16, TransformerEngine's layers
when the environment has them), runs `lingjun-slurm plan --json` on it, then runs the chain with
the local executor and reads metrics.jsonl: the trainer records torch.cuda.max_memory_allocated()
with every logged step (train/loop.py), and tokens/s and MFU. It prints, per configuration, the
predicted total and the measured peak with their ratio, and tokens/s and MFU: the goal is a
ratio within 10% (the prediction leaves the CUDA context, NCCL and the allocator's temporaries
to planning.margin, so the measured peak runs a little above it). About 5 minutes on an H100/H200.

Everything is written under one temporary directory (the workdirs, $LINGJUN_STATE_DIR), removed
at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "examples" / "tiny-gpt.yaml"

# name -> (model, parallelism, training overrides)
CONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "gpt-126m-seq2048-mb4": (
        dict(preset="gpt-126m", seq_length=2048, max_position_embeddings=2048),
        dict(micro_batch=4, global_batch=8), dict(recompute={"granularity": None})),
    "gpt-1.3b-selective": (
        dict(preset="gpt-1.3b", seq_length=2048, max_position_embeddings=2048),
        dict(micro_batch=2, global_batch=4), dict(recompute={"granularity": "selective"})),
    "gpt-1.3b-full-block-12": (
        dict(preset="gpt-1.3b", seq_length=2048, max_position_embeddings=2048),
        dict(micro_batch=4, global_batch=8),
        dict(recompute={"granularity": "full", "method": "block", "num_layers": 12})),
    "llama-style-1b-gqa-rope-swiglu": (
        dict(num_layers=16, hidden_size=2048, num_attention_heads=16, num_query_groups=4, ffn_hidden_size=5632,
             seq_length=4096, max_position_embeddings=4096, normalization="RMSNorm", activation="swiglu",
             position_embedding="rope", untie_embeddings=True, bias_linear=False, hidden_dropout=0.0,
             attention_dropout=0.0),
        dict(micro_batch=1, global_batch=2), dict(recompute={"granularity": None})),
}
VOCAB = 512  # the synthetic corpus' null tokenizer; the output layer is small, as the estimate knows


def gpu_name(torch: Any) -> str:
    """The planner's GPU name for this device (by its memory, as nvidia-smi counts it)."""
    total_mib = torch.cuda.get_device_properties(0).total_memory // (1 << 20)
    from lingjun_slurm.gpus import GPUS

    best = min(GPUS.values(), key=lambda g: abs(g.memory_mib - total_mib))
    if abs(best.memory_mib - total_mib) > 0.03 * best.memory_mib:
        sys.exit(f"{torch.cuda.get_device_name(0)} ({total_mib} MiB) is not in lingjun_slurm/gpus.py: add it first")
    return best.name


def spec_for(name: str, tmp: Path, iterations: int, te: bool, gpu: str) -> Path:
    model, par, training = CONFIGS[name]
    doc = yaml.safe_load(BASE.read_text(encoding="utf-8"))
    work = tmp / name
    text = json.dumps(doc).replace("/tmp/lingjun-slurm/tiny-gpt", str(work))
    doc = json.loads(text)
    doc["run"]["name"] = name.replace(".", "-")
    doc["cluster"]["stages"]["train"] = {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 1, "cpus_per_task": 8}
    doc["model"] = {**model, "vocab_size": VOCAB}
    doc["parallelism"] = par
    doc["training"].update(precision="bf16", iterations=iterations, log_interval=1, eval_interval=10 ** 6,
                           eval_iters=0, lr=3.0e-4, min_lr=3.0e-5, lr_warmup_iters=2, **training)
    doc["checkpoint"] = {"save_interval": 10 ** 6, "keep_last": 1}
    doc["planning"] = {"gpu": gpu, "transformer_engine": te, "margin": 0.0}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def run(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def measure(name: str, spec: Path, env: dict[str, str]) -> dict[str, Any]:
    beside = Path(sys.executable).with_name("lingjun-slurm")  # the venv's console script
    cli = [str(beside) if beside.exists() else (shutil.which("lingjun-slurm") or "lingjun-slurm")]
    planned = run(cli + ["plan", str(spec), "--json"], env, 120)
    if planned.returncode:
        sys.exit(f"{name}: plan failed:\n{planned.stderr}")
    predicted = json.loads(planned.stdout)["memory"]["per_gpu_bytes"]
    chain = run(cli + ["submit", str(spec), "--executor", "local", "--force"], env, 1800)
    work = Path(yaml.safe_load(spec.read_text())["run"]["workdir"])
    records = [json.loads(line) for p in sorted(work.glob("runs/*/metrics.jsonl"))
               for line in p.read_text().splitlines()]
    steps = [r for r in records if r.get("type") == "train"]
    if chain.returncode or not steps:
        logs = "\n".join(p.read_text()[-3000:] for p in sorted(work.glob("runs/*/logs/*train*")))
        sys.exit(f"{name}: the chain failed (exit {chain.returncode}):\n{chain.stdout[-2000:]}\n{chain.stderr[-2000:]}\n"
                 f"{logs}")
    steady = steps[2:] or steps  # the first steps include warm-up and allocator growth
    peak = max(r["max_memory_allocated"] for r in steps)
    return {"name": name, "predicted": predicted, "measured_peak": peak,
            "ratio": peak / predicted["total"],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
            "mfu": statistics.median(r.get("mfu", 0.0) for r in steady)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--only", nargs="*", choices=sorted(CONFIGS))
    ap.add_argument("--keep", type=Path, help="keep the workdirs and specs in DIR")
    opts = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("memory_gpu: torch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("memory_gpu: no CUDA GPU here (torch.cuda.is_available() is False); this bench measures GPU memory "
              "and never falls back to the CPU", file=sys.stderr)
        return 1
    try:
        import transformer_engine.pytorch  # noqa: F401
        te = True
    except Exception:
        te = False
    gpu = gpu_name(torch)
    tmp = Path(tempfile.mkdtemp(prefix="lingjun-memory-gpu-")) if opts.keep is None else opts.keep
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "LINGJUN_STATE_DIR": str(tmp / "state")}
    print(f"GPU {torch.cuda.get_device_name(0)} ({gpu}); torch {torch.__version__}; TransformerEngine "
          f"{'yes' if te else 'no (local attention)'}; {opts.iterations} iterations each")
    rows = []
    try:
        for name in opts.only or list(CONFIGS):
            got = measure(name, spec_for(name, tmp, opts.iterations, te, gpu), env)
            rows.append(got)
            p = got["predicted"]
            print(f"{name:<34} predicted {p['total'] / 2**30:7.2f} GiB (w {p['weights'] / 2**30:.2f} g "
                  f"{p['gradients'] / 2**30:.2f} o {p['optimizer'] / 2**30:.2f} a {p['activations'] / 2**30:.2f}) "
                  f"measured {got['measured_peak'] / 2**30:7.2f} GiB  x{got['ratio']:.3f}  "
                  f"{got['tokens_per_s']:,.0f} tokens/s  MFU {got['mfu']:.1%}", flush=True)
    finally:
        if opts.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"largest deviation: {worst:.1%} (goal: within 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
