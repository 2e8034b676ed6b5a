"""Megatron torch_dist checkpoint -> Hugging Face model directory, proven by the logits.

    export_checkpoint(ckpt_dir, out) reads the checkpoint a tensor at a time (megatron_io.MegatronSource:
    stacked layer tensors one layer at a time), maps each through mapping.to_hf, writes it at once
    into sharded safetensors (hf_io.ShardedWriter), then config.json / generation_config.json
    (families.hf_config), the run's tokenizer files when given, and runs proof.compare_logits on the
    written directory against the checkpoint. All of it goes into OUT.partial-<stamp>-<pid> beside OUT;
    only a passing proof (or --no-check) renames it to OUT. A failing proof removes it: nothing that
    looks finished is left, and the error (exit 1) carries the figures.

Memory: one layer's tensor of the largest stacked key, its Hugging Face pieces and the dtype cast
(bench/hf_export.py measures peak RSS against the checkpoint size); the proof then loads both models
(proof.py says how it bounds that).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, CheckpointUsageError
from .hf_io import DEFAULT_MAX_SHARD, ShardedWriter

# Files a Hugging Face tokenizer directory can hold (transformers tokenization_utils_base.py
# SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE, FULL_TOKENIZER_FILE, ADDED_TOKENS_FILE, chat template;
# the slow tokenizers' vocab files: GPT-2 vocab.json + merges.txt, sentencepiece tokenizer.model).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "vocab.txt", "chat_template.jinja",
                   "chat_template.json")
TORCH_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
BATCH_SEQ = 16  # tokens per sequence of the proof's fixed batch
BATCH_ROWS = 2


def fixed_batch(vocab_size: int, seq_length: int | None) -> Any:
    """The proof's batch: [2, min(16, seq)] token ids from a generator seeded 0 (the same every run)."""
    import torch

    seq = max(1, min(BATCH_SEQ, int(seq_length or BATCH_SEQ)))
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, int(vocab_size), (BATCH_ROWS, seq), generator=gen)


def partial_name(out: Path) -> Path:
    return out.with_name(f"{out.name}.partial-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}")


def check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointUsageError(f"{out} already exists and is not empty: choose another output directory")
    if not out.parent.is_dir():
        raise CheckpointUsageError(f"{out.parent}: no such directory (the output's parent must exist)")


def finish(partial: Path, out: Path) -> None:
    if out.is_dir():  # empty (check_out)
        out.rmdir()
    os.rename(partial, out)


def proof_json(proof: Any) -> dict | None:
    """The proof's figures for --json (export and import alike)."""
    if proof is None:
        return None
    return {"ok": bool(proof.ok), "max_abs_diff": float(proof.max_abs_diff), "tolerance": float(proof.tolerance),
            "per_layer": [float(x) for x in (proof.per_layer or [])]}


def proof_lines(proof: Any, notes: list[str]) -> list[str]:
    """The proof's lines (or that it did not run) and the notes, indented under the result's first lines."""
    out = ["  logits: not checked (--no-check)"] if proof is None else [f"  {line}" for line in proof.lines()]
    return out + [f"  note: {n}" for n in notes]


@dataclass
class ExportResult:
    out: str
    source: str
    iteration: Any
    family: str
    dtype: str
    vocab_size: int
    vocab_from: str
    padded_vocab: int
    files: list[str]
    tensors: int
    bytes_written: int
    checkpoint_bytes: int
    tokenizer: str
    seconds: float
    proof: Any = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"exported {self.source} (iteration {self.iteration}) -> {self.out}",
               f"  {self.family} family, {self.dtype}, {self.tensors} tensors in "
               f"{sum(f.endswith('.safetensors') for f in self.files)} "
               f"safetensors shard(s), {self.bytes_written / 2**20:.1f} MiB, {self.seconds:.1f} s",
               f"  vocabulary {self.vocab_size} (padded {self.padded_vocab} in the checkpoint; {self.vocab_from})",
               f"  tokenizer: {self.tokenizer}"]
        return out + proof_lines(self.proof, self.notes)

    def to_json(self) -> dict:
        proof = proof_json(self.proof)
        return {"ok": True, "out": self.out, "source": self.source, "iteration": self.iteration,
                "family": self.family, "dtype": self.dtype, "vocab_size": self.vocab_size,
                "vocab_from": self.vocab_from, "padded_vocab": self.padded_vocab, "files": self.files,
                "tensors": self.tensors, "bytes_written": self.bytes_written,
                "checkpoint_bytes": self.checkpoint_bytes, "tokenizer": self.tokenizer,
                "seconds": round(self.seconds, 3), "proof": proof, "notes": self.notes}


def _tokenizer(src: Any, tokenizer_dir: str | os.PathLike | None, dest: Path) -> tuple[str, list[str]]:
    """Copy the tokenizer files; (what the result says, notes)."""
    args = vars(src.args) if src.args is not None and hasattr(src.args, "__dict__") else {}
    ttype = args.get("tokenizer_type")
    if tokenizer_dir is None:
        if ttype == "NullTokenizer":
            return "null tokenizer: no tokenizer files (AutoTokenizer has nothing to load)", []
        return ("none copied" + (f" (the run's tokenizer is {ttype}: pass its directory with --tokenizer DIR)"
                                 if ttype else " (the checkpoint records no tokenizer)")), []
    tdir = Path(tokenizer_dir)
    if not tdir.is_dir():
        raise CheckpointUsageError(f"{tdir}: no such tokenizer directory")
    copied = [n for n in TOKENIZER_FILES if (tdir / n).is_file()]
    if not copied:
        raise CheckpointUsageError(f"{tdir}: no tokenizer file ({', '.join(TOKENIZER_FILES[:6])}, ...)")
    for n in copied:
        shutil.copyfile(tdir / n, dest / n)
    return f"copied {', '.join(copied)} from {tdir}", []


def export_checkpoint(ckpt_dir: str | os.PathLike, out: str | os.PathLike, *, iteration: int | None = None,
                      dtype: str = "bf16", tokenizer_dir: str | os.PathLike | None = None,
                      model: dict[str, Any] | None = None, check: bool = True, check_device: str = "cpu",
                      max_shard_bytes: int = DEFAULT_MAX_SHARD) -> ExportResult:
    """Export one iteration of a torch_dist checkpoint as a Hugging Face model directory `out`.
    model: the run's settings (plan.json settings.model), winning over what the checkpoint records."""
    import torch

    from .families import family_of, generation_config, hf_config
    from .mapping import to_hf
    from .megatron_io import MegatronSource

    start = time.perf_counter()
    if dtype not in TORCH_DTYPES:
        raise CheckpointUsageError(f"--dtype {dtype}: choose bf16 or fp32")
    out = Path(out)
    check_out(out)
    if tokenizer_dir is not None and not Path(tokenizer_dir).is_dir():
        raise CheckpointUsageError(f"{tokenizer_dir}: no such tokenizer directory")
    src = MegatronSource.open(ckpt_dir, iteration, model)
    missing = src.missing_settings()
    if missing:
        raise CheckpointError(f"{src.path}: the checkpoint does not record {', '.join(missing)} (its args "
                              "lack them): export it with the run's spec (--spec SPEC.yaml) to give the model")
    family = family_of(src.model)
    vocab, vocab_from = src.vocab_size()
    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    partial = partial_name(out)
    partial.mkdir()
    writer = ShardedWriter(partial, max_shard_bytes, metadata={"lingjun_slurm": "checkpoint export"})
    count = 0
    try:
        for key in src.keys():
            layers = src.num_layers(key)
            pieces = [(key, None)] if layers is None else [(key, i) for i in range(layers)]
            for name, layer in pieces:
                tensor = src.load(name, layer)
                hf_key = name if layer is None else f"decoder.layers.{layer}.{name[len('decoder.layers.'):]}"
                for hf_name, hf_tensor in to_hf(family, src.model, hf_key, tensor, vocab):
                    writer.write(hf_name, hf_tensor.to(torch_dtype))
                    count += 1
                del tensor
        files = writer.close()
        cfg = hf_config(src.model, vocab, dtype)
        (partial / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        (partial / "generation_config.json").write_text(
            json.dumps(generation_config(src.model), indent=2, sort_keys=True) + "\n")
        tok_text, notes = _tokenizer(src, tokenizer_dir, partial)
        if vocab_from.startswith("the checkpoint records no tokenizer vocabulary") and tokenizer_dir is not None:
            notes.append(f"the vocabulary is the checkpoint's padded {vocab} rows; the tokenizer in {tokenizer_dir} "
                         "may have fewer ids (the builtin records no vocabulary size for a Hugging Face tokenizer)")
        proof = None
        if check:
            from .proof import compare_logits

            proof = compare_logits(str(partial), src, fixed_batch(vocab, src.model.get("seq_length")),
                                   device=check_device, layer_by_layer=True)
            if not proof.ok:
                raise CheckpointError("\n".join(
                    [f"export of {src.path} failed its proof: the Hugging Face model's logits differ from "
                     f"megatron-core's; nothing was written to {out}"] + [f"  {line}" for line in proof.lines()]))
        finish(partial, out)
    except BaseException:
        writer.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ExportResult(out=str(out), source=str(src.path), iteration=src.iteration, family=family, dtype=dtype,
                        vocab_size=vocab, vocab_from=vocab_from, padded_vocab=src.padded_vocab,
                        files=files + ["config.json", "generation_config.json"], tensors=count,
                        bytes_written=writer.total, checkpoint_bytes=src.size_bytes, tokenizer=tok_text,
                        seconds=time.perf_counter() - start, proof=proof, notes=src.notes + notes)
