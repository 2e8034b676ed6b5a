"""The spec variants whose rendered Megatron-LM argv is checked against each pinned version (dev + tests).

Each variant is the shipped examples/megatron-gpt.yaml shrunk to a tiny model (so Megatron-LM's
validate_args has nothing to say about sizes) with one edit set: parallelism (TP/PP/SP/CP),
recompute, the distributed optimizer, each tokenizer type and each precision. The tokenizer files
live under TOK_ROOT: tools/megatron_reference.py writes tiny ones there so that Megatron-LM can build
the tokenizer; the tests only render, so the files need not exist for them.

    variants(version) -> {name: (spec, world_size)}
    pretrain_argv(spec) / preprocess_argv(spec) -> list[str]
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
TOK_ROOT = "/tmp/lingjun-megatron-reference/tok"

TOKENIZERS: dict[str, dict[str, Any]] = {
    "huggingface": {"type": "huggingface", "path": f"{TOK_ROOT}/hf"},
    "huggingface-no-special": {"type": "huggingface", "path": f"{TOK_ROOT}/hf", "add_special_tokens": False},
    "gpt2-bpe": {"type": "gpt2-bpe", "vocab_file": f"{TOK_ROOT}/gpt2/vocab.json",
                 "merge_file": f"{TOK_ROOT}/gpt2/merges.txt"},
    "sentencepiece": {"type": "sentencepiece", "path": f"{TOK_ROOT}/spm/tok.model"},
    "null": {"type": "null", "vocab_size": 512},
}


def _par(**kw: Any) -> Callable[[dict], None]:
    return lambda raw: raw["parallelism"].update(kw)


def _train(**kw: Any) -> Callable[[dict], None]:
    return lambda raw: raw["training"].update(kw)


def _tok(name: str) -> Callable[[dict], None]:
    return lambda raw: raw["data"].update(tokenizer=copy.deepcopy(TOKENIZERS[name]))


def _model(**kw: Any) -> Callable[[dict], None]:
    return lambda raw: raw["model"].update(kw)


# name -> (edits, GPUs in the train stage). The base: 1 node x 8 GPUs, TP=2 + SP, distributed optimizer
# with overlapped grad reduce / param gather, bf16, selective recompute, a HuggingFace tokenizer.
VARIANTS: dict[str, tuple[list[Callable[[dict], None]], int]] = {
    "base-tp2-sp-distopt-bf16-selective-hf": ([], 8),
    "tp1-pp1-dp8-fp32-null": ([_par(tensor=1, sequence_parallel=False, distributed_optimizer=False,
                                    overlap_grad_reduce=False, overlap_param_gather=False),
                               _train(precision="fp32", recompute={}), _tok("null")], 8),
    "pp2-fp16-full-uniform": ([_par(tensor=1, pipeline=2, sequence_parallel=False),
                               _train(precision="fp16", recompute={"granularity": "full", "method": "uniform",
                                                                   "num_layers": 1})], 8),
    "tp2-pp2-full-block": ([_par(pipeline=2), _train(recompute={"granularity": "full", "method": "block",
                                                                "num_layers": 1})], 8),
    "cp2-bf16": ([_par(tensor=1, context=2, sequence_parallel=False)], 8),
    "tp2-cp2-pp2-16gpu": ([_par(pipeline=2, context=2)], 16),
    "no-distopt-no-overlap": ([_par(distributed_optimizer=False, overlap_grad_reduce=False,
                                    overlap_param_gather=False)], 8),
    "gqa-rope-swiglu-rmsnorm": ([_model(normalization="RMSNorm", activation="swiglu", position_embedding="rope",
                                        rotary_base=500000, num_query_groups=2, untie_embeddings=True,
                                        bias_linear=False)], 8),
    "tokenizer-hf-no-special-tokens": ([_tok("huggingface-no-special")], 8),
    "tokenizer-gpt2-bpe": ([_tok("gpt2-bpe")], 8),
    "tokenizer-sentencepiece": ([_tok("sentencepiece")], 8),
    "tokenizer-null": ([_tok("null")], 8),
    "fp16-null-dp-only": ([_par(tensor=1, sequence_parallel=False), _train(precision="fp16"), _tok("null")], 8),
}

# preprocess_data.py: one per tokenizer (the parser is the tokenizer group plus the script's own flags).
PREPROCESS_VARIANTS = {f"preprocess-{name}": name for name in TOKENIZERS}


def base_spec(version: str) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "examples" / "megatron-gpt.yaml").read_text())
    raw["megatron_lm"]["version"] = version
    raw["model"] = {"preset": "tiny", "seq_length": 64, "max_position_embeddings": 64}
    raw["cluster"]["stages"]["train"].update(nodes=1, gpus_per_node=8)
    raw["parallelism"].update(global_batch=16)
    raw["training"].update(iterations=20, lr_warmup_iters=2, lr_decay_iters=None)
    raw["data"]["tokenizer"] = copy.deepcopy(TOKENIZERS["huggingface"])
    raw["data"]["inputs"] = ["/tmp/lingjun-megatron-reference/corpus.jsonl"]
    raw["data"]["tool"] = "megatron-lm"
    raw["data"]["shards"] = 1
    raw["checkpoint"]["save_interval"] = 10
    raw.pop("stages", None)
    return raw


def _parse(raw: dict[str, Any]):
    from lingjun_slurm.spec import parse_spec

    return parse_spec(yaml.safe_dump(raw), "megatron-variant").spec


def variant_spec(name: str, version: str):
    edits, gpus = VARIANTS[name]
    raw = base_spec(version)
    for edit in edits:
        edit(raw)
    nodes = max(1, gpus // 8)
    raw["cluster"]["stages"]["train"].update(nodes=nodes, gpus_per_node=min(gpus, 8))
    return _parse(raw), gpus


def preprocess_spec(tokenizer: str, version: str):
    raw = base_spec(version)
    _tok(tokenizer)(raw)
    return _parse(raw)


def words(argv: list) -> list[str]:
    """argv with shell words (e.g. "$PLAN_DIR/...") turned into plain strings."""
    return [str(w) for w in argv]


def pretrain_argv(spec) -> list[str]:
    from lingjun_slurm.megatron import args as margs

    return words(margs.pretrain_args(spec))


def preprocess_argv(spec) -> list[str]:
    from lingjun_slurm.megatron import args as margs

    return words(margs.preprocess_args(spec, "/tmp/lingjun-megatron-reference/corpus.jsonl",
                                       "/tmp/lingjun-megatron-reference/out/corpus"))


def train_env(spec) -> dict[str, str]:
    """The plain-valued variables the rendered train stage exports (Megatron-LM checks some)."""
    from lingjun_slurm.plan import build_plan

    return {e.name: e.value for e in build_plan(spec).stage("train").env if isinstance(e.value, str)}


def _probe(name: str, script: str) -> dict[str, Any]:
    """For a refused gpt2-bpe variant: the 0.16 argv less --legacy-tokenizer (what a newer one would get)."""
    if "gpt2" not in name:
        return {}
    if script == "pretrain_gpt.py":
        spec, world = variant_spec(name, "0.16.1")
        argv, env = pretrain_argv(spec), train_env(spec)
    else:
        argv, world, env = preprocess_argv(preprocess_spec(PREPROCESS_VARIANTS[name], "0.16.1")), 1, {}
    return {"probe_argv": [w for w in argv if w != "--legacy-tokenizer"], "world_size": world, "env": env}


def render_all(version: str) -> dict[str, dict[str, Any]]:
    """{variant: {"script", "argv", "world_size"} or {"script", "error"}} for that declared version."""
    out: dict[str, dict[str, Any]] = {}
    for name in VARIANTS:
        try:
            spec, world = variant_spec(name, version)
            out[name] = {"script": "pretrain_gpt.py", "argv": pretrain_argv(spec), "world_size": world,
                         "env": train_env(spec)}
        except Exception as exc:  # a refusal by the spec checks or the renderer is a verdict too
            out[name] = {"script": "pretrain_gpt.py", "error": f"{type(exc).__name__}: {exc}",
                         **_probe(name, "pretrain_gpt.py")}
    for name, tok in PREPROCESS_VARIANTS.items():
        try:
            out[name] = {"script": "preprocess_data.py", "argv": preprocess_argv(preprocess_spec(tok, version)),
                         "world_size": 1}
        except Exception as exc:
            out[name] = {"script": "preprocess_data.py", "error": f"{type(exc).__name__}: {exc}",
                         **_probe(name, "preprocess_data.py")}
    return out
