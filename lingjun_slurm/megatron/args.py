"""Spec -> command lines of Megatron-LM's scripts (pure; no torch, no megatron import).

Only flags the image's Megatron-LM version has are emitted (versions.has_flag); every
emitted flag must be listed in presets/megatron_flags.yaml, which a test enforces.
"""

from __future__ import annotations

from typing import Any

from ..common.shell import Shell, Word
from ..spec.models import Spec, Tokenizer, init_dir
from ..spec.resolve import builtin_resources, checkpoint_dir, data_prefix, resolve_model
from .versions import Version, has_flag, null_vocab_arg, parse_version, tokenizer_problem

PRETRAIN = "pretrain_gpt.py"
PREPROCESS = "preprocess_data.py"
MERGE = "merge_datasets.py"

_TOKENIZER_TYPES = {
    "huggingface": "HuggingFaceTokenizer",
    "gpt2-bpe": "GPT2BPETokenizer",
    "sentencepiece": "GPTSentencePieceTokenizer",
    "null": "NullTokenizer",
}


class ArgList:
    """Builds argv for one script, refusing flags the version lacks."""

    def __init__(self, script: str, version: Version):
        self.script, self.version = script, version
        self.argv: list[Word] = []

    def has(self, flag: str) -> bool:
        return has_flag(self.script, flag, self.version)

    def add(self, flag: str, *values: Any) -> None:
        if not self.has(flag):
            raise ValueError(f"Megatron-LM {'.'.join(map(str, self.version))} {self.script} has no {flag}")
        self.argv.append(flag)
        self.argv.extend(_fmt(v) for v in values)

    def switch(self, flag: str, on: bool) -> None:
        if on:
            self.add(flag)


def _fmt(value: Any) -> Word:
    if isinstance(value, Shell):
        return value
    if isinstance(value, float):
        return repr(value)
    return str(value)


def megatron_version(spec: Spec) -> Version:
    assert spec.megatron_lm is not None, "checks guarantee megatron_lm when a stage uses it"
    return parse_version(spec.megatron_lm.version)


def tokenizer_args(args: ArgList, tok: Tokenizer) -> None:
    """Tokenizer flags for args.version; every version then tokenizes alike (and like the builtin)."""
    problem = tokenizer_problem(tok.type, args.version)
    if problem:  # spec checks refuse it first, with the spec's file:line
        raise ValueError(problem)
    args.add("--tokenizer-type", _TOKENIZER_TYPES[tok.type])
    if tok.type in ("huggingface", "sentencepiece"):
        args.add("--tokenizer-model", tok.path)
        if tok.type == "huggingface":
            # Put the post-processor's special tokens (e.g. BOS) into the ids unless the spec says not to:
            # core_v0.16 leaves them out unless asked; from 0.17 they are in unless asked not to.
            include = tok.add_special_tokens is not False
            if args.has("--tokenizer-hf-no-include-special-tokens"):
                args.switch("--tokenizer-hf-no-include-special-tokens", not include)
            else:
                args.switch("--tokenizer-hf-include-special-tokens", include)
    elif tok.type == "gpt2-bpe":
        # Without --legacy-tokenizer core_v0.16 fetches HF's gpt2 from the Hub with its own merges.
        args.add("--legacy-tokenizer")
        args.add("--vocab-file", tok.vocab_file)
        args.add("--merge-file", tok.merge_file)
    else:
        assert tok.vocab_size is not None
        args.add("--vocab-size", null_vocab_arg(tok.vocab_size, args.version))


def pretrain_args(spec: Spec) -> list[Word]:
    """pretrain_gpt.py arguments for the spec (entrypoint: megatron-lm)."""
    args = ArgList(PRETRAIN, megatron_version(spec))
    arch = resolve_model(spec)
    par, tr = spec.parallelism, spec.training
    res = builtin_resources(spec, "train")

    args.add("--tensor-model-parallel-size", par.tensor)
    args.add("--pipeline-model-parallel-size", par.pipeline)
    args.add("--context-parallel-size", par.context)
    args.switch("--sequence-parallel", par.sequence_parallel)
    args.switch("--use-distributed-optimizer", par.distributed_optimizer)
    args.switch("--overlap-grad-reduce", par.overlap_grad_reduce)
    args.switch("--overlap-param-gather", par.overlap_param_gather)

    args.add("--num-layers", arch["num_layers"])
    args.add("--hidden-size", arch["hidden_size"])
    args.add("--ffn-hidden-size", arch["ffn_hidden_size"])
    args.add("--num-attention-heads", arch["num_attention_heads"])
    if arch["num_query_groups"] != arch["num_attention_heads"]:
        args.add("--group-query-attention")
        args.add("--num-query-groups", arch["num_query_groups"])
    args.add("--seq-length", arch["seq_length"])
    args.add("--max-position-embeddings", arch["max_position_embeddings"])
    args.add("--normalization", arch["normalization"])
    args.switch("--swiglu", arch["activation"] == "swiglu")
    args.add("--position-embedding-type", arch["position_embedding"])
    if arch["position_embedding"] == "rope" and arch["rotary_base"]:
        args.add("--rotary-base", arch["rotary_base"])
    args.switch("--untie-embeddings-and-output-weights", bool(arch["untie_embeddings"]))
    args.switch("--disable-bias-linear", not arch["bias_linear"])
    args.add("--hidden-dropout", float(arch["hidden_dropout"]))
    args.add("--attention-dropout", float(arch["attention_dropout"]))

    args.add("--micro-batch-size", par.micro_batch)
    args.add("--global-batch-size", par.global_batch)
    args.add("--train-iters", tr.iterations)
    args.add("--lr", tr.lr)
    args.add("--min-lr", tr.min_lr)
    args.add("--lr-decay-style", tr.lr_decay_style)
    args.add("--lr-warmup-iters", tr.lr_warmup_iters)
    args.add("--lr-decay-iters", tr.lr_decay_iters or tr.iterations)
    args.add("--weight-decay", tr.weight_decay)
    args.add("--clip-grad", tr.clip_grad)
    args.add("--adam-beta1", tr.adam_beta1)
    args.add("--adam-beta2", tr.adam_beta2)
    args.switch("--bf16", tr.precision == "bf16")
    args.switch("--fp16", tr.precision == "fp16")
    args.add("--seed", tr.seed)
    if tr.recompute.granularity:
        args.add("--recompute-granularity", tr.recompute.granularity)
    if tr.recompute.method:
        args.add("--recompute-method", tr.recompute.method)
    if tr.recompute.num_layers:
        args.add("--recompute-num-layers", tr.recompute.num_layers)

    assert spec.data.tokenizer is not None
    tokenizer_args(args, spec.data.tokenizer)
    args.add("--data-path", data_prefix(spec))
    args.add("--split", spec.data.split)

    ckpt = checkpoint_dir(spec)
    args.add("--save", ckpt)
    args.add("--load", ckpt)
    if tr.init_from:
        # Megatron-LM loads --pretrained-checkpoint only while --load has no tracker, and then with
        # finetune semantics (iteration 0, no optimizer or RNG state): load_checkpoint, checkpointing.py
        # core_v0.16.1:1494-1502 (main d98e8a6 :2498-2506). After the run's first save every start, a
        # requeue included, resumes from --load. The directory is written before pretrain_gpt.py starts
        # (lingjun_slurm/injob/stages/hfinit.py).
        args.add("--pretrained-checkpoint", init_dir(spec))
    args.add("--save-interval", spec.checkpoint.save_interval)
    args.add("--ckpt-format", spec.checkpoint.format)
    args.add("--exit-signal-handler")
    if res.time_s:
        # Leave two grace periods: one for the save, one before Slurm's own signal.
        args.add("--exit-duration-in-mins", max(1, (res.time_s - 2 * tr.save_grace_s) // 60))

    args.add("--log-interval", tr.log_interval)
    args.add("--eval-interval", tr.eval_interval)
    args.add("--eval-iters", tr.eval_iters)
    args.switch("--log-throughput", True)
    args.add("--tensorboard-dir", f"{spec.run.workdir}/tensorboard")
    args.add("--distributed-backend", "nccl" if res.gpus_per_node else "gloo")
    return args.argv + list(tr.extra_args)


def preprocess_args(spec: Spec, input_path: Word, output_prefix: Word) -> list[Word]:
    """preprocess_data.py arguments for one input file (tool: megatron-lm)."""
    args = ArgList(PREPROCESS, megatron_version(spec))
    data = spec.data
    args.add("--input", input_path)
    args.add("--json-keys", *data.json_keys)
    args.add("--output-prefix", output_prefix)
    # preprocess_data.py's --workers is required (core_v0.16.1 tools/preprocess_data.py); unset,
    # one per CPU the task may use: nproc(1) counts the affinity mask Slurm gives the task.
    args.add("--workers", data.workers if data.workers else Shell('"$(nproc)"'))
    args.switch("--append-eod", data.append_eod)
    assert data.tokenizer is not None
    tokenizer_args(args, data.tokenizer)
    return args.argv


def merge_args(spec: Spec, input_dir: Word, output_prefix: Word) -> list[Word]:
    args = ArgList(MERGE, megatron_version(spec))
    args.add("--input", input_dir)
    args.add("--output-prefix", output_prefix)
    return args.argv
