"""Reference data from one Megatron-LM revision: its theoretical GPU-memory formulas (dev script).

    .venv/bin/python tools/megatron_memory_reference.py MLM_GIT_DIR REV [--name NAME]
        [--out tests/fixtures/megatron_memory]

MLM_GIT_DIR is a clone of github.com/NVIDIA/Megatron-LM (a bare git dir works); REV a tag
(core_v0.16.1) or a commit. Nothing of Megatron-LM is copied into the project: the script runs
`git show REV:megatron/training/theoretical_memory_usage.py` into a temp dir outside the repo
(/tmp/mlm-mem-*), loads that one file by path with importlib as a submodule of a stand-in package,
and writes only derived data to OUT/NAME.json (NAME: the tag, or main-<sha12>):

  stubs       what the file imports that cannot be imported without the rest of Megatron-LM
              (`from .utils import print_rank_0[, is_hybrid_model]`): each stand-in and what it does.
  reads       for every function of the file, the `args.X` / `getattr(args, "X", ...)` names it reads
              (from its AST, plus those of the file's functions it calls), and the names it assigns.
  defaults    every args field the configurations do not set, with Megatron-LM's default at that
              revision and where it comes from (megatron/training/arguments.py, or the config
              dataclass its ArgumentGroupFactory builds flags from), found in that revision's source.
  derived     the fields validate_args derives (kv_channels, ffn_hidden_size, data_parallel_size, ...)
              and the line of that revision that derives them; the configurations set them the same way.
  configs     for every configuration in CONFIGS below: its inputs (every args field any revision's
              file reads, set explicitly), context (what they were derived from, read by nothing),
              and for every function of the file, the return value (bytes; report_theoretical_memory
              returns MB), the args names it read at run time and the names it assigned.

Every function gets a fresh Namespace (compute_weight_and_optimizer_memory assigns num_query_groups).
Functions are called with verbose=False; report_theoretical_memory prints unconditionally and its
stdout is discarded. Nothing but return values is kept. Needs only the standard library.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import datetime as dt
import importlib.util
import inspect
import io
import json
import re
import shlex
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILE = "megatron/training/theoretical_memory_usage.py"
PKG = "_mlm_mem_ref"

# Fields the configurations leave at Megatron-LM's default: value, and how to find where it is set
# (flag in megatron/training/arguments.py, else a field of the config dataclasses its
# ArgumentGroupFactory turns into flags).
DEFAULTS: dict[str, tuple[object, str]] = {
    "group_query_attention": (False, "--group-query-attention"),
    "num_query_groups": (1, "field:num_query_groups"),          # argparse_meta default 1
    "swiglu": (False, "--swiglu"),
    "normalization": ("LayerNorm", "field:normalization"),
    "untie_embeddings_and_output_weights": (False, "--untie-embeddings-and-output-weights"),
    "use_distributed_optimizer": (False, "--use-distributed-optimizer"),
    "sequence_parallel": (False, "field:sequence_parallel"),
    "recompute_granularity": (None, "field:recompute_granularity"),
    "virtual_pipeline_model_parallel_size": (None, "derived:virtual_pipeline_model_parallel_size"),
    "add_bias_linear": (True, "field:add_bias_linear"),
    "num_experts": (None, "--num-experts"),
    "moe_layer_freq": (1, "--moe-layer-freq"),
    "moe_router_topk": (2, "field:moe_router_topk"),
    "moe_shared_expert_intermediate_size": (None, "field:moe_shared_expert_intermediate_size"),
    "moe_shared_expert_gate": (False, "field:moe_shared_expert_gate"),
    "moe_latent_size": (None, "field:moe_latent_size"),
    "expert_model_parallel_size": (1, "field:expert_model_parallel_size"),
    "mtp_num_layers": (None, "field:mtp_num_layers"),
    "multi_latent_attention": (False, "field:multi_latent_attention"),
    "q_lora_rank": (None, "--q-lora-rank"),
    "kv_lora_rank": (32, "--kv-lora-rank"),
    "qk_head_dim": (128, "--qk-head-dim"),
    "qk_pos_emb_head_dim": (64, "--qk-pos-emb-head-dim"),
    "v_head_dim": (128, "--v-head-dim"),
    "is_hybrid_model": (False, "field:is_hybrid_model"),        # read by core_v0.16.1's report
    "hybrid_layer_pattern": (None, "--hybrid-layer-pattern"),  # read by the is_hybrid_model stub
}

# Fields validate_args derives; the configurations compute them the same way (regex for the line).
DERIVED: dict[str, tuple[str, str]] = {
    "kv_channels": ("hidden_size // num_attention_heads when not given",
                    r"args\.kv_channels = args\.hidden_size // args\.num_attention_heads"),
    "ffn_hidden_size": ("4 * hidden_size when not given (swiglu: int((4*h*2/3)/64)*64; "
                        "the configurations give it)", r"args\.ffn_hidden_size = 4 \* args\.hidden_size"),
    "moe_ffn_hidden_size": ("ffn_hidden_size when not given",
                            r"args\.moe_ffn_hidden_size = args\.ffn_hidden_size"),
    "expert_tensor_parallel_size": ("tensor_model_parallel_size when not given",
                                    r"args\.expert_tensor_parallel_size = args\.tensor_model_parallel_size"),
    "data_parallel_size": ("world_size // (tensor * pipeline * context parallel size)",
                           r"args\.data_parallel_size = args\.world_size // total_model_size"),
    "world_size": ("int(os.getenv('WORLD_SIZE', '1')); here tp * pp * cp * dp",
                   r"args\.world_size = int\(os\.getenv\(\"WORLD_SIZE\""),
    "virtual_pipeline_model_parallel_size": (
        "None unless --num-layers-per-virtual-pipeline-stage / --num-virtual-stages-per-pipeline-rank; "
        "then (num_layers // pp) // num_layers_per_virtual_pipeline_stage",
        r"args\.virtual_pipeline_model_parallel_size = num_layers_per_pipeline_stage // "),
    "padded_vocab_size": ("_vocab_size_with_padding: vocab_size rounded up to a multiple of "
                          "make_vocab_size_divisible_by * tensor_model_parallel_size",
                          r"multiple = (args\.)?make_vocab_size_divisible_by \* (args\.)?tensor_model_parallel_size"),
}
DERIVED_FILES = ("megatron/training/arguments.py", "megatron/training/tokenizer/tokenizer.py",
                 "megatron/training/vocab_utils.py", "megatron/core/tokenizers/utils/build_tokenizer.py")
CONFIG_FILES = ("megatron/core/transformer/transformer_config.py", "megatron/core/model_parallel_config.py")

VOCAB = 50257
DIVISIBLE_BY = 128  # --make-vocab-size-divisible-by default


def padded_vocab(vocab: int, tp: int, divisible_by: int = DIVISIBLE_BY) -> int:
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


# Model shapes. ffn given explicitly (GPT: 4h; Llama-like: swiglu + RMSNorm + untied).
SHAPES = {
    "s": dict(hidden_size=1024, num_layers=24, num_attention_heads=16, ffn_hidden_size=4096),
    "b": dict(hidden_size=2048, num_layers=24, num_attention_heads=16, ffn_hidden_size=8192),
    "g7": dict(hidden_size=4096, num_layers=32, num_attention_heads=32, ffn_hidden_size=16384),
    "l7": dict(hidden_size=4096, num_layers=32, num_attention_heads=32, ffn_hidden_size=11008, swiglu=True,
               normalization="RMSNorm", untie_embeddings_and_output_weights=True),
    "l70": dict(hidden_size=8192, num_layers=80, num_attention_heads=64, ffn_hidden_size=28672, swiglu=True,
                normalization="RMSNorm", untie_embeddings_and_output_weights=True, group_query_attention=True,
                num_query_groups=8),
    "x175": dict(hidden_size=12288, num_layers=96, num_attention_heads=96, ffn_hidden_size=49152),
    "moe": dict(hidden_size=4096, num_layers=32, num_attention_heads=32, ffn_hidden_size=14336, swiglu=True,
                normalization="RMSNorm", untie_embeddings_and_output_weights=True, group_query_attention=True,
                num_query_groups=8, num_experts=8, moe_router_topk=2),
}

# id: shape, then what the configuration sets. P = parallel layout (tp, pp, dp), seq, mbs, nmb
# (num_microbatches); vp_layers = --num-layers-per-virtual-pipeline-stage.
CONFIGS: dict[str, dict] = {
    "s_tp1_pp1_dp1":          dict(shape="s", tp=1, pp=1, dp=1, seq=2048, mbs=4, nmb=1),
    "s_dp8":                  dict(shape="s", tp=1, pp=1, dp=8, seq=2048, mbs=4, nmb=4),
    "s_dp8_distopt":          dict(shape="s", tp=1, pp=1, dp=8, seq=2048, mbs=4, nmb=4, use_distributed_optimizer=True),
    "s_dp64_distopt":         dict(shape="s", tp=1, pp=1, dp=64, seq=2048, mbs=2, nmb=2, use_distributed_optimizer=True),
    "s_untied":               dict(shape="s", tp=1, pp=1, dp=8, seq=2048, mbs=4, nmb=4, untie_embeddings_and_output_weights=True),
    "s_tp2_sp_sel":           dict(shape="s", tp=2, pp=1, dp=8, seq=2048, mbs=4, nmb=4, sequence_parallel=True,
                                   recompute_granularity="selective", use_distributed_optimizer=True),
    "s_tp2_sel_nosp":         dict(shape="s", tp=2, pp=1, dp=8, seq=2048, mbs=4, nmb=4, recompute_granularity="selective"),
    "s_pp2_nmb1":             dict(shape="s", tp=1, pp=2, dp=8, seq=2048, mbs=4, nmb=1),
    "s_kv128":                dict(shape="s", tp=1, pp=1, dp=8, seq=2048, mbs=4, nmb=4, kv_channels=128),
    "s_tp4_seq8192_sp_sel":   dict(shape="s", tp=4, pp=1, dp=8, seq=8192, mbs=1, nmb=8, sequence_parallel=True,
                                   recompute_granularity="selective"),
    "b_dp64_distopt":         dict(shape="b", tp=1, pp=1, dp=64, seq=2048, mbs=2, nmb=4, use_distributed_optimizer=True),
    "g7_tp2_tied_dp64":       dict(shape="g7", tp=2, pp=1, dp=64, seq=2048, mbs=2, nmb=2, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "g7_tp2_full":            dict(shape="g7", tp=2, pp=1, dp=8, seq=2048, mbs=2, nmb=8, recompute_granularity="full",
                                   recompute_method="uniform", recompute_num_layers=1),
    "l7_tp1_dp8_sel":         dict(shape="l7", tp=1, pp=1, dp=8, seq=4096, mbs=1, nmb=16, use_distributed_optimizer=True,
                                   recompute_granularity="selective"),
    "l7_tp2_sp_sel":          dict(shape="l7", tp=2, pp=1, dp=8, seq=4096, mbs=1, nmb=16, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "l7_tp4_sp_norecompute":  dict(shape="l7", tp=4, pp=1, dp=8, seq=4096, mbs=2, nmb=8, use_distributed_optimizer=True,
                                   sequence_parallel=True),
    "l7_tp8_seq8192_sp_sel":  dict(shape="l7", tp=8, pp=1, dp=8, seq=8192, mbs=1, nmb=8, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "l7_pp2_nmb8":            dict(shape="l7", tp=1, pp=2, dp=8, seq=4096, mbs=1, nmb=8, use_distributed_optimizer=True),
    "l7_tp2_pp4_nmb2":        dict(shape="l7", tp=2, pp=4, dp=8, seq=4096, mbs=1, nmb=2, sequence_parallel=True,
                                   recompute_granularity="selective"),
    "l7_tp2_pp4_vp2":         dict(shape="l7", tp=2, pp=4, dp=8, seq=4096, mbs=1, nmb=8, vp_layers=4, sequence_parallel=True,
                                   recompute_granularity="selective", use_distributed_optimizer=True),
    "l7_dp64_nodistopt":      dict(shape="l7", tp=1, pp=1, dp=64, seq=4096, mbs=1, nmb=2),
    "l70_tp8_pp1":            dict(shape="l70", tp=8, pp=1, dp=8, seq=4096, mbs=1, nmb=16, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "l70_tp8_pp2_nmb16":      dict(shape="l70", tp=8, pp=2, dp=8, seq=4096, mbs=1, nmb=16, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "l70_tp8_pp4_vp5":        dict(shape="l70", tp=8, pp=4, dp=8, seq=4096, mbs=1, nmb=32, vp_layers=4,
                                   use_distributed_optimizer=True, sequence_parallel=True, recompute_granularity="selective"),
    "l70_tp8_pp8_nmb4_dp1":   dict(shape="l70", tp=8, pp=8, dp=1, seq=4096, mbs=1, nmb=4, sequence_parallel=True,
                                   recompute_granularity="selective"),
    "l70_tp4_pp8_seq8192":    dict(shape="l70", tp=4, pp=8, dp=8, seq=8192, mbs=1, nmb=64, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "l70_tp8_pp2_nosp":       dict(shape="l70", tp=8, pp=2, dp=8, seq=4096, mbs=1, nmb=16, use_distributed_optimizer=True),
    "x175_tp8_pp8":           dict(shape="x175", tp=8, pp=8, dp=8, seq=2048, mbs=1, nmb=64, use_distributed_optimizer=True,
                                   sequence_parallel=True, recompute_granularity="selective"),
    "x175_tp8_pp8_vp2_dp64":  dict(shape="x175", tp=8, pp=8, dp=64, seq=2048, mbs=1, nmb=16, vp_layers=6,
                                   use_distributed_optimizer=True, sequence_parallel=True, recompute_granularity="selective"),
    "x175_tp8_pp4_nmb2_dp1":  dict(shape="x175", tp=8, pp=4, dp=1, seq=2048, mbs=1, nmb=2),
    "x175_tp4_pp8_mbs2_untied": dict(shape="x175", tp=4, pp=8, dp=8, seq=2048, mbs=2, nmb=32,
                                     untie_embeddings_and_output_weights=True, use_distributed_optimizer=True,
                                     sequence_parallel=True, recompute_granularity="selective"),
    "moe8_ep8_dp8":           dict(shape="moe", tp=1, pp=1, dp=8, ep=8, seq=4096, mbs=1, nmb=16,
                                   use_distributed_optimizer=True, recompute_granularity="selective"),
    "moe8_tp2_ep4_pp2":       dict(shape="moe", tp=2, pp=2, dp=8, ep=4, seq=4096, mbs=1, nmb=8,
                                   use_distributed_optimizer=True, sequence_parallel=True, recompute_granularity="selective"),
    "moe8_freq2_shared":      dict(shape="moe", tp=1, pp=1, dp=8, ep=2, seq=4096, mbs=1, nmb=8, moe_layer_freq=2,
                                   moe_shared_expert_intermediate_size=4096, moe_shared_expert_gate=True,
                                   use_distributed_optimizer=True),
}

LAYOUT_KEYS = {"shape", "tp", "pp", "dp", "ep", "seq", "mbs", "nmb", "vp_layers", "recompute_method",
               "recompute_num_layers"}


def build(cid: str) -> tuple[dict, dict, list[str]]:
    """(inputs, context, keys set by the configuration) for one configuration id."""
    c = CONFIGS[cid]
    shape = SHAPES[c["shape"]]
    own = {**shape, **{k: v for k, v in c.items() if k not in LAYOUT_KEYS}}
    tp, pp, dp, cp = c["tp"], c["pp"], c["dp"], 1
    inputs = {k: v for k, (v, _) in DEFAULTS.items()}
    inputs.update(own)
    vp = None
    if c.get("vp_layers"):
        vp = (inputs["num_layers"] // pp) // c["vp_layers"]
    inputs.update(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, data_parallel_size=dp,
        world_size=tp * pp * cp * dp, seq_length=c["seq"], micro_batch_size=c["mbs"],
        virtual_pipeline_model_parallel_size=vp, padded_vocab_size=padded_vocab(VOCAB, tp),
        kv_channels=own.get("kv_channels", inputs["hidden_size"] // inputs["num_attention_heads"]),
        expert_model_parallel_size=c.get("ep", 1), expert_tensor_parallel_size=tp,
        moe_ffn_hidden_size=inputs["ffn_hidden_size"] if inputs["num_experts"] is not None else None,
    )
    context = {
        "num_microbatches": c["nmb"], "global_batch_size": c["nmb"] * c["mbs"] * dp, "vocab_size": VOCAB,
        "make_vocab_size_divisible_by": DIVISIBLE_BY, "context_parallel_size": cp,
        "num_layers_per_virtual_pipeline_stage": c.get("vp_layers"),
        "recompute_method": c.get("recompute_method"), "recompute_num_layers": c.get("recompute_num_layers"),
    }
    set_keys = sorted(set(own) | {"tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size",
                                  "seq_length", "micro_batch_size"} | ({"expert_model_parallel_size"} if "ep" in c else set()))
    return dict(sorted(inputs.items())), context, set_keys


class Args(argparse.Namespace):
    """Namespace that logs the names read and assigned (public names only)."""

    def __init__(self, values: dict):
        object.__setattr__(self, "_reads", set())
        object.__setattr__(self, "_writes", set())
        for k, v in values.items():
            object.__setattr__(self, k, v)

    def __getattribute__(self, name):
        if not name.startswith("_"):
            object.__getattribute__(self, "_reads").add(name)
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        object.__getattribute__(self, "_writes").add(name)
        object.__setattr__(self, name, value)


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout


def show(git_dir: str, sha: str, path: str) -> str | None:
    try:
        return git(git_dir, "show", f"{sha}:{path}")
    except subprocess.CalledProcessError:
        return None


def cite_default(git_dir: str, sha: str, how: str, field: str) -> str | None:
    """'path:line: text' of the flag or dataclass field that sets this default at that revision."""
    if how.startswith("derived:"):
        return None
    if how.startswith("--"):
        src = show(git_dir, sha, "megatron/training/arguments.py") or ""
        for n, line in enumerate(src.splitlines(), 1):
            if f"'{how}'" in line or f'"{how}"' in line:
                return f"megatron/training/arguments.py:{n}: {line.strip()}"
        how = "field:" + field
    name = how.split(":", 1)[1]
    for path in CONFIG_FILES:
        lines = (show(git_dir, sha, path) or "").splitlines()
        for n, line in enumerate(lines, 1):
            if re.match(rf"    {name}\s*:", line):
                text = line.strip()
                if text.endswith("field("):
                    text += " " + " ".join(l.strip() for l in lines[n:n + 2])
                return f"{path}:{n}: {text}"
    return None


def cite_derived(git_dir: str, sha: str, pattern: str) -> list[str]:
    out = []
    for path in DERIVED_FILES:
        for n, line in enumerate((show(git_dir, sha, path) or "").splitlines(), 1):
            if re.search(pattern, line):
                out.append(f"{path}:{n}: {line.strip()}")
    return out


def static_reads(src: str) -> dict[str, dict]:
    """Per top-level function: args names read (direct, and with the file's functions it calls), assigned."""
    tree = ast.parse(src)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    direct, writes, calls = {}, {}, {}
    for name, fn in funcs.items():
        r, w, c = set(), set(), set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
                (w if isinstance(node.ctx, ast.Store) else r).add(node.attr)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == "getattr" and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) \
                        and node.args[0].id == "args" and isinstance(node.args[1], ast.Constant):
                    r.add(node.args[1].value)
                elif node.func.id in funcs and node.func.id != name:
                    c.add(node.func.id)
                elif not hasattr(builtins, node.func.id):
                    c.add(node.func.id)
        direct[name], writes[name], calls[name] = r, w, c

    def closure(name, seen):
        out = set(direct.get(name, set()))
        for callee in calls.get(name, ()):
            if callee in funcs and callee not in seen:
                out |= closure(callee, seen | {callee})
        return out

    return {name: {"line": funcs[name].lineno, "params": [a.arg for a in funcs[name].args.args],
                   "reads_direct": sorted(direct[name]), "reads_with_callees": sorted(closure(name, {name})),
                   "assigns": sorted(writes[name]), "calls": sorted(calls[name])} for name in funcs}


def make_stubs(src: str) -> tuple[dict[str, dict], list[dict]]:
    """Stand-ins for the file's imports that cannot be imported alone (relative ones)."""
    stubs: dict[str, dict] = {}
    record = []
    known = {
        "print_rank_0": (lambda message, rank=None: None,
                         "no-op (Megatron-LM prints the message on rank 0; only report_theoretical_memory calls it, "
                         "to say which activation formula it chose)"),
        "is_hybrid_model": (lambda args: args.hybrid_layer_pattern is not None,
                            "returns args.hybrid_layer_pattern is not None (what megatron/training/utils's "
                            "is_hybrid_model returns at these revisions)"),
    }
    for node in ast.parse(src).body:
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            mod = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name not in known:
                    raise SystemExit(f"no stub for 'from {mod} import {alias.name}' (line {node.lineno})")
                fn, what = known[alias.name]
                stubs.setdefault(node.module or "", {})[alias.name] = fn
                record.append({"import": f"from {mod} import {alias.name}", "line": node.lineno, "stub": what})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for n in names:
                importlib.import_module(n)  # stdlib (math) at these revisions: must import as is
    return stubs, record


def load(path: Path, stubs: dict[str, dict]) -> types.ModuleType:
    for key in [k for k in sys.modules if k == PKG or k.startswith(PKG + ".")]:
        del sys.modules[key]
    pkg = types.ModuleType(PKG)
    pkg.__path__ = [str(path.parent)]
    sys.modules[PKG] = pkg
    for sub, names in stubs.items():
        m = types.ModuleType(f"{PKG}.{sub}")
        m.__dict__.update(names)
        sys.modules[m.__name__] = m
    spec = importlib.util.spec_from_file_location(f"{PKG}.{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def plain(value):
    """JSON form of a return value (a tuple becomes a list; floats stay floats)."""
    return [plain(v) for v in value] if isinstance(value, tuple) else value


def call_all(mod: types.ModuleType, inputs: dict, nmb: int) -> dict:
    out = {}
    for name, fn in inspect.getmembers(mod, inspect.isfunction):
        if fn.__module__ != mod.__name__:
            continue
        params = inspect.signature(fn).parameters
        if next(iter(params), None) != "args":
            out[name] = {"skipped": f"signature {inspect.signature(fn)}"}
            continue
        kwargs = {}
        if "num_microbatches" in params:
            kwargs["num_microbatches"] = nmb
        if "verbose" in params:
            kwargs["verbose"] = False
        args = Args(inputs)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                value = fn(args, **kwargs)
            rec = {"value": plain(value)}
        except Exception as exc:  # recorded, not hidden
            rec = {"error": f"{type(exc).__name__}: {exc}"}
        rec.update(kwargs=kwargs, read=sorted(object.__getattribute__(args, "_reads")),
                   assigned=sorted(object.__getattribute__(args, "_writes")))
        out[name] = rec
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("git_dir")
    ap.add_argument("rev")
    ap.add_argument("--name", help="output name (default: the tag, or main-<sha12>)")
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "megatron_memory"))
    opts = ap.parse_args()

    sha = git(opts.git_dir, "rev-parse", f"{opts.rev}^{{commit}}").strip()
    date = git(opts.git_dir, "log", "-1", "--format=%cs", sha).strip()
    tags = [t for t in git(opts.git_dir, "tag", "--points-at", sha).split() if t.startswith("core_v")]
    name = opts.name or (opts.rev if opts.rev.startswith("core_v") else f"main-{sha[:12]}")
    src = show(opts.git_dir, sha, FILE)
    if src is None:
        raise SystemExit(f"{FILE} does not exist at {opts.rev}")
    blob = git(opts.git_dir, "rev-parse", f"{sha}:{FILE}").strip()

    stubs, stub_record = make_stubs(src)
    with tempfile.TemporaryDirectory(prefix="mlm-mem-", dir="/tmp") as tmp:
        path = Path(tmp) / Path(FILE).name
        path.write_text(src)
        mod = load(path, stubs)
        configs = {}
        for cid in CONFIGS:
            inputs, context, set_keys = build(cid)
            configs[cid] = {"inputs": inputs, "context": context, "set_by_configuration": set_keys,
                            "results": call_all(mod, inputs, context["num_microbatches"])}

    result = {
        "repository": "https://github.com/NVIDIA/Megatron-LM", "revision": opts.rev, "commit": sha,
        "commit_date": date, "tags": tags, "file": FILE, "file_blob": blob,
        "generated": dt.date.today().isoformat(),
        "command": "tools/megatron_memory_reference.py MLM_GIT_DIR " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "python": sys.version.split()[0],
        "units": "bytes, except report_theoretical_memory: (weight_and_optimizer, activation, total) in MiB "
                 "(NUM_BYTES_IN_MEGABYTE = 1024 * 1024)",
        "stubs": stub_record,
        "functions": static_reads(src),
        "defaults": {f: {"value": v, "source": cite_default(opts.git_dir, sha, how, f)} for f, (v, how) in DEFAULTS.items()},
        "derived": {f: {"rule": rule, "source": cite_derived(opts.git_dir, sha, pat)} for f, (rule, pat) in DERIVED.items()},
        "configs": configs,
    }
    out = Path(opts.out) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    errors = sum("error" in r for c in configs.values() for r in c["results"].values())
    print(f"{name} {sha[:12]} {blob[:12]}: {len(configs)} configurations, {errors} errors -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
