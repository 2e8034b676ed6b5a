"""Tiny checkpoints saved by Megatron-LM's own pretrain_gpt.py on the CPU, and Megatron-LM resuming
the builtin trainer's checkpoints (dev script; its output is committed as test data).

    .venv/bin/python tools/megatron_checkpoints.py MLM_GIT_DIR REV [--python /tmp/mlm-venv/bin/python]
        [--out tests/fixtures/megatron/checkpoints] [--layouts single,dp2,tp2,pp2] [--builtin-resume]

`git archive REV megatron pretrain_gpt.py gpt_builders.py model_provider.py` goes into a temp dir
outside the repository (nothing of Megatron-LM is committed). For each layout (single: 1 process;
dp2: DP=2 with --use-distributed-optimizer; tp2: TP=2; pp2: PP=2) the script runs pretrain_gpt.py's
own __main__ (runpy) through the project's local launcher (lingjun_slurm.executors.launch, gloo)
with CROSS_ARGV, the tiny GPT of tests/train/helpers.py cross_plan() (2 layers, hidden 32, vocab
128, seq 32, dropout 0.1), on the committed corpus:

  1. 0 -> 6 uninterrupted, saving at 3 and 6: the losses of every step ("straight") and
     iter_0000003 (the fixture; iteration 6 is dropped);
  2. Megatron-LM resuming a copy of iter_0000003 with default flags -> 6 ("resumed");
  3. with --builtin-resume: the builtin trainer (this checkout) 0 -> 3, then Megatron-LM resuming
     that checkpoint with default flags (no --no-load-rng) -> 6 ("builtin_resumed").

OUT/REV_NAME/LAYOUT/ holds latest_checkpointed_iteration.txt, iter_0000003/ and losses.json
(each run's losses per iteration and its command); OUT/corpus_text_document.{bin,idx} is the corpus
(tests/train/helpers.py make_cross_dataset).

The child makes pretrain_gpt.py run without CUDA, and records what it changed ("shims" in
losses.json): lingjun_slurm.train.cpu_compat (megatron-core's CUDA-only calls on the CPU), a device
count of 1 (so _initialize_distributed builds the model-parallel groups), torch.cuda's generator =
cpu_compat's emulated device generator (dropout draws from it, the DataLoaders' seeds from the CPU
generator, as on a GPU), null CUDA streams/events, no-op empty_cache / memory stats, no fused-kernel
build or JIT warm-up, typing.override on Python < 3.12, initialize_megatron(allow_no_cuda=True),
and the dataset index helper (megatron/core/datasets/helpers_cpp) taken from the project venv's
megatron-core when the revision's helpers.cpp is the same file (else the run stops).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SAVED_AT, ITERS = 3, 6
LAYOUTS = {"single": (1, []), "dp2": (2, ["--use-distributed-optimizer"]),
           "tp2": (2, ["--tensor-model-parallel-size", "2"]), "pp2": (2, ["--pipeline-model-parallel-size", "2"])}
PLAN_LAYOUT = {"single": {}, "dp2": {"distributed_optimizer": True}, "tp2": {"tensor": 2}, "pp2": {"pipeline": 2}}

# tests/train/helpers.py cross_plan() as pretrain_gpt.py arguments (same model, schedule, data, seed)
CROSS_ARGV = """--num-layers 2 --hidden-size 32 --ffn-hidden-size 128 --num-attention-heads 4 --seq-length 32
--max-position-embeddings 32 --micro-batch-size 4 --global-batch-size 8 --lr 1e-3 --min-lr 1e-4
--lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95
--adam-eps 1e-8 --init-method-std 0.02 --seed 1234 --hidden-dropout 0.1 --attention-dropout 0.1
--tokenizer-type NullTokenizer --vocab-size 127 --split 100,0,0 --ckpt-format torch_dist --eval-iters 0
--eval-interval 1000 --log-interval 1 --distributed-backend gloo --transformer-impl local
--no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion
--no-persist-layer-norm --use-cpu-initialization --num-workers 0 --no-create-attention-mask-in-dataloader""".split()

SHIMS = [
    "lingjun_slurm.train.cpu_compat.activate(force=True)",
    "torch.cuda.device_count() = 1, set_device no-op",
    "get_device_properties/capability: sm_90 (validate_args, TP > 1)",
    "torch.cuda's generator (get/set_rng_state, manual_seed[_all], initial_seed): cpu_compat's emulated "
    "device generator, which dropout draws from",
    "torch.cuda.Stream/Event/stream/current_stream: null",
    "torch.cuda.empty_cache and memory stats: no-op / 0",
    "fused_kernels.load, compile_helpers, set_jit_fusion_options: no-op",
    "initialize_megatron(allow_no_cuda=True)",
    "typing.override = lambda f: f (Python < 3.12)",
    "distributed optimizer with torch Adam: lingjun_slurm.train.ckpt._prime_adam_steps/_restore_adam_steps "
    "and torch.no_grad() around load_checkpoint",
    "helpers_cpp from the project venv's megatron-core",
]

CHILD = r'''
import json, os, runpy, sys, typing, functools
if not hasattr(typing, "override"):
    typing.override = lambda f: f
root, out = sys.argv[1], sys.argv[2]
argv = sys.argv[3:]
# srun-style env (the project's launcher) -> torch.distributed's
for a, b in (("RANK", "SLURM_PROCID"), ("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID")):
    if b in os.environ:
        os.environ.setdefault(a, os.environ[b])
os.environ.setdefault("RANK", "0"); os.environ.setdefault("WORLD_SIZE", "1"); os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
sys.path.insert(0, root)
import torch
from lingjun_slurm.train import cpu_compat
cpu_compat.activate(force=True)
torch.cuda.device_count = lambda: 1
class _Props:  # validate_args asks for the GPU arch when TP > 1 (as tools/megatron_reference.py answers)
    major, minor, name, total_memory, multi_processor_count = 9, 0, "stand-in sm_90", 80 << 30, 132
torch.cuda.get_device_properties = lambda *a, **k: _Props()
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.set_device = lambda *a, **k: None
torch.cuda.empty_cache = lambda: None
for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
    setattr(torch.cuda, name, lambda *a, **k: 0)
import contextlib
class _NullStream:
    def __init__(self, *a, **k): pass
    def wait_stream(self, *a, **k): pass
    def synchronize(self): pass
    def record_event(self, *a, **k): return _NullEvent()
class _NullEvent:
    def __init__(self, *a, **k): pass
    def record(self, *a, **k): pass
    def synchronize(self): pass
    def wait(self, *a, **k): pass
    def elapsed_time(self, other): return 0.0
torch.cuda.Stream = _NullStream
torch.cuda.Event = _NullEvent
torch.cuda.current_stream = lambda *a, **k: _NullStream()
torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()
import megatron.core.datasets.utils as du
du.compile_helpers = lambda: None
import megatron.legacy.fused_kernels as fk
fk.load = lambda *a, **k: None  # CUDA kernels; the run uses none (--no-masked-softmax-fusion)
import megatron.training.training as T
T.set_jit_fusion_options = lambda *a, **k: None  # JIT warmup of fused CUDA ops
_init = T.initialize_megatron
T.initialize_megatron = lambda *a, **k: _init(*a, **{**k, "allow_no_cuda": True})
losses = {}
_step = T.train_step
def train_step(*a, **k):
    res = _step(*a, **k)
    loss_dict = res[0]
    if "lm loss" in loss_dict:
        from megatron.training import get_args
        losses[int(get_args().curr_iteration) + 1] = float(loss_dict["lm loss"])
    return res
T.train_step = train_step
# torch's Adam (no Apex/TE on the CPU) has no per-parameter "step" before its first step, which the
# distributed optimizer's state_dict() reads when load_checkpoint builds the loading state dict
# (distrib_optimizer.py state_dict: assert len(steps) == 1): the builtin's own workaround, around
# Megatron-LM's load_checkpoint. GPUs use TE's FusedAdam and never get here.
from lingjun_slurm.train import ckpt as _lj
_load = T.load_checkpoint
def load_checkpoint(model, optimizer, *a, **k):
    if optimizer is not None and getattr(get_args_(), "use_distributed_optimizer", False):
        _lj._prime_adam_steps(optimizer)
    with torch.no_grad():  # fp32 distributed optimizer: its main params are the leaf params (copy_ in place)
        res = _load(model, optimizer, *a, **k)
    if optimizer is not None and getattr(get_args_(), "use_distributed_optimizer", False):
        _lj._restore_adam_steps(optimizer)
    return res
def get_args_():
    from megatron.training import get_args
    return get_args()
T.load_checkpoint = load_checkpoint
sys.argv = [os.path.join(root, "pretrain_gpt.py"), *argv]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    if losses:
        with open(f"{out}.rank{os.environ['RANK']}.json", "w") as fh:
            json.dump(losses, fh)
'''


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def _extract(git_dir: str, rev: str, dest: Path) -> None:
    names = [n for n in ("megatron", "pretrain_gpt.py", "gpt_builders.py", "model_provider.py")
             if _git(git_dir, "ls-tree", "--name-only", rev, n).strip()]
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", rev, *names], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    import megatron.core.datasets as ours

    ds = dest / "megatron" / "core" / "datasets"
    if (ds / "helpers.cpp").read_bytes() != (Path(ours.__file__).parent / "helpers.cpp").read_bytes():
        sys.exit(f"{rev}: megatron/core/datasets/helpers.cpp differs from the venv's megatron-core; "
                 "build its helpers_cpp (make -C megatron/core/datasets, needs pybind11) and rerun")
    for so in Path(ours.__file__).parent.glob("helpers_cpp*.so"):
        shutil.copy(so, ds / so.name)


def _megatron(py: str, src: Path, tmp: Path, layout: str, ckpt: Path, data: Path, extra: list[str], tag: str) -> dict:
    from tests.train.helpers import free_port

    ntasks, flags = LAYOUTS[layout]
    child = tmp / "child.py"
    child.write_text(CHILD)
    out = tmp / f"losses-{layout}-{tag}"
    argv = [*CROSS_ARGV, *flags, "--data-path", str(data), "--data-cache-path", str(tmp / f"cache-{layout}-{tag}"),
            "--save", str(ckpt), "--load", str(ckpt), "--train-iters", str(ITERS), *extra]
    cmd = [py, str(child), str(src), str(out), *argv]
    if ntasks > 1:
        cmd = [sys.executable, "-m", "lingjun_slurm.executors.launch", "--ntasks", str(ntasks), "--kill-on-bad-exit",
               "--", *cmd]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": "",
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # validate_args requires it with TP > 1
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp), timeout=900)
    log = tmp / f"log-{layout}-{tag}.txt"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"Megatron-LM {layout} {tag} failed (rc {proc.returncode}); log: {log}\n{proc.stderr[-3000:]}")
    losses: dict[str, float] = {}
    for f in sorted(tmp.glob(out.name + ".rank*.json")):  # the last pipeline stage reports the loss
        losses.update(json.loads(f.read_text()))
    loaded = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "successfully loaded" in line]
    return {"losses": {str(k): v for k, v in sorted(losses.items(), key=lambda kv: int(kv[0]))},
            "argv": ["pretrain_gpt.py", *[a if not a.startswith(str(tmp)) else a.replace(str(tmp), "$TMP")
                                          for a in argv]], "loaded": loaded[:1]}


def _builtin(tmp: Path, layout: str, data: Path) -> Path:
    from tests.train.helpers import cross_plan, run_stage, write_plan

    work = tmp / f"builtin-{layout}"
    work.mkdir()
    plan = write_plan(work, cross_plan(work, data, **PLAN_LAYOUT[layout]))
    proc = run_stage(plan, ntasks=LAYOUTS[layout][0], timeout=600, LINGJUN_TRAIN_STOP_AT=str(SAVED_AT))
    if proc.returncode != 0:
        sys.exit(f"builtin {layout} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return work / "ckpt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("git_dir")
    ap.add_argument("rev")
    ap.add_argument("--name")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "megatron" / "checkpoints"))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--builtin-resume", action="store_true")
    a = ap.parse_args()
    from tests.train.helpers import make_cross_dataset

    commit = _git(a.git_dir, "rev-parse", a.rev + "^{commit}").strip()
    name = a.name or (a.rev if not all(c in "0123456789abcdef" for c in a.rev) else f"main-{commit[:12]}")
    out = Path(a.out)
    data = make_cross_dataset(out / "corpus_text_document")
    with tempfile.TemporaryDirectory(prefix="lingjun-mlm-ckpt-") as t:
        tmp = Path(t)
        src = tmp / "src"
        src.mkdir()
        _extract(a.git_dir, a.rev, src)
        for layout in a.layouts.split(","):
            dest = out / name / layout
            ckpt = tmp / f"ckpt-{layout}"
            record: dict = {"revision": a.rev, "commit": commit, "layout": layout, "saved_at": SAVED_AT,
                            "iterations": ITERS, "made": dt.date.today().isoformat(), "shims": SHIMS,
                            "command": f"tools/megatron_checkpoints.py MLM {a.rev} --python {a.python}"}
            record["straight"] = _megatron(a.python, src, tmp, layout, ckpt, data, ["--save-interval", "3"], "straight")
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            shutil.copytree(ckpt / f"iter_{SAVED_AT:07d}", dest / f"iter_{SAVED_AT:07d}")
            (dest / "latest_checkpointed_iteration.txt").write_text(str(SAVED_AT))
            again = tmp / f"again-{layout}"
            shutil.copytree(dest, again)
            record["resumed"] = _megatron(a.python, src, tmp, layout, again, data, ["--save-interval", "1000"],
                                          "resumed")
            if a.builtin_resume:
                bck = _builtin(tmp, layout, data)
                record["builtin_resumed"] = _megatron(a.python, src, tmp, layout, bck, data,
                                                      ["--save-interval", "1000"], "builtin")
            (dest / "losses.json").write_text(json.dumps(record, indent=1) + "\n")
            print(layout, json.dumps({k: record[k]["losses"] for k in ("straight", "resumed", "builtin_resumed")
                                      if k in record}))


if __name__ == "__main__":
    main()
