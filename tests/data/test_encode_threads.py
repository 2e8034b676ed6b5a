"""The in-process encode pipeline (lingjun_slurm/injob/data/encode.py, _threaded): chunks are encoded side by
side where the tokenizer releases the GIL, results come back in input order whatever order the
batches finish in, an error names its own line, and the bytes equal the one-after-another path's.
No timing: concurrency is shown with a barrier that only opens when two batches are inside the
tokenizer at once."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from lingjun_slurm.injob.data import DataError, encode
from lingjun_slurm.injob.data.encode import EncodeSettings, encode_stream
from lingjun_slurm.injob.data.inputs import read_chunks
from lingjun_slurm.injob.data.tokenizer import Tokenizer, TokenizerSpec, build

from .helpers import TOKENIZERS


@dataclass
class _Chunk:
    lines: list[bytes]


def _lines(*texts: str) -> list[bytes]:
    return [json.dumps({"text": t}).encode() + b"\n" for t in texts]


class _Gate(Tokenizer):
    """A stand-in native tokenizer: ids are the text's integers; calls can be held at a gate."""

    def __init__(self, on_call) -> None:  # type: ignore[no-untyped-def]
        super().__init__(TokenizerSpec(type="null", vocab_size=100), 101, 100, describe="gate")
        self.on_call = on_call

    @property
    def parallel_batches(self) -> bool:
        return True

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self.on_call(texts)
        return [[int(x) for x in t.split()] for t in texts]


SETTINGS = EncodeSettings(("text",), True, TokenizerSpec(type="null", vocab_size=100))


def test_two_batches_are_inside_the_tokenizer_at_once() -> None:
    barrier = threading.Barrier(2, timeout=20)  # a serial pipeline never gets the second call in: broken

    def on_call(texts: list[str]) -> None:
        if texts[0] in ("1", "2"):
            barrier.wait()

    tok = _Gate(on_call)
    chunks = [_Chunk(_lines("1")), _Chunk(_lines("2")), _Chunk(_lines("3"))]
    out = [r.docs["text"].tokens.tolist() for _, r in encode_stream(chunks, SETTINGS, tok, workers=1)]
    assert out == [[1, 100], [2, 100], [3, 100]]


def test_results_in_input_order_when_a_later_batch_finishes_first() -> None:
    second_done = threading.Event()
    order: list[str] = []

    def on_call(texts: list[str]) -> None:
        if texts[0] == "1":
            assert second_done.wait(20), "the second batch never ran while the first was held"
        order.append(texts[0])
        if texts[0] == "2":
            second_done.set()

    tok = _Gate(on_call)
    chunks = [_Chunk(_lines(str(i))) for i in range(1, 8)]
    results = list(encode_stream(chunks, SETTINGS, tok, workers=1))
    assert order.index("2") < order.index("1")  # finished out of order ...
    assert [r.docs["text"].tokens.tolist()[0] for _, r in results] == list(range(1, 8))  # ... yielded in order
    assert [c for c, _ in results] == chunks


def test_a_python_tokenizer_stays_on_one_thread() -> None:
    names: set[str] = set()
    tok = build(TokenizerSpec(type="null", vocab_size=100), need_eod=True)
    assert not tok.parallel_batches
    real = tok.encode_batch

    def spy(texts: list[str]) -> list[list[int]]:
        names.add(threading.current_thread().name)
        return real(texts)

    tok.encode_batch = spy  # type: ignore[method-assign]
    list(encode_stream([_Chunk(_lines("1 2")), _Chunk(_lines("3"))], SETTINGS, tok, workers=1))
    assert names == {threading.current_thread().name}


@pytest.mark.parametrize("name", ["hf", "sp", "gpt2"])
def test_native_tokenizers_pipeline_and_match_the_serial_path(name: str, tmp_path: Path) -> None:
    spec = TokenizerSpec.from_settings(TOKENIZERS[name])
    tok = build(spec, need_eod=True)
    assert tok.parallel_batches
    texts = [f"document {i}: " + "naïve façade, 数据 🚀 " * (i % 7) + "end" for i in range(300)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(_lines(*texts)))
    settings = EncodeSettings(("text",), True, spec)

    from lingjun_slurm.injob.data.inputs import assign, resolve_inputs

    pieces = assign(resolve_inputs([str(path)]), 1)[0]

    def collect(stream) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
        results = [r for _, r in stream]
        assert all(r.error is None for r in results)
        return (np.concatenate([r.docs["text"].tokens for r in results]),
                np.concatenate([r.docs["text"].sentence_lengths for r in results]))

    threaded = collect(encode._threaded(read_chunks(pieces, 7, 1 << 20), settings, tok))
    serial = collect(encode._serial(read_chunks(pieces, 7, 1 << 20), settings, tok))
    assert len(threaded[1]) == 300
    assert np.array_equal(threaded[0], serial[0]) and np.array_equal(threaded[1], serial[1])


def test_an_error_in_a_later_chunk_names_its_line(tmp_path: Path) -> None:
    from lingjun_slurm.injob.data.shard import DataSettings, run_shard

    path = tmp_path / "in.jsonl"
    good = _lines(*[f"text {i}" for i in range(40)])
    path.write_bytes(b"".join(good[:33]) + b'{"text": 5}\n' + b"".join(good[33:]))
    ds = DataSettings(inputs=[str(path)], keys=("text",), append_eod=True,
                      tokenizer=TokenizerSpec.from_settings(TOKENIZERS["hf"]), shards=1, workers=1,
                      output_prefix=str(tmp_path / "out"), shard_dir=str(tmp_path / "shards"))
    import io

    import lingjun_slurm.injob.data.shard as shard

    old = shard.CHUNK_LINES
    shard.CHUNK_LINES = 4  # ten chunks, three in flight when line 34's chunk fails
    try:
        with pytest.raises(DataError, match=rf"{path}:34: key 'text' is int"):
            run_shard(ds, 0, log=io.StringIO())
    finally:
        shard.CHUNK_LINES = old
    assert not list((tmp_path / "shards").glob("*.bin*"))  # partial outputs removed


def test_workers_unset_are_chosen_from_the_cpus_and_the_tokenizer(tmp_path: Path) -> None:
    from lingjun_slurm.injob.data.encode import NATIVE_CPUS_PER_WORKER, auto_workers

    native = build(TokenizerSpec.from_settings(TOKENIZERS["hf"]), need_eod=True)
    python = build(TokenizerSpec(type="null", vocab_size=100), need_eod=True)
    assert [auto_workers(native, c) for c in (1, 2, NATIVE_CPUS_PER_WORKER, NATIVE_CPUS_PER_WORKER + 1, 64)] == \
        [1, 1, 1, 2, 64 // NATIVE_CPUS_PER_WORKER]
    assert [auto_workers(python, c) for c in (1, 2, 8)] == [1, 2, 8]

    import io

    from lingjun_slurm.injob.data.shard import DataSettings, run_shard

    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(_lines("a b", "c")))
    for workers, said in ((None, "1 worker(s) (data.workers unset: chosen for"), (3, "3 worker(s)\n")):
        log = io.StringIO()
        ds = DataSettings(inputs=[str(path)], keys=("text",), append_eod=True,
                          tokenizer=TokenizerSpec.from_settings(TOKENIZERS["hf"]), shards=1, workers=workers,
                          output_prefix=str(tmp_path / f"out{workers}"), shard_dir=str(tmp_path / f"shards{workers}"))
        run_shard(ds, 0, log=log)
        assert said in log.getvalue()


def test_megatron_lm_tool_gets_the_task_cpus_when_workers_are_unset() -> None:
    import copy

    from lingjun_slurm.megatron.args import preprocess_args
    from tools import megatron_variants as mv

    raw = mv.base_spec("0.16.1")
    for workers, expect in ((None, '"$(nproc)"'), (6, "6")):
        doc = copy.deepcopy(raw)
        doc["data"].pop("workers", None)
        if workers:
            doc["data"]["workers"] = workers
        argv = [str(w) for w in preprocess_args(mv._parse(doc), "/in.jsonl", "/out/corpus")]
        assert argv[argv.index("--workers") + 1] == expect


def test_a_slow_oldest_chunk_does_not_stop_the_others() -> None:
    """Results leave in input order, but while the oldest chunk is still encoding (one long
    document), later chunks keep the other threads busy: chunk 6 is encoded before chunk 1 ends."""
    later_done = threading.Event()

    def on_call(texts: list[str]) -> None:
        if texts[0] == "1":
            assert later_done.wait(20), "chunks past the in-flight count waited for the oldest"
        if texts[0] == "6":
            later_done.set()

    tok = _Gate(on_call)
    chunks = [_Chunk(_lines(str(i))) for i in range(1, 12)]
    results = list(encode._threaded(chunks, SETTINGS, tok, in_flight=2, ahead=8))
    assert [r.docs["text"].tokens.tolist()[0] for _, r in results] == list(range(1, 12))


def test_task_cpus_honours_slurm_cpus_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.injob.data.encode import MAX_AUTO_WORKERS, auto_workers, task_cpus

    monkeypatch.setattr(encode.os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert task_cpus() == 64
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")  # a CPU-time limit without pinning
    assert task_cpus() == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "junk")
    assert task_cpus() == 64
    python = build(TokenizerSpec(type="null", vocab_size=100), need_eod=True)
    assert auto_workers(python, 128) == MAX_AUTO_WORKERS


def test_a_read_error_comes_after_the_chunks_read_before_it() -> None:
    tok = _Gate(lambda texts: None)

    def source():  # type: ignore[no-untyped-def]
        yield _Chunk(_lines("1"))
        yield _Chunk([b'{"text": 5}\n'])  # this chunk's own error must come first
        raise DataError("cannot read x.jsonl.gz: corrupt")

    seen = []
    with pytest.raises(DataError, match="corrupt"):
        for _, result in encode._threaded(source(), SETTINGS, tok):
            seen.append(result.error[1] if result.error else result.docs["text"].tokens.tolist())
    assert seen == [[1, 100], "key 'text' is int; expected a string or a list of strings"]


def test_queued_lines_are_bounded_by_bytes() -> None:
    pulled = [0]
    release = threading.Event()
    at_release: list[int] = []

    def on_call(texts: list[str]) -> None:
        if texts[0].startswith("1 "):
            release.wait(1.0)  # hold the oldest chunk; a slower machine pulls less, never more
            at_release.append(pulled[0])

    def source():  # type: ignore[no-untyped-def]
        for i in range(1, 40):
            pulled[0] += 1
            yield _Chunk(_lines(f"{i} " + "7 " * 500))

    size = len(_lines("1 " + "7 " * 500)[0])
    out = list(encode._threaded(source(), SETTINGS, _Gate(on_call), in_flight=2, ahead=30, ahead_bytes=3 * size))
    assert len(out) == 39
    assert at_release and at_release[0] <= 4, at_release  # 3 chunks' bytes queued, +1 being read


@pytest.mark.parametrize("name", ["hf", "null"])
def test_worker_processes_take_groups_and_match_one_process(name: str, tmp_path: Path) -> None:
    spec = TokenizerSpec.from_settings(TOKENIZERS[name])
    tok = build(spec, need_eod=True)
    texts = [" ".join(str(i % 500) for i in range(n % 40 + 1)) if name == "null" else f"doc {n} " * (n % 9)
             for n in range(200)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(_lines(*texts)))
    settings = EncodeSettings(("text",), True, spec)
    from lingjun_slurm.injob.data.inputs import assign, resolve_inputs

    pieces = assign(resolve_inputs([str(path)]), 1)[0]
    one = [r.docs["text"].tokens.tolist() for _, r in encode_stream(read_chunks(pieces, 5, 1 << 20), settings, tok, 1)]
    two = [(c.first_offset, r.docs["text"].tokens.tolist())
           for c, r in encode_stream(read_chunks(pieces, 5, 1 << 20), settings, tok, 2)]
    assert [t for _, t in two] == one and len(one) == 40
    assert [o for o, _ in two] == sorted(o for o, _ in two)  # each chunk paired with its own result
