"""Megatron-LM's own pretrain_gpt.py loading what `lingjun-slurm checkpoint import` wrote (issue 29),
recorded as test data (dev script; nothing of Megatron-LM is committed).

    .venv/bin/python tools/megatron_hf_import.py MLM_GIT_DIR REV [--python /tmp/mlm-venv/bin/python]
        [--declare VERSION] [--out tests/fixtures/megatron/hf_import]

For each family (gpt2: LayerNorm, exact GELU, learned positions, biases, tied embeddings; llama:
RMSNorm, SwiGLU, RoPE theta 10000, GQA 4 heads / 2 groups, untied, no biases) the tiny model of
tools/megatron_checkpoints.py (2 layers, hidden 32, ffn 128, seq 32, vocab 128 = the null tokenizer's
127 ids and eod 127) is a Hugging Face model with seeded random weights in OUT/hf/FAMILY (made once by
tests/checkpoint/hf_models.py, weights x8, then reused: the committed models are the input). For each layout
(single, tp2, pp2):

  1. import_checkpoint (lingjun_slurm/injob/checkpoint/hf/importer.py, the code behind `checkpoint
     import` and training.init_from) converts it for that TP/PP, its logits proof included;
  2. Megatron-LM's pretrain_gpt.py (the revision's, through tools/megatron_checkpoints.py's CPU child)
     trains 0 -> 6 from it, twice:
       load_finetune:         --load IMPORTED --finetune (the issue's "--load, --finetune semantics")
       pretrained_checkpoint: --pretrained-checkpoint IMPORTED with an empty --load (what the train
                              stage renders for training.init_from: plan.py, hfinit.py)
     Each records its losses and the "successfully loaded" line;
  3. the builtin trainer (this checkout, declared as that version) trains 0 -> 6 from the same
     Hugging Face model through training.init_from (hfinit.ensure -> iter_0000000 -> finetune load).

OUT/REV_NAME.json holds all of it. tests/checkpoint/test_hf_megatron_lm.py imports the committed models
again and checks the builtin's losses against Megatron-LM's recorded ones.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import megatron_checkpoints as mc  # noqa: E402  (tools/ is not a package)

HF_VOCAB = 128  # ids 0..127: the null tokenizer's 127 and its eod (127), which the corpus uses
SCALE = 8.0
LAYOUTS = ("single", "tp2", "pp2")
FAMILIES = ("gpt2", "llama")
# The families' settings beside tests/train/helpers.py CROSS_MODEL (what plan.resolve_model gives the
# trainer), and the pretrain_gpt.py flags lingjun_slurm/megatron/args.py pretrain_args renders for them
# (CROSS_ARGV already is the gpt2 family: Megatron-LM's defaults).
FAMILY_MODEL = {
    "gpt2": {"normalization": "LayerNorm", "activation": "gelu", "position_embedding": "learned_absolute",
             "rotary_base": None, "untie_embeddings": False, "bias_linear": True, "num_query_groups": 4},
    "llama": {"normalization": "RMSNorm", "activation": "swiglu", "position_embedding": "rope",
              "rotary_base": 10000, "untie_embeddings": True, "bias_linear": False, "num_query_groups": 2},
}
FAMILY_ARGV = {
    "gpt2": [],
    "llama": ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--rotary-base",
              "10000", "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--group-query-attention",
              "--num-query-groups", "2",
              # CPU: the fused RoPE is TransformerEngine's (none here); the fused bias-SwiGLU is torch.compile'd
              # (megatron/core/fusions/fused_bias_swiglu.py jit_fuser), whose inductor reads the GPU's properties
              "--no-rope-fusion", "--no-bias-swiglu-fusion"],
}
PLAN_LAYOUT = {"single": {}, "tp2": {"tensor": 2}, "pp2": {"pipeline": 2}}


def hf_settings(family: str) -> dict:
    from tests.train.helpers import CROSS_MODEL

    s = {**CROSS_MODEL, **FAMILY_MODEL[family], "vocab_size": HF_VOCAB, "hidden_dropout": 0.0,
         "attention_dropout": 0.0}
    return s


def make_hf(out: Path, family: str) -> Path:
    """OUT/hf/FAMILY: the committed model when it is there, else made (seeded) and saved."""
    dest = out / "hf" / family
    if (dest / "config.json").is_file():
        return dest
    from tests.checkpoint import hf_models

    s = hf_settings(family)
    keys = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "seq_length",
            "max_position_embeddings", "vocab_size")
    over = {k: s[k] for k in keys}
    model, _ = (hf_models.gpt2_model if family == "gpt2" else hf_models.llama_model)(seed=29, **over)
    import torch

    with torch.no_grad():  # x8 (std 0.4): a run that loaded it starts near loss 7 on the corpus, far from
        for pname, p in model.named_parameters():  # the ln 128 = 4.85 of a fresh initialization
            if not ("norm" in pname or ".ln_" in pname):
                p.mul_(SCALE)
    hf_models.save(model, dest)
    return dest


def builtin_model(family: str) -> dict:
    from tests.train.helpers import CROSS_MODEL

    return {**CROSS_MODEL, **FAMILY_MODEL[family]}


def run_builtin(tmp: Path, family: str, layout: str, hf_dir: Path, data: Path, declared: str) -> dict:
    from tests.train.helpers import cross_plan, losses, run_stage, write_plan

    work = tmp / f"builtin-{family}-{layout}"
    work.mkdir()
    plan = cross_plan(work, data, version=declared, save_interval=1000, **PLAN_LAYOUT[layout])
    plan["settings"]["model"].update(builtin_model(family))
    plan["settings"]["training"].update(init_from=f"hf:{hf_dir}", init_hf=str(hf_dir), init_dir=str(work / "hf-init"))
    path = write_plan(work, plan)
    ntasks = 2 if layout != "single" else 1
    proc = run_stage(path, ntasks=ntasks, timeout=600)
    (tmp / f"log-builtin-{family}-{layout}.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"builtin {family} {layout} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {"losses": {str(k): v for k, v in sorted(losses(work).items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("git_dir")
    ap.add_argument("rev")
    ap.add_argument("--name")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--declare")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "megatron" / "hf_import"))
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--keep-tmp", action="store_true")
    a = ap.parse_args()
    from lingjun_slurm.injob.checkpoint.hf.importer import import_checkpoint
    from tests.train.helpers import make_cross_dataset

    commit = mc._git(a.git_dir, "rev-parse", a.rev + "^{commit}").strip()
    commit_date = mc._git(a.git_dir, "log", "-1", "--format=%cs", commit).strip()
    name = a.name or (a.rev if not all(c in "0123456789abcdef" for c in a.rev) else f"main-{commit[:12]}")
    declared = a.declare or mc._package_version(a.git_dir, commit)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t = tempfile.mkdtemp(prefix="lingjun-mlm-hf-")
    try:
        tmp = Path(t)
        data = make_cross_dataset(tmp / "corpus_text_document")
        src = tmp / "src"
        src.mkdir()
        shims = [*mc.SHIMS, mc._extract(a.git_dir, a.rev, src, a.python)]
        python = subprocess.run([a.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                text=True, check=True).stdout.strip()
        record: dict = {"revision": a.rev, "commit": commit, "commit_date": commit_date, "declared_version": declared,
                        "made": dt.date.today().isoformat(), "python": python, "shims": shims,
                        "command": f"tools/megatron_hf_import.py MLM {a.rev} --python {a.python}"
                                   + (f" --declare {a.declare}" if a.declare else ""),
                        "iterations": mc.ITERS, "runs": {}}
        for family in a.families.split(","):
            hf_dir = make_hf(out, family)
            for layout in a.layouts.split(","):
                par = PLAN_LAYOUT[layout]
                imported = tmp / f"imported-{family}-{layout}"
                res = import_checkpoint(hf_dir, imported, model=builtin_model(family) | {"vocab_size": HF_VOCAB},
                                        tensor=par.get("tensor", 1), pipeline=par.get("pipeline", 1))
                run: dict = {"import": {"proof": res.to_json()["proof"], "padded_vocab": res.padded_vocab}}
                fam = FAMILY_ARGV[family]
                finetune = tmp / f"save-ft-{family}-{layout}"
                run["load_finetune"] = mc._megatron(
                    a.python, src, tmp, layout, finetune, data,
                    [*fam, "--load", str(imported), "--finetune", "--save-interval", "1000"],
                    f"{family}-ft", declared)
                empty = tmp / f"save-pc-{family}-{layout}"
                run["pretrained_checkpoint"] = mc._megatron(
                    a.python, src, tmp, layout, empty, data,
                    [*fam, "--pretrained-checkpoint", str(imported), "--save-interval", "1000"],
                    f"{family}-pc", declared)
                for k in ("load_finetune", "pretrained_checkpoint"):
                    extra = run[k].pop("shims")
                    record["shims"] += [s for s in extra if s not in record["shims"]]
                    for field in ("argv", "loaded"):
                        run[k][field] = [w.replace(str(tmp), "$TMP") for w in run[k][field]]
                run["builtin_init_from"] = run_builtin(tmp, family, layout, hf_dir, data, declared)
                record["runs"].setdefault(family, {})[layout] = run
                print(family, layout, json.dumps({k: run[k]["losses"] for k in
                                                  ("load_finetune", "pretrained_checkpoint", "builtin_init_from")}),
                      flush=True)
        (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    finally:
        if a.keep_tmp:
            print("kept", t)
        else:
            shutil.rmtree(t, ignore_errors=True)


if __name__ == "__main__":
    main()
