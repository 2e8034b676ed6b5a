"""Write and merge Megatron .bin/.idx with numpy alone, under temp names that are renamed into place
only when complete.

The format is megatron-core's (megatron/core/datasets/indexed_dataset.py, core_v0.16.1,
`IndexedDatasetBuilder` and `_IndexWriter`), re-implemented so that a preprocess or merge task
imports neither torch nor megatron-core (seconds and ~400 MB of start-up):

- `.bin`: every document's token ids, concatenated, in the dataset dtype (`add_document`:
  `numpy.array(tokens, dtype).tobytes(order="C")`).
- `.idx`: `b"MMIDIDX\\x00\\x00"`; `<Q` 1 (the version); `<B` the dtype code (`DType`: uint8 1,
  int8 2, int16 3, int32 4, int64 5, float64 6, float32 7, uint16 8); `<Q` sequence count; `<Q`
  document count; the sequence lengths as int32; the sequence pointers (byte offset of each
  sequence in the .bin: the running sum of length * itemsize, starting at 0) as int64; the document
  indices (0, then the sequence count after each document) as int64. No sequence modes (not
  multimodal). All native byte order, which Megatron's numpy writes too (little-endian here).
- merge (`add_index` + `finalize`, as tools/merge_datasets.py): lengths concatenated, document
  indices offset by the sequences before and concatenated without each input's leading 0, the
  .bin files copied in order; the dtype is the first input's and every other must equal it.

tests/data check the bytes against megatron-core's own builder.
"""

from __future__ import annotations

import os
import shutil
import struct
from array import array

import numpy as np

from . import DataError
from .encode import KeyDocs

INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
CODE_DTYPES = {code: name for name, code in DTYPE_CODES.items()}
HEADER_BYTES = 9 + 8 + 1 + 8 + 8


def optimal_dtype(vocab_size: int | None) -> str:
    """DType.optimal_dtype: uint16 below 65500 (and not None), else int32."""
    return "uint16" if vocab_size is not None and vocab_size < 65500 else "int32"


def write_index(path: str, dtype: str, sequence_lengths: np.ndarray, document_indices: np.ndarray) -> None:
    """_IndexWriter.write(sequence_lengths, None, document_indices) into `path`."""
    lengths = np.asarray(sequence_lengths, dtype=np.int32)
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * np.dtype(dtype).itemsize, out=pointers[1:])
    docs = np.asarray(document_indices, dtype=np.int64)
    with open(path, "wb") as fh:
        fh.write(INDEX_HEADER)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", DTYPE_CODES[dtype]))
        fh.write(struct.pack("<Q", len(lengths)))
        fh.write(struct.pack("<Q", len(docs)))
        fh.write(lengths.tobytes(order="C"))
        fh.write(pointers.tobytes(order="C"))
        fh.write(docs.tobytes(order="C"))


def read_header(path: str) -> tuple[str, int, int]:
    """(dtype name, sequence count, document count) of an .idx, from its first 34 bytes."""
    with open(path, "rb") as fh:
        head = fh.read(HEADER_BYTES)
    if len(head) < HEADER_BYTES or head[:9] != INDEX_HEADER or struct.unpack("<Q", head[9:17])[0] != 1:
        raise DataError(f"{path} is not a Megatron index file (version 1)")
    code = head[17]
    if code not in CODE_DTYPES:
        raise DataError(f"{path} has an unknown dtype code {code}")
    sequences, documents = struct.unpack("<QQ", head[18:34])
    return CODE_DTYPES[code], sequences, documents


def read_index(path: str) -> tuple[str, np.ndarray, np.ndarray]:
    """(dtype name, sequence lengths int32, document indices int64) of an .idx (_IndexReader)."""
    dtype, sequences, documents = read_header(path)
    with open(path, "rb") as fh:
        fh.seek(HEADER_BYTES)
        lengths = np.fromfile(fh, dtype=np.int32, count=sequences)
        fh.seek(HEADER_BYTES + 4 * sequences + 8 * sequences)
        docs = np.fromfile(fh, dtype=np.int64, count=documents)
    if len(lengths) != sequences or len(docs) != documents:
        raise DataError(f"{path} is cut short")
    return dtype, lengths, docs


def tmp_name(path: str) -> str:
    return f"{path}.tmp"


def remove_quietly(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class DatasetWriter:
    """One output dataset `{prefix}.bin/.idx`, written as `.bin.tmp/.idx.tmp` until commit().

    The index is kept as typed arrays (12 bytes per sentence and document) until finalize; the .bin
    is written as it goes, one write per chunk (the chunk's ids are already in the dataset dtype)."""

    def __init__(self, prefix: str, vocab_size: int) -> None:
        self.prefix = prefix
        self.bin_path, self.idx_path = f"{prefix}.bin", f"{prefix}.idx"
        self.dtype = optimal_dtype(vocab_size)
        self.data_file = open(tmp_name(self.bin_path), "wb", buffering=1 << 20)
        self.sequence_lengths = array("i")
        self.document_indices = array("q", [0])
        self.documents = 0
        self.tokens = 0

    def add(self, docs: KeyDocs) -> None:
        tokens = np.asarray(docs.tokens, dtype=self.dtype)
        self.data_file.write(tokens.tobytes(order="C"))
        before = len(self.sequence_lengths)
        self.sequence_lengths.frombytes(np.asarray(docs.sentence_lengths, dtype=np.int32).tobytes())
        ends = before + np.cumsum(np.asarray(docs.doc_sentences, dtype=np.int64))
        self.document_indices.frombytes(ends.astype(np.int64).tobytes())
        self.documents += len(docs.doc_tokens)
        self.tokens += len(tokens)

    def finalize(self) -> None:
        self.data_file.close()
        write_index(tmp_name(self.idx_path), self.dtype, np.frombuffer(self.sequence_lengths, dtype=np.int32),
                    np.frombuffer(self.document_indices, dtype=np.int64))

    def commit(self) -> None:
        os.replace(tmp_name(self.bin_path), self.bin_path)
        os.replace(tmp_name(self.idx_path), self.idx_path)

    def abort(self) -> None:
        try:
            self.data_file.close()
        finally:
            remove_quietly(tmp_name(self.bin_path), tmp_name(self.idx_path))


def _append_file(src: str, dst_fh) -> None:  # type: ignore[no-untyped-def]
    """Append src to the open file dst_fh: copy_file_range (in-kernel; a reflink where the file
    system can) where there is one, else a buffered copy."""
    dst_fh.flush()
    with open(src, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        copy_range = getattr(os, "copy_file_range", None)
        if copy_range is not None:
            done = 0
            try:
                while done < size:
                    n = copy_range(fh.fileno(), dst_fh.fileno(), size - done)
                    if n == 0:
                        break
                    done += n
                if done == size:
                    return
            except OSError:
                pass
            fh.seek(done)
            dst_fh.seek(0, os.SEEK_END)
        shutil.copyfileobj(fh, dst_fh, 8 << 20)


def merge(prefixes: list[str], out_prefix: str) -> tuple[int, int]:
    """Concatenate datasets in order, as IndexedDatasetBuilder.add_index + finalize (Megatron-LM's
    tools/merge_datasets.py; it takes the dtype from the first input). Returns (documents, tokens).
    Atomic: temp names, then rename. One input is hard-linked (the same bytes), or copied."""
    for prefix in prefixes:
        for ext in (".bin", ".idx"):
            if not os.path.isfile(prefix + ext):
                raise DataError(f"{prefix + ext} is missing")
    bin_tmp, idx_tmp = tmp_name(f"{out_prefix}.bin"), tmp_name(f"{out_prefix}.idx")
    headers = [read_header(f"{p}.idx") for p in prefixes]
    dtype = headers[0][0]
    for prefix, (other, _, _) in zip(prefixes, headers):
        if other != dtype:
            raise DataError(f"{prefix}.idx has dtype {other}, the first shard {dtype}: the shards come from "
                            "different tokenizers")
    try:
        remove_quietly(bin_tmp, idx_tmp)
        if len(prefixes) == 1:
            for ext, tmp in ((".bin", bin_tmp), (".idx", idx_tmp)):
                try:
                    os.link(prefixes[0] + ext, tmp)
                except OSError:
                    shutil.copyfile(prefixes[0] + ext, tmp)
            _, lengths, docs = read_index(f"{prefixes[0]}.idx")
            documents, tokens = len(docs) - 1, int(lengths.sum(dtype=np.int64))
        else:
            all_lengths, all_docs = [], [np.zeros(1, dtype=np.int64)]
            offset = 0
            with open(bin_tmp, "wb", buffering=0) as out:
                for prefix in prefixes:
                    _, lengths, docs = read_index(f"{prefix}.idx")
                    all_lengths.append(lengths)
                    all_docs.append(offset + docs[1:])
                    offset += len(lengths)
                    _append_file(f"{prefix}.bin", out)
            lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, dtype=np.int32)
            docs = np.concatenate(all_docs)
            write_index(idx_tmp, dtype, lengths, docs)
            documents, tokens = len(docs) - 1, int(lengths.sum(dtype=np.int64))
    except BaseException:
        remove_quietly(bin_tmp, idx_tmp)
        raise
    os.replace(bin_tmp, f"{out_prefix}.bin")
    os.replace(idx_tmp, f"{out_prefix}.idx")
    return documents, tokens
