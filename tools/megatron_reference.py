"""Reference data from one Megatron-LM revision: its parsers and its verdict on our argv (dev script).

    .venv/bin/python tools/megatron_reference.py MLM_GIT_DIR REV [--name NAME] [--python PY]
        [--out tests/fixtures/megatron] [--declare VERSION]

MLM_GIT_DIR is a clone of github.com/NVIDIA/Megatron-LM (a bare git dir works); REV a tag
(core_v0.16.1) or a commit. Nothing of Megatron-LM is copied into the project: the script runs
`git archive REV megatron tools pretrain_gpt.py` into a temp dir outside the repo, puts that dir on
PYTHONPATH of a child interpreter (--python; default this one) and writes only derived data to
OUT/NAME.json:

  parsers   for pretrain_gpt.py (megatron/training/arguments.py parse_args, with pretrain_gpt's
            args_defaults), tools/preprocess_data.py (get_args) and tools/merge_datasets.py (get_args):
            every option string with its dest, action, type, nargs and choices. Taken from the live
            argparse parser (the parse call is intercepted), so flags that 0.17+ generate from config
            dataclasses (ArgumentGroupFactory) are there too. When the revision does not import,
            the script falls back to the literal add_argument calls found by AST (method: "ast",
            incomplete for those generated flags) and says so.
  variants  the argv that lingjun-slurm renders for every variant in tools/megatron_variants.py,
            with the version declared as --declare (default: the revision's own package version),
            and Megatron-LM's verdict: pretrain_gpt.py argv through parse_args + validate_args
            (WORLD_SIZE = the variant's GPUs, RANK 0, CPU only), then the tokenizer built the way
            training builds it (global_vars._build_tokenizer) with HF_HUB_OFFLINE=1;
            preprocess_data.py argv through get_args + Encoder.initializer. Each gets "pass" or
            "fail" with the exception, and the tokenizer's vocab_size / eod / padded_vocab_size and
            the ids of a sample text. A variant the tool refuses to render is "not rendered"; for
            gpt2-bpe the child also runs the argv the tool would otherwise have to render (no
            --legacy-tokenizer) and records that as "probe": the evidence for the refusal.

Python: Megatron-LM >= 0.17 declares requires-python >= 3.12. Its code imports under 3.11 except
for `typing.override` (3.12): the child installs `typing.override = lambda f: f` when it is missing
(it only marks methods) and records that shim in the output. Needs torch, six and triton importable
(triton only because megatron.core.transformer.moe imports it at module level; nothing runs on a GPU).
validate_args asks torch.cuda for the GPU's compute capability (TP/CP > 1): the child answers sm_90
(H100/H200) and records that shim too. Each variant runs with the env the rendered train stage exports.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

WORK = Path("/tmp/lingjun-megatron-reference")

CHILD = r'''
import argparse, contextlib, io, json, os, sys, traceback, typing
shims = []
if not hasattr(typing, "override"):
    typing.override = lambda f: f
    shims.append("typing.override = lambda f: f (Python < 3.12)")
import torch
class _Props:
    major, minor, name, total_memory, multi_processor_count = 9, 0, "stand-in sm_90", 80 << 30, 132
torch.cuda.get_device_properties = lambda *a, **k: _Props()
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
shims.append("torch.cuda.get_device_properties/get_device_capability report sm_90 (validate_args asks for the GPU arch)")
root = sys.argv[1]
jobs = json.loads(open(sys.argv[2]).read())
sys.path.insert(0, os.path.join(root, "tools"))
sys.path.insert(0, root)

class Captured(Exception):
    def __init__(self, parser):
        self.parser = parser

def capture(call):
    real, real_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    def grab(self, *a, **k):
        raise Captured(self)
    argparse.ArgumentParser.parse_args = grab
    argparse.ArgumentParser.parse_known_args = grab
    try:
        sys.argv = ["x"]
        call()
    except Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = real, real_known
    raise RuntimeError("no parser was built")

def describe(parser):
    out = {}
    for act in parser._actions:
        if isinstance(act, argparse._HelpAction):
            continue
        kind = type(act).__name__.lstrip("_").replace("Action", "") or "Store"
        typ = getattr(act.type, "__name__", None) if act.type is not None else None
        nargs = act.nargs if act.nargs is None or isinstance(act.nargs, (int, str)) else str(act.nargs)
        choices = None
        if act.choices is not None:
            choices = sorted(str(getattr(c, "name", c)) for c in act.choices)
        for opt in act.option_strings:
            if opt.startswith("--"):
                out[opt] = {"dest": act.dest, "action": kind, "type": typ, "nargs": nargs, "choices": choices}
    return dict(sorted(out.items()))

def last_frame(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if root in f.filename]
    if not frames:
        return None
    f = frames[-1]
    return f"{os.path.relpath(f.filename, root)}:{f.lineno}"

def failure(exc):
    if isinstance(exc, SystemExit):
        return {"verdict": "fail", "error": "argparse: " + err.getvalue().strip().splitlines()[-1]
                if err.getvalue().strip() else f"SystemExit({exc.code})", "where": None}
    msg = str(exc).strip().splitlines()
    return {"verdict": "fail", "error": f"{type(exc).__name__}: {msg[0][:400] if msg else ''}",
            "where": last_frame(exc)}

def tok_facts(tok, args):
    facts = {}
    for key in ("vocab_size", "eod"):
        try:
            facts[key] = int(getattr(tok, key))
        except Exception as exc:
            facts[key] = f"{type(exc).__name__}: {exc}"[:200]
    facts["padded_vocab_size"] = getattr(args, "padded_vocab_size", None)
    try:
        text = "1 2 3" if args.tokenizer_type == "NullTokenizer" else "hello world"
        facts["ids_of"] = {text: [int(i) for i in tok.tokenize(text)]}
    except Exception as exc:
        facts["ids_of"] = f"{type(exc).__name__}: {exc}"[:200]
    return facts

result = {"shims": shims, "parsers": {}, "variants": {}}
import megatron.training.arguments as A
result["parsers"]["pretrain_gpt.py"] = describe(capture(lambda: A.parse_args()))
import preprocess_data as P
result["parsers"]["preprocess_data.py"] = describe(capture(P.get_args))
try:
    import merge_datasets as M
    result["parsers"]["merge_datasets.py"] = describe(capture(M.get_args))
except Exception as exc:
    result["parsers"]["merge_datasets.py"] = {"error": f"{type(exc).__name__}: {exc}"}
from megatron.core import package_info
result["package_version"] = package_info.__version__
import megatron.training.global_vars as G

def run_one(job, argv):
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN"):
        os.environ.pop(key, None)
    os.environ.update(job.get("env", {}))
    os.environ.update(WORLD_SIZE=str(job["world_size"]), RANK="0", LOCAL_RANK="0")
    sys.argv = [job["script"]] + argv
    global err
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if job["script"] == "pretrain_gpt.py":
                args = A.parse_args()
                A.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            else:
                args = P.get_args()
        rec = {"verdict": "pass"}
    except BaseException as exc:
        return failure(exc)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if job["script"] == "pretrain_gpt.py":
                G._GLOBAL_TOKENIZER = None
                tok = G._build_tokenizer(args)
            else:
                enc = P.Encoder(args)
                enc.initializer()
                tok = P.Encoder.tokenizer
        rec["tokenizer"] = {"verdict": "pass", **tok_facts(tok, args)}
    except BaseException as exc:
        rec["tokenizer"] = failure(exc)
    return rec

for name, job in jobs.items():
    if "argv" in job:
        result["variants"][name] = run_one(job, job["argv"])
        continue
    rec = {"verdict": "not rendered", "error": job["error"]}
    if job.get("probe_argv"):
        # What Megatron-LM does with the only argv this tool could render instead (the reason it refuses).
        rec["probe"] = {"argv": job["probe_argv"], **run_one(job, job["probe_argv"])}
    result["variants"][name] = rec

print(json.dumps(result))
'''


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def make_tokenizer_files() -> None:
    """Tiny tokenizers at the paths tools/megatron_variants.py renders (made here, not downloaded)."""
    from tools.megatron_variants import TOK_ROOT

    root = Path(TOK_ROOT)
    text = ["the quick brown fox jumps over the lazy dog", "hello world from a tiny corpus",
            "megatron reads these files offline"] * 20
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    (root / "hf").mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "hf" / "tokenizer.json"))
    (root / "hf" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|endoftext|>"}))
    (root / "gpt2").mkdir(parents=True, exist_ok=True)
    tok.model.save(str(root / "gpt2"))
    import sentencepiece as spm

    (root / "spm").mkdir(parents=True, exist_ok=True)
    corpus = root / "spm" / "corpus.txt"
    corpus.write_text("\n".join(text))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(root / "spm" / "tok"), vocab_size=60,
                                   model_type="bpe", minloglevel=2)
    (WORK / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in text[:3]))


def static_flags(src: str) -> dict[str, dict]:
    """Literal add_argument('--x', ...) calls (the fallback when the revision does not import)."""
    out: dict[str, dict] = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            opts = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
            kw = {k.arg: k.value for k in node.keywords}
            dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else None
            choices = None
            if isinstance(kw.get("choices"), (ast.List, ast.Tuple)):
                choices = sorted(str(e.value) for e in kw["choices"].elts if isinstance(e, ast.Constant))
            action = kw["action"].value if isinstance(kw.get("action"), ast.Constant) else "store"
            typ = ast.unparse(kw["type"]) if "type" in kw else None
            nargs = kw["nargs"].value if isinstance(kw.get("nargs"), ast.Constant) else None
            for opt in opts:
                out[opt] = {"dest": dest or opts[0][2:].replace("-", "_"), "action": action, "type": typ,
                            "nargs": nargs, "choices": choices}
    return dict(sorted(out.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir")
    ap.add_argument("rev")
    ap.add_argument("--name", help="output name (default: the tag, or main-<sha12>)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for Megatron-LM's code")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "megatron"))
    ap.add_argument("--declare", help="megatron_lm.version to render with (default: the package version)")
    opts = ap.parse_args()

    from tools import megatron_variants

    sha = git(opts.git_dir, "rev-parse", f"{opts.rev}^{{commit}}")
    date = git(opts.git_dir, "log", "-1", "--format=%cI", sha)
    tags = [t for t in git(opts.git_dir, "tag", "--points-at", sha).split() if t.startswith("core_v")]
    name = opts.name or (opts.rev if opts.rev.startswith("core_v") else f"main-{sha[:12]}")
    info = git(opts.git_dir, "show", f"{sha}:megatron/core/package_info.py")
    scope: dict = {}
    exec(compile("\n".join(l for l in info.splitlines() if l[:5] in ("MAJOR", "MINOR", "PATCH")), "pi", "exec"),
         scope)
    package = f"{scope['MAJOR']}.{scope['MINOR']}.{scope['PATCH']}"
    declare = opts.declare or package

    WORK.mkdir(parents=True, exist_ok=True)
    make_tokenizer_files()
    jobs = megatron_variants.render_all(declare)
    result: dict = {
        "repository": "https://github.com/NVIDIA/Megatron-LM", "revision": opts.rev, "commit": sha,
        "commit_date": date, "tags": tags, "package_version_from_source": package, "declared_version": declare,
        "generated": dt.date.today().isoformat(),
        "command": "tools/megatron_reference.py MLM_GIT_DIR " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "python": subprocess.run([opts.python, "-c", "import sys; print(sys.version.split()[0])"],
                                 capture_output=True, text=True).stdout.strip(),
    }
    with tempfile.TemporaryDirectory(prefix="mlm-", dir="/tmp") as tmp:
        subprocess.run(f"git --git-dir={shlex.quote(opts.git_dir)} archive {sha} megatron tools pretrain_gpt.py "
                       f"| tar -x -C {shlex.quote(tmp)}", shell=True, check=True)
        jobs_file = Path(tmp) / "jobs.json"
        jobs_file.write_text(json.dumps(jobs))
        env = dict(os.environ, PYTHONPATH=tmp, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
                   PYTHONWARNINGS="ignore")
        proc = subprocess.run([opts.python, "-c", CHILD, tmp, str(jobs_file)], capture_output=True, text=True,
                              env=env, cwd=tmp, timeout=1800)
        if proc.returncode == 0:
            child = json.loads(proc.stdout.strip().splitlines()[-1])
            result.update(method="runtime", shims=child["shims"], package_version=child["package_version"],
                          parsers=child["parsers"], variants=child["variants"])
        else:
            tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
            result.update(method="ast", import_error=tail[0], parsers={
                "pretrain_gpt.py": static_flags(git(opts.git_dir, "show", f"{sha}:megatron/training/arguments.py")),
                "preprocess_data.py": static_flags(git(opts.git_dir, "show", f"{sha}:tools/preprocess_data.py")),
                "merge_datasets.py": static_flags(git(opts.git_dir, "show", f"{sha}:tools/merge_datasets.py")),
            }, variants={n: {"verdict": "not run", "error": f"revision does not import: {tail[0]}"} for n in jobs})
    for vname, job in jobs.items():
        result["variants"][vname] = {"script": job["script"], "argv": job.get("argv"),
                                     "world_size": job.get("world_size") if "argv" in job else None, **result["variants"][vname]}
    out = Path(opts.out) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    verdicts = {n: v["verdict"] + ("" if v.get("tokenizer", {}).get("verdict", "pass") == "pass" else "/tok-fail")
                for n, v in result["variants"].items()}
    print(f"{name} {sha[:12]} {result['method']}: "
          f"{sum(v == 'pass' for v in verdicts.values())}/{len(verdicts)} pass -> {out}")
    for n, v in verdicts.items():
        if v != "pass":
            print(f"  {n}: {v}: {result['variants'][n].get('error') or result['variants'][n]['tokenizer'].get('error')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
