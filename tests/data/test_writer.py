"""data/writer.py writes megatron-core's .bin/.idx format with numpy alone: the same bytes as
megatron-core's own IndexedDatasetBuilder (add_document per document, add_index per input,
finalize), for uint16 and int32 datasets, empty documents and empty inputs included."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from lingjun_slurm.injob.data import DataError
from lingjun_slurm.injob.data.encode import KeyDocs
from lingjun_slurm.injob.data.writer import DatasetWriter, merge, optimal_dtype, read_index


def builder_module():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def random_docs(seed: int, n_docs: int, vocab: int) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        lengths = [int(x) for x in rng.integers(1, 40, size=int(rng.integers(0, 4)))]
        docs.append(([int(x) for x in rng.integers(0, vocab, size=sum(lengths))], lengths))
    return docs


def as_keydocs(docs: list[tuple[list[int], list[int]]], dtype: str) -> KeyDocs:
    flat = [t for ids, _ in docs for t in ids]
    return KeyDocs(np.array(flat, dtype=dtype), np.array([len(ids) for ids, _ in docs], dtype=np.int64),
                   np.array([n for _, lens in docs for n in lens], dtype=np.int32),
                   np.array([len(lens) for _, lens in docs], dtype=np.int64))


def write_ours(prefix: Path, chunks: list[list[tuple[list[int], list[int]]]], vocab: int) -> None:
    w = DatasetWriter(str(prefix), vocab)
    for chunk in chunks:
        w.add(as_keydocs(chunk, w.dtype))
    w.finalize()
    w.commit()


def write_megatron(prefix: Path, docs: list[tuple[list[int], list[int]]], vocab: int) -> None:
    m = builder_module()
    b = m.IndexedDatasetBuilder(f"{prefix}.bin", dtype=m.DType.optimal_dtype(vocab))
    for ids, lengths in docs:
        b.add_document(ids, lengths)
    b.finalize(f"{prefix}.idx")


def same(a: Path, b: Path) -> None:
    for ext in (".bin", ".idx"):
        assert Path(f"{a}{ext}").read_bytes() == Path(f"{b}{ext}").read_bytes(), ext


@pytest.mark.parametrize("vocab", [300, 65499, 65500, 200_000])
def test_writer_bytes_equal_megatron_cores_builder(vocab: int, tmp_path: Path) -> None:
    assert optimal_dtype(vocab) == builder_module().DType.optimal_dtype(vocab).__name__
    chunks = [random_docs(s, n, vocab) for s, n in ((1, 50), (2, 0), (3, 7), (4, 1))]
    write_ours(tmp_path / "ours", chunks, vocab)
    write_megatron(tmp_path / "mlm", [d for c in chunks for d in c], vocab)
    same(tmp_path / "ours", tmp_path / "mlm")
    dtype, lengths, docs = read_index(str(tmp_path / "ours.idx"))
    assert dtype == optimal_dtype(vocab) and docs[0] == 0 and len(docs) == 59


@pytest.mark.parametrize("parts", [[40], [40, 0, 13], [0, 0], [5, 9, 1, 0, 22]])
def test_merge_bytes_equal_megatron_cores_add_index(parts: list[int], tmp_path: Path) -> None:
    vocab = 1000
    prefixes = []
    for i, n in enumerate(parts):
        prefix = tmp_path / f"part{i}"
        write_ours(prefix, [random_docs(10 + i, n, vocab)], vocab)
        prefixes.append(str(prefix))
    documents, tokens = merge(prefixes, str(tmp_path / "ours"))
    m = builder_module()
    b = m.IndexedDatasetBuilder(str(tmp_path / "mlm.bin"), dtype=m.DType.optimal_dtype(vocab))
    for prefix in prefixes:
        b.add_index(prefix)
    b.finalize(str(tmp_path / "mlm.idx"))
    same(tmp_path / "ours", tmp_path / "mlm")
    assert documents == sum(parts)
    assert tokens == sum(b.sequence_lengths)
    assert not list(tmp_path.glob("*.tmp"))


def test_merge_refuses_shards_of_different_dtypes(tmp_path: Path) -> None:
    write_ours(tmp_path / "a", [random_docs(1, 3, 300)], 300)
    write_ours(tmp_path / "b", [random_docs(2, 3, 300)], 70000)
    with pytest.raises(DataError, match="dtype int32, the first shard uint16"):
        merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out"))
    assert not list(tmp_path.glob("out*"))


def test_a_damaged_index_is_a_data_error(tmp_path: Path) -> None:
    write_ours(tmp_path / "a", [random_docs(1, 3, 300)], 300)
    (tmp_path / "b.bin").write_bytes(b"")
    (tmp_path / "b.idx").write_bytes(b"MMIDIDX\x00\x00" + b"\x00" * 5)
    with pytest.raises(DataError, match="not a Megatron index file"):
        merge([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "out"))
