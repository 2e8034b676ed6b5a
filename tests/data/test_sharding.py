"""Sharding: shard i of N reads its part; all shards in order == the whole input in order, so the
merge of N shards is byte-identical to one shard (also with .gz/.zst inputs and several workers)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from lingjun_slurm.injob.data.inputs import InputFile, Piece, assign, read_chunks, resolve_inputs
from tests.data.helpers import TOKENIZERS, corpus_rows, make_plan, run_all


def _file(path: Path, data: bytes) -> InputFile:
    path.write_bytes(data)
    return resolve_inputs([str(path)])[0]


def _lines(pieces: list[Piece]) -> list[bytes]:
    return [line for chunk in read_chunks(pieces, chunk_lines=3, chunk_bytes=50) for line in chunk.lines]


def test_whole_files_when_there_are_at_least_n_balanced_and_in_order(tmp_path: Path) -> None:
    sizes = [100, 10, 10, 10, 90, 5, 5, 80]
    files = [_file(tmp_path / f"{i}.jsonl", b"x" * s) for i, s in enumerate(sizes)]
    layout = assign(files, 3)
    assert [[p.file for p in shard] for shard in layout] == [files[0:1], files[1:5], files[5:8]]
    assert all(p.start == 0 and p.end is None for shard in layout for p in shard)
    assert [len(s) for s in assign(files, 8)] == [1] * 8


def test_fewer_files_than_shards_split_at_line_boundaries(tmp_path: Path) -> None:
    rng = random.Random(7)
    for trial in range(40):
        files, everything = [], []
        for i in range(rng.randint(1, 3)):
            lines = [b"y" * rng.choice([0, 1, 5, 40, 200]) + b"\n" for _ in range(rng.randint(0, 30))]
            if lines and rng.random() < 0.5:
                lines[-1] = lines[-1].rstrip(b"\n")  # no newline at the end of the file
            data = b"".join(lines)
            name = tmp_path / f"t{trial}-{i}.jsonl"
            if rng.random() < 0.3:
                name = name.with_suffix(".jsonl.gz")
                files.append(_file(name, gzip.compress(data)))
            else:
                files.append(_file(name, data))
            everything += [ln for ln in data.splitlines(keepends=True)]
        shards = rng.randint(len(files) + 1, 9)
        layout = assign(files, shards)
        assert len(layout) == shards
        assert [ln for shard in layout for ln in _lines(shard)] == everything
        for shard in layout:
            for piece in shard:
                if piece.file.compression:
                    assert (piece.start, piece.end) == (0, None)  # never byte-split


def test_a_line_belongs_to_the_range_where_it_starts(tmp_path: Path) -> None:
    f = _file(tmp_path / "a.jsonl", b"aaaa\nbbbb\ncccc\n")
    assert _lines([Piece(f, 0, 5)]) == [b"aaaa\n"]
    assert _lines([Piece(f, 1, 6)]) == [b"bbbb\n"]  # starts at 5, inside [1, 6)
    assert _lines([Piece(f, 5, 10)]) == [b"bbbb\n"]
    assert _lines([Piece(f, 6, 11)]) == [b"cccc\n"]
    assert _lines([Piece(f, 11, None)]) == []


def _big_corpus(tmp_path: Path) -> list[str]:
    import zstandard

    rows = corpus_rows()
    text = "".join(json.dumps(rows[i % len(rows)], ensure_ascii=bool(i % 2)) + "\n" for i in range(150))
    data = text.encode("utf-8")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(data)
    mid = data.index(b"\n", len(data) // 2) + 1
    (tmp_path / "in" / "b.jsonl.gz").write_bytes(gzip.compress(data[:mid]))
    half = data[mid:]
    cut = half.index(b"\n", len(half) // 2) + 1
    frames = zstandard.ZstdCompressor().compress(half[:cut]) + zstandard.ZstdCompressor().compress(half[cut:])
    (tmp_path / "in" / "c.jsonl.zst").write_bytes(frames)  # two frames
    return [str(tmp_path / "in" / "a.jsonl"), str(tmp_path / "in" / "b.jsonl.gz"), str(tmp_path / "in" / "c.jsonl.zst")]


def _outputs(out: Path, keys: list[str]) -> dict[str, bytes]:
    return {f"{k}{ext}": (out / f"corpus_{k}_document{ext}").read_bytes() for k in keys for ext in (".bin", ".idx")}


@pytest.mark.parametrize("tok", ["gpt2", "hf"])
def test_merged_shards_are_byte_identical_to_one_shard(tok: str, tmp_path: Path) -> None:
    inputs = _big_corpus(tmp_path)
    keys = ["text", "title"]
    results = {}
    for shards, workers in ((1, 1), (2, 1), (5, 1), (3, 2)):
        out = tmp_path / f"out-{shards}-{workers}"
        run_all(make_plan(out, TOKENIZERS[tok], keys, inputs=inputs, shards=shards, workers=workers))
        results[(shards, workers)] = _outputs(out, keys)
    one = results.pop((1, 1))
    assert len(one["text.bin"]) > 5000
    for layout, got in results.items():
        assert got == one, f"shards/workers {layout} differ from one shard"
