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
  3. with --builtin-resume: the builtin trainer (this checkout, declared as that version) 0 -> 3,
     then Megatron-LM resuming that checkpoint with default flags (no --no-load-rng) -> 6
     ("builtin_resumed"); and the builtin, on the revision's own megatron-core (its megatron/ first
     on PYTHONPATH), resuming Megatron-LM's iteration 3 -> 6 ("builtin_resumes_megatron": losses,
     or the line it failed with). --builtin-resume-only reruns just that last step on the committed
     fixtures.

--declare VERSION names the release when package_info.py says otherwise (core_v0.19.0 says 0.19.1);
the null tokenizer's --vocab-size follows it (127 up to 0.17, 128 from 0.18: 128 ids, eod 127).

OUT/REV_NAME/LAYOUT/ holds latest_checkpointed_iteration.txt, iter_0000003/ and losses.json
(each run's losses per iteration and its command); OUT/corpus_text_document.{bin,idx} is the corpus
(tests/train/helpers.py make_cross_dataset).

The child makes pretrain_gpt.py run without CUDA, and records what it changed ("shims" in
losses.json): lingjun_slurm.injob.train.cpu_compat (megatron-core's CUDA-only calls on the CPU), a device
count of 1 (so _initialize_distributed builds the model-parallel groups), torch.cuda's generator =
cpu_compat's emulated device generator (dropout draws from it, the DataLoaders' seeds from the CPU
generator, as on a GPU), null CUDA streams/events, no-op empty_cache / memory stats, no fused-kernel
build or JIT warm-up, typing.override on Python < 3.12, initialize_megatron(allow_no_cuda=True),
and the dataset index helper (megatron/core/datasets/helpers_cpp) taken from the project venv's
megatron-core when the revision's helpers.cpp is the same file, else built in the temp dir by the
revision's Makefile (pybind11 installed into --python's venv when missing). Shims only some
revisions need (fused_kernels up to 0.17) are recorded by the child as it applies them.
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
--tokenizer-type NullTokenizer --split 100,0,0 --ckpt-format torch_dist --eval-iters 0
--eval-interval 1000 --log-interval 1 --distributed-backend gloo --transformer-impl local
--no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion
--no-persist-layer-norm --use-cpu-initialization --num-workers 0 --no-create-attention-mask-in-dataloader""".split()


def vocab_argv(declared: str) -> list[str]:
    """--vocab-size for 128 ids with eod 127 (the corpus's) at that version: 127 up to 0.17, 128 from
    0.18 (NullTokenizer counts the eod inside --vocab-size; lingjun_slurm.megatron.versions)."""
    from lingjun_slurm.megatron.versions import null_vocab_arg, parse_version
    from tests.train.helpers import CROSS_VOCAB

    return ["--vocab-size", str(null_vocab_arg(CROSS_VOCAB, parse_version(declared)))]


SHIMS = [
    "lingjun_slurm.injob.train.cpu_compat.activate(force=True)",
    "torch.cuda.device_count() = 1, set_device no-op",
    "get_device_properties/capability: sm_90 (validate_args, TP > 1)",
    "torch.cuda's generator (get/set_rng_state, manual_seed[_all], initial_seed): cpu_compat's emulated "
    "device generator, which dropout draws from",
    "torch.cuda.Stream/Event/stream/current_stream: null",
    "torch.cuda.empty_cache and memory stats: no-op / 0",
    "compile_helpers, set_jit_fusion_options: no-op",
    "initialize_megatron(allow_no_cuda=True)",
    "typing.override = lambda f: f (Python < 3.12), in a sitecustomize (spawned processes too)",
    "distributed optimizer with torch Adam: lingjun_slurm.injob.train.ckpt._prime_adam_steps/_restore_adam_steps "
    "and torch.no_grad() around load_checkpoint",
]

# typing.override (Python 3.12; Megatron-LM >= 0.17 requires 3.12) only marks methods. A sitecustomize
# and not just the child: from core_v0.18.0 on megatron/training/models/{gpt,hybrid}.py import it at
# module level (main d98e8a6: gpt.py:5, hybrid.py:5), and the torch_dist save starts a
# multiprocessing Manager with the 'spawn' context (dist_checkpointing/strategies/filesystem_async.py
# get_write_results_queue, main :53-66), whose process re-imports pretrain_gpt.py as __mp_main__.
SITECUSTOMIZE = """import typing
if not hasattr(typing, "override"):
    typing.override = lambda f: f
"""

CHILD = r'''
import json, os, runpy, sys, typing, functools
applied = []  # the version-dependent shims this revision needed (beside SHIMS), into losses.json
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
from lingjun_slurm.injob.train import cpu_compat
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
try:  # core_v0.16.1 initialize.py:27 imports it and _compile_dependencies calls fused_kernels.load (:224-228);
    import megatron.legacy.fused_kernels as fk  # core_v0.17.1's initialize.py no longer does, from 0.18 it is gone
    fk.load = lambda *a, **k: None  # CUDA kernels; the run uses none (--no-masked-softmax-fusion)
    applied.append("fused_kernels.load: no-op")
except ImportError:
    pass
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
from lingjun_slurm.injob.train import ckpt as _lj
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
    if os.environ["RANK"] == "0":
        with open(f"{out}.shims.json", "w") as fh:
            json.dump(applied, fh)
    if losses:
        with open(f"{out}.rank{os.environ['RANK']}.json", "w") as fh:
            json.dump(losses, fh)
'''


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def _extract(git_dir: str, rev: str, dest: Path, py: str) -> str:
    names = [n for n in ("megatron", "pretrain_gpt.py", "gpt_builders.py", "model_provider.py")
             if _git(git_dir, "ls-tree", "--name-only", rev, n).strip()]
    archive = subprocess.run(["git", "--git-dir", git_dir, "archive", rev, *names], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    import megatron.core.datasets as ours

    ds = dest / "megatron" / "core" / "datasets"
    if (ds / "helpers.cpp").read_bytes() == (Path(ours.__file__).parent / "helpers.cpp").read_bytes():
        for so in Path(ours.__file__).parent.glob("helpers_cpp*.so"):
            shutil.copy(so, ds / so.name)
        return "helpers_cpp from the project venv's megatron-core (the revision's helpers.cpp is the same file)"
    # The revision's own helpers.cpp, built in the temp dir by its Makefile (python3-config + pybind11
    # of the interpreter that runs Megatron-LM's code)
    if subprocess.run([py, "-c", "import pybind11"], capture_output=True).returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "-q", "pybind11"], check=True)
    bindir = str(Path(py).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    inc = subprocess.run([py, "-m", "pybind11", "--includes"], check=True, capture_output=True, text=True).stdout.split()
    suffix = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                            check=True, capture_output=True, text=True).stdout.strip()
    proc = subprocess.run(["make", "-C", str(ds), f"CPPFLAGS={' '.join(inc)}", f"LIBEXT={suffix}"],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not list(ds.glob("helpers_cpp*.so")):
        sys.exit(f"{rev}: building megatron/core/datasets/helpers_cpp failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return "helpers_cpp built from the revision's helpers.cpp (make -C megatron/core/datasets, pybind11)"


def _megatron(py: str, src: Path, tmp: Path, layout: str, ckpt: Path, data: Path, extra: list[str], tag: str,
              declared: str) -> dict:
    from tests.train.helpers import free_port

    ntasks, flags = LAYOUTS[layout]
    child = tmp / "child.py"
    child.write_text(CHILD)
    out = tmp / f"losses-{layout}-{tag}"
    argv = [*CROSS_ARGV, *vocab_argv(declared), *flags, "--data-path", str(data), "--data-cache-path", str(tmp / f"cache-{layout}-{tag}"),
            "--save", str(ckpt), "--load", str(ckpt), "--train-iters", str(ITERS), *extra]
    cmd = [py, str(child), str(src), str(out), *argv]
    if ntasks > 1:
        cmd = [sys.executable, "-m", "lingjun_slurm.executors.launch", "--ntasks", str(ntasks), "--kill-on-bad-exit",
               "--", *cmd]
    site = tmp / "site"  # Python < 3.12: typing.override in every interpreter, spawned ones included
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
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
    shims_file = tmp / f"{out.name}.shims.json"
    applied = json.loads(shims_file.read_text()) if shims_file.exists() else []
    loaded = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "successfully loaded" in line]
    return {"losses": {str(k): v for k, v in sorted(losses.items(), key=lambda kv: int(kv[0]))},
            "argv": ["pretrain_gpt.py", *[a if not a.startswith(str(tmp)) else a.replace(str(tmp), "$TMP")
                                          for a in argv]], "loaded": loaded[:1], "shims": applied}


def _builtin(tmp: Path, layout: str, data: Path, declared: str) -> Path:
    from tests.train.helpers import cross_plan, run_stage, write_plan

    work = tmp / f"builtin-{layout}"
    work.mkdir()
    plan = write_plan(work, cross_plan(work, data, version=declared, **PLAN_LAYOUT[layout]))
    proc = run_stage(plan, ntasks=LAYOUTS[layout][0], timeout=600, LINGJUN_TRAIN_STOP_AT=str(SAVED_AT))
    if proc.returncode != 0:
        sys.exit(f"builtin {layout} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return work / "ckpt"


def _builtin_resume(py: str, src: Path, tmp: Path, layout: str, data: Path, declared: str, fixture: Path) -> dict:
    """The builtin (this checkout), declared as that version and running on the revision's own
    megatron-core (its megatron/ first on PYTHONPATH, as in an image that carries that Megatron-LM),
    resumes Megatron-LM's iteration 3 -> 6: its losses, or the line it failed with."""
    from tests.train.helpers import cross_plan, launch_env, losses, stage_command, write_plan

    work = tmp / f"builtin-resume-{layout}"
    work.mkdir()
    shutil.copytree(fixture, work / "ckpt", ignore=shutil.ignore_patterns("losses.json"))
    plan = write_plan(work, cross_plan(work, data, version=declared, ckpt_dir=work / "ckpt", **PLAN_LAYOUT[layout]))
    cmd = [py if c == sys.executable else c for c in stage_command(plan, LAYOUTS[layout][0])]
    env = launch_env(LAYOUTS[layout][0], PYTHONPATH=os.pathsep.join([str(tmp / "site"), str(src), str(REPO)]))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(REPO))
    (tmp / f"log-{layout}-builtin-resume.txt").write_text(proc.stdout + proc.stderr)
    record: dict = {"megatron_core": f"{src}/megatron/core".replace(str(tmp), "$TMP"), "rc": proc.returncode}
    if proc.returncode == 0:
        record["losses"] = {str(k): v for k, v in sorted(losses(work).items())}
    else:
        record["error"] = next((line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")),
                               proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")[:2000]
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("git_dir")
    ap.add_argument("rev")
    ap.add_argument("--name")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "megatron" / "checkpoints"))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--builtin-resume", action="store_true")
    ap.add_argument("--declare", help="megatron_lm.version of that revision (default: its package_info.py's)")
    ap.add_argument("--builtin-resume-only", action="store_true",
                    help="only (re)run the builtin resuming the committed checkpoints of REV on REV's megatron-core")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (logs, checkpoints) for debugging")
    a = ap.parse_args()
    from tests.train.helpers import make_cross_dataset

    commit = _git(a.git_dir, "rev-parse", a.rev + "^{commit}").strip()
    commit_date = _git(a.git_dir, "log", "-1", "--format=%cs", commit).strip()
    name = a.name or (a.rev if not all(c in "0123456789abcdef" for c in a.rev) else f"main-{commit[:12]}")
    declared = a.declare or _package_version(a.git_dir, commit)
    out = Path(a.out)
    data = make_cross_dataset(out / "corpus_text_document")
    t = tempfile.mkdtemp(prefix="lingjun-mlm-ckpt-")
    try:
        tmp = Path(t)
        src = tmp / "src"
        src.mkdir()
        shims = [*SHIMS, _extract(a.git_dir, a.rev, src, a.python)]
        python = subprocess.run([a.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                text=True, check=True).stdout.strip()
        command = f"tools/megatron_checkpoints.py MLM {a.rev} --python {a.python} --builtin-resume" + \
            (f" --declare {a.declare}" if a.declare else "")
        for layout in a.layouts.split(","):
            dest = out / name / layout
            if a.builtin_resume_only:  # the committed fixture as it is; only its builtin_resumes_megatron again
                record = json.loads((dest / "losses.json").read_text())
                (tmp / "site").mkdir(exist_ok=True)
                (tmp / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
                record["builtin_resumes_megatron"] = _builtin_resume(a.python, src, tmp, layout, data, declared, dest)
                record["builtin_resumes_megatron"]["made"] = dt.date.today().isoformat()
                (dest / "losses.json").write_text(json.dumps(record, indent=1) + "\n")
                print(layout, json.dumps(record["builtin_resumes_megatron"]), flush=True)
                continue
            ckpt = tmp / f"ckpt-{layout}"
            record: dict = {"revision": a.rev, "commit": commit, "commit_date": commit_date,
                            "declared_version": declared, "layout": layout, "saved_at": SAVED_AT,
                            "iterations": ITERS, "made": dt.date.today().isoformat(), "python": python,
                            "shims": shims, "command": command}
            record["straight"] = _megatron(a.python, src, tmp, layout, ckpt, data, ["--save-interval", "3"],
                                           "straight", declared)
            record["shims"] = [*shims, *record["straight"].pop("shims")]
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            shutil.copytree(ckpt / f"iter_{SAVED_AT:07d}", dest / f"iter_{SAVED_AT:07d}")
            (dest / "latest_checkpointed_iteration.txt").write_text(str(SAVED_AT))
            again = tmp / f"again-{layout}"
            shutil.copytree(dest, again)
            record["resumed"] = _megatron(a.python, src, tmp, layout, again, data, ["--save-interval", "1000"],
                                          "resumed", declared)
            record["resumed"].pop("shims")
            if a.builtin_resume:
                bck = _builtin(tmp, layout, data, declared)
                record["builtin_resumed"] = _megatron(a.python, src, tmp, layout, bck, data,
                                                      ["--save-interval", "1000"], "builtin", declared)
                record["builtin_resumed"].pop("shims")
                record["builtin_resumes_megatron"] = _builtin_resume(a.python, src, tmp, layout, data, declared, dest)
            (dest / "losses.json").write_text(json.dumps(record, indent=1) + "\n")
            print(layout, json.dumps({k: record[k].get("losses", record[k].get("error")) for k in
                                      ("straight", "resumed", "builtin_resumed", "builtin_resumes_megatron")
                                      if k in record}), flush=True)
    finally:
        if a.keep_tmp:
            print("kept", t)
        else:
            shutil.rmtree(t, ignore_errors=True)


def _package_version(git_dir: str, commit: str) -> str:
    """MAJOR.MINOR.PATCH of the revision's megatron/core/package_info.py (as tools/megatron_reference.py)."""
    scope: dict = {}
    info = _git(git_dir, "show", f"{commit}:megatron/core/package_info.py")
    exec(compile("\n".join(line for line in info.splitlines() if line[:5] in ("MAJOR", "MINOR", "PATCH")), "pi",
                 "exec"), scope)
    return f"{scope['MAJOR']}.{scope['MINOR']}.{scope['PATCH']}"

if __name__ == "__main__":
    main()
