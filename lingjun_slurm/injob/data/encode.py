"""json lines -> Megatron documents, and the ordered worker pool that runs it.

Per line, as Megatron-LM's tools/preprocess_data.py Encoder.encode does: json.loads(line); for each
json key (in --json-keys order) the value is one text, or a list of texts ("sentences"); each text
is tokenized; empty ones are dropped; with append_eod a non-empty document gets the EOD id appended
to its last sentence. An empty document is still added (no tokens, no sentences).
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterable, Iterator

import numpy as np

from . import DataError
from .tokenizer import TextError, Tokenizer, TokenizerSpec, build


@dataclass(frozen=True)
class EncodeSettings:
    keys: tuple[str, ...]
    append_eod: bool
    tokenizer: TokenizerSpec


@dataclass
class KeyDocs:
    """The documents of one chunk for one json key, in flat arrays (cheap to pickle)."""

    tokens: np.ndarray  # all token ids, in the dataset dtype
    doc_tokens: np.ndarray  # tokens per document
    sentence_lengths: np.ndarray  # tokens per sentence (the .idx "sequence lengths")
    doc_sentences: np.ndarray  # sentences per document


@dataclass
class ChunkResult:
    docs: dict[str, KeyDocs]
    lines: int  # documents (non-blank lines)
    text_bytes: int
    tokens: int
    error: tuple[int, str] | None = None  # (line index in the chunk, message)


def _fail(index: int, message: str) -> ChunkResult:
    return ChunkResult({}, 0, 0, 0, (index, message))


def _texts_of(data: Any, key: str) -> list[str] | str:
    """The texts of one key, or an error message."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if key not in data:
        keys = ", ".join(repr(k) for k in list(data)[:8])
        return f"no key {key!r} (the object has {keys or 'no keys'})"
    value = data[key]
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return f"key {key!r} is {type(value).__name__}; expected a string or a list of strings"


def encode_lines(lines: list[bytes], settings: EncodeSettings, tok: Tokenizer) -> ChunkResult:
    texts: list[str] = []
    text_line: list[int] = []
    layout: list[list[tuple[int, int]]] = []  # per document: per key (first text, count)
    text_bytes = 0
    for index, raw in enumerate(lines):
        if not raw.strip():  # Megatron's json.loads fails on a blank line; we skip it
            continue
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return _fail(index, f"not valid UTF-8 ({exc.reason} at byte {exc.start} of the line)")
        except json.JSONDecodeError as exc:
            return _fail(index, f"invalid JSON: {exc.msg} (column {exc.colno})")
        per_key = []
        for key in settings.keys:
            found = _texts_of(data, key)
            if isinstance(found, str):
                return _fail(index, found)
            per_key.append((len(texts), len(found)))
            texts.extend(found)
            text_line.extend([index] * len(found))
        layout.append(per_key)
        text_bytes += len(raw)
    try:
        ids = tok.encode_batch(texts)
    except TextError as exc:
        return _fail(text_line[exc.index], exc.message)
    eod = tok.eod if settings.append_eod else None
    assert eod is not None or not settings.append_eod, "build(need_eod=True) refuses a tokenizer without EOD"
    out: dict[str, KeyDocs] = {}
    total = 0
    for k, key in enumerate(settings.keys):
        sentences: list[list[int]] = []
        lengths: list[int] = []
        doc_tokens, doc_sents = [], []
        for per_key in layout:
            first, count = per_key[k]
            n_tokens = n_sents = 0
            for sentence in ids[first:first + count]:
                if sentence:
                    sentences.append(sentence)
                    lengths.append(len(sentence))
                    n_tokens += len(sentence)
                    n_sents += 1
            if n_tokens and eod is not None:
                sentences.append([eod])  # the EOD id ends the last sentence (its length, +1)
                lengths[-1] += 1
                n_tokens += 1
            doc_tokens.append(n_tokens)
            doc_sents.append(n_sents)
        n = sum(doc_tokens)
        total += n
        # one pass over the ids, no intermediate flat list (numpy.fromiter with a known count)
        flat = np.fromiter(chain.from_iterable(sentences), dtype=tok.dtype_name, count=n)
        out[key] = KeyDocs(flat, np.array(doc_tokens, dtype=np.int64),
                           np.array(lengths, dtype=np.int32), np.array(doc_sents, dtype=np.int64))
    return ChunkResult(out, len(layout), text_bytes, total)


# --- the worker pool -------------------------------------------------------------------------

_WORKER: tuple[EncodeSettings, Tokenizer] | None = None


def _init_worker(settings: EncodeSettings, threads: int) -> None:
    global _WORKER
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # tokenizers' thread pool, read on first use
    tok = build(settings.tokenizer, need_eod=settings.append_eod)
    _size_threads(tok, threads)
    _WORKER = (settings, tok)


def _size_threads(tok: Tokenizer, cpus: int) -> None:
    """sentencepiece's own threads per batch call, for IN_FLIGHT calls at once on `cpus` CPUs. (The
    tokenizers library sizes Rayon's pool itself, one thread per CPU of the affinity mask:
    measured, `taskset -c 0` gives one; Rust's available_parallelism also clamps to a cgroup v2
    CPU quota, rust-lang/rust#92697, library/std/src/sys/unix/thread.rs. A worker process gets
    RAYON_NUM_THREADS, its share.)"""
    tok.threads = max(1, cpus // IN_FLIGHT)


@dataclass
class _Lines:
    lines: list[bytes]


def _work(group: list[list[bytes]]) -> list[ChunkResult]:
    """One call of a worker process: a group of chunks, pipelined inside the worker as in one
    process (so its tokenizer threads do not idle at each batch's tail either)."""
    assert _WORKER is not None
    return [result for _, result in _in_process([_Lines(lines) for lines in group], *_WORKER)]


def task_cpus() -> int:
    """The CPUs this task may use: its affinity mask (what Slurm's task/affinity or cgroup cpuset
    gives it), and no more than SLURM_CPUS_PER_TASK where Slurm sets it (--cpus-per-task), for
    clusters that limit a job's CPU time without pinning it (ConstrainCores=no)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    given = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if given.isdigit() and int(given) > 0:
        cpus = min(cpus, int(given))
    return max(1, cpus)


# data.workers unset: one process per this many CPUs for a tokenizer that releases the GIL. One
# process reaches raw encode_batch_fast speed on 2 CPUs (docs/preprocessing.md, "Speed"); what it
# cannot spread is its GIL-held work, about 0.9 s per 16 s of tokenizer CPU, so by that count one
# process serves about 16 CPUs (an estimate: no larger machine was available to measure).
NATIVE_CPUS_PER_WORKER = 16
# ... and at most this many processes for a tokenizer that holds the GIL (each holds a tokenizer).
MAX_AUTO_WORKERS = 32


def auto_workers(tok: Tokenizer, cpus: int | None = None) -> int:
    """Worker processes when data.workers is not set: for `tokenizers` and sentencepiece, 1 per
    NATIVE_CPUS_PER_WORKER CPUs of the task (rounded up); for the null tokenizer and the GPT-2
    Python path, which hold the GIL, one per CPU, at most MAX_AUTO_WORKERS."""
    cpus = max(1, cpus if cpus is not None else task_cpus())
    if tok.parallel_batches:
        return -(-cpus // NATIVE_CPUS_PER_WORKER)
    return min(cpus, MAX_AUTO_WORKERS)


# Chunks encoded side by side in one process, on threads, when the tokenizer's batch call runs
# outside the GIL (Tokenizer.parallel_batches). The tokenizers library (HF, the GPT-2 fast path)
# releases it for the whole batch (huggingface/tokenizers bindings/python/src/tokenizer.rs,
# encode_batch_fast: `py.detach`) and runs every call on Rayon's one global pool, so a second and
# third batch keep every Rayon thread busy through one batch's tail (it ends on its longest
# documents, one thread working), and the GIL-held Python work of a chunk (json.loads, the ids
# into numpy) overlaps the others' encoding. sentencepiece's batch encode releases it too.
# Measured in docs/preprocessing.md ("Speed"): 1 MiB chunks, 4 in flight.
IN_FLIGHT = 4
# Chunks submitted ahead of the oldest unfinished one. Results leave in input order, so with only
# IN_FLIGHT submitted, a slow oldest chunk (one long document) stops the others' threads once they
# finish: the CPUs idled every 4 chunks (1.1-1.4 of 2 busy). Queued chunks keep them fed.
AHEAD = 16
# ... and at most this many bytes of raw lines queued or in flight (a chunk is 1 MiB or one line,
# whichever is longer, so long documents are bounded by bytes, not by count).
AHEAD_BYTES = 32 << 20
# A worker process gets chunks in groups of this many (or this many bytes), 2 groups per worker
# in flight: enough for its own pipeline, and memory stays bounded. (One chunk per call for a
# tokenizer that holds the GIL: a worker encodes those one after another anyway.)
GROUP_CHUNKS = 2 * IN_FLIGHT
GROUP_BYTES = 8 << 20


def _serial(chunks: Iterable[Any], settings: EncodeSettings, tok: Tokenizer) -> Iterator[tuple[Any, ChunkResult]]:
    for chunk in chunks:
        yield chunk, encode_lines(chunk.lines, settings, tok)


def _in_process(chunks: Iterable[Any], settings: EncodeSettings, tok: Tokenizer) -> Iterator[tuple[Any, ChunkResult]]:
    return (_threaded if tok.parallel_batches else _serial)(chunks, settings, tok)


def _threaded(chunks: Iterable[Any], settings: EncodeSettings, tok: Tokenizer, in_flight: int | None = None,
              ahead: int | None = None, ahead_bytes: int | None = None) -> Iterator[tuple[Any, ChunkResult]]:
    """encode_lines of up to `in_flight` (default IN_FLIGHT) chunks at once on threads, with up to
    `ahead` (AHEAD) chunks and `ahead_bytes` (AHEAD_BYTES) of lines submitted past the oldest
    unfinished one; results in input order. An error reading the input (a corrupt .gz) comes after
    the results of every chunk read before it, as it would one chunk at a time."""
    in_flight = in_flight or IN_FLIGHT
    ahead = max(in_flight, ahead or AHEAD)
    ahead_bytes = ahead_bytes or AHEAD_BYTES
    from concurrent.futures import ThreadPoolExecutor

    pending: deque = deque()  # (chunk, future, bytes)
    queued = 0
    source = iter(chunks)
    pool = ThreadPoolExecutor(in_flight, thread_name_prefix="lingjun-encode")
    try:
        while True:
            try:
                chunk = next(source)
            except StopIteration:
                break
            except BaseException:
                while pending:  # what was read before the error, first
                    done, future, _ = pending.popleft()
                    yield done, future.result()
                raise
            size = sum(map(len, chunk.lines))
            pending.append((chunk, pool.submit(encode_lines, chunk.lines, settings, tok), size))
            chunk.lines = []  # the thread holds the only copy
            queued += size
            while pending and (len(pending) >= ahead or queued >= ahead_bytes or pending[0][1].done()):
                done, future, size = pending.popleft()
                queued -= size
                yield done, future.result()
        while pending:
            done, future, _ = pending.popleft()
            yield done, future.result()
    finally:
        # On an error or Ctrl-C: queued chunks are dropped; the batches already inside the
        # tokenizer (native code, not interruptible) finish on their threads and are discarded.
        pool.shutdown(wait=False, cancel_futures=True)


def encode_stream(chunks: Iterable[Any], settings: EncodeSettings, tok: Tokenizer,
                  workers: int) -> Iterator[tuple[Any, ChunkResult]]:
    """(chunk, result) in input order. workers == 1 encodes in this process (IN_FLIGHT chunks at
    once on threads where the tokenizer releases the GIL, else one after another); more start that
    many spawned processes, each given groups of chunks (GROUP_CHUNKS) that it encodes the same
    way, at most 2 groups per worker in flight so memory stays bounded."""
    if workers <= 1:
        _size_threads(tok, task_cpus())
        yield from _in_process(chunks, settings, tok)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    threads = max(1, task_cpus() // workers)
    per_group = GROUP_CHUNKS if tok.parallel_batches else 1  # a Python tokenizer gains nothing from groups
    ctx = multiprocessing.get_context("spawn")
    pending: deque = deque()  # (chunks of one group, future)
    group: list = []
    group_bytes = 0
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(settings, threads)) as pool:
        try:
            def submit() -> None:
                pending.append((group, pool.submit(_work, [c.lines for c in group])))
                for c in group:
                    c.lines = []  # the pool holds the only copy until the worker has it

            for chunk in chunks:
                group.append(chunk)
                group_bytes += sum(map(len, chunk.lines))
                if len(group) >= per_group or group_bytes >= GROUP_BYTES:
                    submit()
                    group, group_bytes = [], 0
                while len(pending) >= 2 * workers:
                    done, future = pending.popleft()
                    yield from zip(done, future.result())
            if group:
                submit()
            while pending:
                done, future = pending.popleft()
                yield from zip(done, future.result())
        except BrokenProcessPool:
            raise DataError("a tokenizer worker process died (killed, or out of memory?)") from None
        finally:
            for _, future in pending:
                future.cancel()
