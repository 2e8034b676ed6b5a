"""One preprocess array task (a shard) and the merge, from plan.json's settings.data."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from . import DataError
from .encode import EncodeSettings, auto_workers, encode_stream, task_cpus
from .inputs import Chunk, Piece, assign, line_number, read_chunks, resolve_inputs
from .progress import Progress
from .resume import dataset_prefix, fingerprint, is_done, marker_path, read_marker, write_marker
from .tokenizer import TokenizerSpec, build
from .writer import DatasetWriter, merge, remove_quietly

CHUNK_LINES = 1024
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class DataSettings:
    inputs: list[str]
    keys: tuple[str, ...]
    append_eod: bool
    tokenizer: TokenizerSpec
    shards: int
    workers: int | None  # None: auto_workers (data.workers unset)
    output_prefix: str
    shard_dir: str

    @classmethod
    def from_plan(cls, plan: dict[str, Any]) -> "DataSettings":
        try:
            data = plan["settings"]["data"]
        except (KeyError, TypeError):
            raise DataError("plan.json has no settings.data: re-render the run") from None
        if data.get("tool", "builtin") != "builtin":
            raise DataError(f"data.tool is {data.get('tool')!r}: the built-in stage only runs for tool builtin")
        keys = tuple(data.get("json_keys") or ["text"])
        output_prefix = data.get("output_prefix")
        if not output_prefix:
            raise DataError("settings.data.output_prefix is not set: re-render the run")
        return cls(inputs=list(data.get("inputs") or []), keys=keys, append_eod=bool(data.get("append_eod", True)),
                   tokenizer=TokenizerSpec.from_settings(data.get("tokenizer")),
                   shards=int(data.get("shards") or 1), workers=int(data["workers"]) if data.get("workers") else None,
                   output_prefix=output_prefix, shard_dir=data.get("shard_dir") or f"{output_prefix}.shards")

    @property
    def encode(self) -> EncodeSettings:
        return EncodeSettings(self.keys, self.append_eod, self.tokenizer)


def _where(chunk: Chunk, pieces: list[Piece], index: int) -> str:
    piece = pieces[chunk.piece_index]
    first = chunk.first_line if chunk.first_line is not None else line_number(piece.file.path, chunk.first_offset)
    return f"{piece.file.path}:{first + index}"


def run_shard(ds: DataSettings, shard: int, log: TextIO | None = None,
              progress_interval_s: float | None = None) -> dict[str, Any]:
    """Tokenize shard `shard` into {shard_dir}/shard_NNNNN_{key}_document.bin/.idx + a .done marker.
    Returns a summary; a finished shard with the same fingerprint is skipped."""
    log = log or sys.stderr
    if not 0 <= shard < ds.shards:
        raise DataError(f"--shard {shard} is outside 0..{ds.shards - 1} (data.shards is {ds.shards})")
    pieces = assign(resolve_inputs(ds.inputs), ds.shards)[shard]
    tok = build(ds.tokenizer, need_eod=ds.append_eod)
    fp = fingerprint(shard, ds.shards, pieces, ds.encode)
    label = f"preprocess shard {shard}/{ds.shards}"
    os.makedirs(ds.shard_dir, exist_ok=True)
    if is_done(ds.shard_dir, shard, fp, ds.keys):
        print(f"{label}: already done ({marker_path(ds.shard_dir, shard)} matches the inputs, tokenizer "
              "and flags); skipping", file=log, flush=True)
        return {"skipped": True}
    remove_quietly(marker_path(ds.shard_dir, shard))
    workers = ds.workers or auto_workers(tok)
    how = "" if ds.workers else f" (data.workers unset: chosen for {task_cpus()} CPU(s) and this tokenizer)"
    print(f"{label}: {len(pieces)} input piece(s), tokenizer {tok.describe}, {workers} worker(s){how}",
          file=log, flush=True)
    writers = {key: DatasetWriter(dataset_prefix(ds.shard_dir, shard, key), tok.vocab_size) for key in ds.keys}
    before = [0]
    for piece in pieces:
        before.append(before[-1] + piece.raw_bytes)
    progress = Progress(label, before[-1], progress_interval_s, log)
    try:
        chunks = read_chunks(pieces, CHUNK_LINES, CHUNK_BYTES)
        for chunk, result in encode_stream(chunks, ds.encode, tok, workers):
            if result.error is not None:
                index, message = result.error
                raise DataError(f"{_where(chunk, pieces, index)}: {message}")
            for key, docs in result.docs.items():
                writers[key].add(docs)
            piece = pieces[chunk.piece_index]
            progress.update(result.lines, result.text_bytes, result.tokens,
                            before[chunk.piece_index] + chunk.raw_pos - piece.start)
        for writer in writers.values():
            writer.finalize()
        for writer in writers.values():
            writer.commit()
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    summary = {"documents": progress.docs, "text_bytes": progress.text_bytes, "tokens": progress.tokens,
               "per_key": {k: {"documents": w.documents, "tokens": w.tokens} for k, w in writers.items()},
               "line": progress.close()}
    write_marker(ds.shard_dir, shard, fp, summary)
    return summary


def check_shards(ds: DataSettings) -> None:
    """Every shard finished (marker with the fingerprint of the current inputs/tokenizer/flags)."""
    layout = assign(resolve_inputs(ds.inputs), ds.shards)
    problems = []
    for shard in range(ds.shards):
        marker = read_marker(marker_path(ds.shard_dir, shard))
        if marker is None:
            problems.append(f"shard {shard} is missing or unfinished (no {marker_path(ds.shard_dir, shard)})")
        elif marker.get("fingerprint") != fingerprint(shard, ds.shards, layout[shard], ds.encode):
            problems.append(f"shard {shard} was made from other inputs, tokenizer or flags than the plan's")
        elif not is_done(ds.shard_dir, shard, marker["fingerprint"], ds.keys):
            problems.append(f"shard {shard} has a marker but its .bin/.idx files are missing")
    if problems:
        raise DataError("cannot merge: " + "; ".join(problems) + ". Re-run the preprocess array "
                        "task(s) for these shards (finished shards are skipped).")


def run_merge(ds: DataSettings, log: TextIO | None = None) -> dict[str, Any]:
    """{output_prefix}_{key}_document.bin/.idx from the shards, in shard order."""
    log = log or sys.stderr
    check_shards(ds)
    out: dict[str, Any] = {}
    for key in ds.keys:
        prefixes = [dataset_prefix(ds.shard_dir, shard, key) for shard in range(ds.shards)]
        target = f"{ds.output_prefix}_{key}_document"
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        documents, tokens = merge(prefixes, target)
        out[key] = {"prefix": target, "documents": documents, "tokens": tokens}
        print(f"merge: {target}.bin/.idx from {ds.shards} shard(s): {documents:,} documents, {tokens:,} tokens",
              file=log, flush=True)
    return out
