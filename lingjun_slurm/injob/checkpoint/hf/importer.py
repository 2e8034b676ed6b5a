"""Hugging Face model directory -> Megatron torch_dist checkpoint at iteration 0, proven by the logits.

    import_checkpoint(hf_dir, out, model=...) reads config.json (families.model_from_hf_config), checks the
    spec's model shape against it first (families.shape_mismatches: every difference named, with the
    spec's file:line when the caller gives `where`), maps the safetensors (hf_io.SafetensorsReader,
    mapping.to_megatron, the vocabulary padded for the target TP as Megatron-LM's
    _vocab_size_with_padding), writes megatron_io.write_megatron into OUT.partial-<stamp>-<pid>, runs
    proof.compare_logits between hf_dir and the written checkpoint read back through MegatronSource, and
    renames it to OUT only when the proof passes (or with check=False).

The result is what Megatron-LM's `--load OUT --finetune` reads (model only: no optimizer, scheduler or
RNG state; --finetune starts at iteration 0 and skips them, megatron/training/checkpointing.py
load_checkpoint, core_v0.16.1 :1559-1581, :1731, :1785, :1841) and the builtin trainer's init_from
(train/ckpt.py _load_weights_only, keyed on args.no_save_optim).
Memory: the whole model once (write_megatron builds a GPTModel and saves it with megatron-core).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import CheckpointError, CheckpointUsageError
from .export import check_out, finish, fixed_batch, partial_name, proof_json, proof_lines


@dataclass
class ImportResult:
    out: str
    source: str
    family: str
    vocab_size: int
    padded_vocab: int
    tensor_parallel: int
    pipeline: int
    tensors: int
    seconds: float
    proof: Any = None
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"imported {self.source} -> {self.out}/iter_0000000 (tracker: 0)",
               f"  {self.family} family, {self.tensors} tensors, vocabulary {self.vocab_size} padded to "
               f"{self.padded_vocab} (TP={self.tensor_parallel}), laid out for TP={self.tensor_parallel} "
               f"PP={self.pipeline} (torch_dist: loadable at any TP/PP), {self.seconds:.1f} s",
               "  load it with the builtin trainer's init_from, or Megatron-LM --load with --finetune "
               "(no optimizer state)"]
        return out + proof_lines(self.proof, self.notes)

    def to_json(self) -> dict:
        proof = proof_json(self.proof)
        return {"ok": True, "out": self.out, "source": self.source, "family": self.family,
                "vocab_size": self.vocab_size, "padded_vocab": self.padded_vocab,
                "tensor_parallel": self.tensor_parallel, "pipeline": self.pipeline, "tensors": self.tensors,
                "seconds": round(self.seconds, 3), "proof": proof, "notes": self.notes}


def read_config(hf_dir: Path) -> dict[str, Any]:
    path = hf_dir / "config.json"
    if not hf_dir.is_dir():
        raise CheckpointUsageError(f"{hf_dir}: no such directory")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (not a Hugging Face model directory)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return cfg


def _shape_error(hf_dir: Path, mismatches: list[tuple[str, Any, Any]],
                 where: Callable[[str], str] | None) -> CheckpointError:
    lines = [f"the model settings given do not match {hf_dir / 'config.json'}:"]
    for fld, spec_value, hf_value in mismatches:
        at = where(fld) if where else "model"
        lines.append(f"  {at}: model.{fld} is {spec_value!r}, config.json has {hf_value!r}")
    return CheckpointError("\n".join(lines))


def import_checkpoint(hf_dir: str | os.PathLike, out: str | os.PathLike, *, model: dict[str, Any] | None = None,
                      tensor: int = 1, pipeline: int = 1, check: bool = True, check_device: str = "cpu",
                      where: Callable[[str], str] | None = None,
                      only: Iterable[str] | None = None) -> ImportResult:
    """model: the spec's model settings (plan.resolve_model); None takes config.json's. where(field):
    "SPEC.yaml:LINE" of a model field, for the mismatch error. only: check just these fields (the
    CLI's model flags: a partial model)."""
    from .families import family_of, model_from_hf_config, shape_mismatches
    from .hf_io import SafetensorsReader
    from .mapping import to_megatron
    from .megatron_io import MegatronSource, padded_vocab_size, write_megatron

    start = time.perf_counter()
    hf_dir, out = Path(hf_dir), Path(out)
    if tensor < 1 or pipeline < 1:
        raise CheckpointUsageError("--tensor and --pipeline must be >= 1")
    cfg = read_config(hf_dir)
    hf_model = model_from_hf_config(cfg)
    if model:
        mismatches = shape_mismatches(model, cfg)
        if only is not None:
            keep = set(only)
            mismatches = [m for m in mismatches if m[0] in keep]
        if mismatches:
            raise _shape_error(hf_dir, mismatches, where)
        merged = {**{k: v for k, v in model.items() if v is not None}, **hf_model}
    else:
        merged = dict(hf_model)
    merged.setdefault("seq_length", merged.get("max_position_embeddings"))
    if merged.get("num_layers", 0) % pipeline:
        raise CheckpointUsageError(f"--pipeline {pipeline} does not divide num_layers={merged.get('num_layers')}")
    family = family_of(merged)
    vocab = int(cfg["vocab_size"])
    padded = padded_vocab_size(vocab, tensor)
    check_out(out)
    reader = SafetensorsReader(hf_dir)
    partial = partial_name(out)
    partial.mkdir()
    count = 0
    try:
        def counted() -> Any:
            nonlocal count
            for item in to_megatron(family, merged, reader, padded):
                count += 1
                yield item

        write_megatron(partial, counted(), merged, tensor, pipeline, 0, padded_vocab=padded, vocab_size=vocab)
        proof = None
        notes: list[str] = []
        if check:
            from .proof import compare_logits

            src = MegatronSource.open(partial, model=merged)
            proof = compare_logits(str(hf_dir), src, fixed_batch(vocab, merged.get("seq_length")),
                                   device=check_device, layer_by_layer=True)
            if not proof.ok:
                raise CheckpointError("\n".join(
                    [f"import of {hf_dir} failed its proof: the converted checkpoint's logits differ from the "
                     f"Hugging Face model's; nothing was written to {out}"] + [f"  {ln}" for ln in proof.lines()]))
        finish(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ImportResult(out=str(out), source=str(hf_dir), family=family, vocab_size=vocab, padded_vocab=padded,
                        tensor_parallel=tensor, pipeline=pipeline, tensors=count,
                        seconds=time.perf_counter() - start, proof=proof, notes=notes)
