"""Input files: globs, shard assignment, and streaming lines in bounded chunks.

Shard i of N gets whole files when there are at least N files (contiguous runs balanced by size,
order preserved); otherwise the uncompressed files are cut into N byte ranges at line boundaries
(a line belongs to the range where it starts) and compressed files stay whole. Concatenating the
shards' lines in shard order always gives the whole input in order.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from . import DataError

COMPRESSED = {".gz": "gz", ".zst": "zst", ".zstd": "zst"}
READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime_ns: int
    compression: str | None  # "gz", "zst" or None


@dataclass(frozen=True)
class Piece:
    """Lines of `file` that start in [start, end) (end None: to the end of the file)."""

    file: InputFile
    start: int = 0
    end: int | None = None

    def describe(self) -> dict:
        return {"path": self.file.path, "size": self.file.size, "mtime_ns": self.file.mtime_ns,
                "start": self.start, "end": self.end}

    @property
    def raw_bytes(self) -> int:
        return (self.file.size if self.end is None else self.end) - self.start


@dataclass
class Chunk:
    """Consecutive raw lines of one piece; line numbers are 1-based within the file."""

    piece_index: int
    first_line: int | None  # None when the piece starts mid-file (counted only if an error needs it)
    first_offset: int  # byte offset of lines[0] in the (uncompressed) file
    lines: list[bytes]
    raw_pos: int  # bytes of the on-disk file consumed so far (for progress)


def resolve_inputs(patterns: list[str]) -> list[InputFile]:
    """Paths and globs, in the order given; a glob's matches sorted; a file listed twice counts once."""
    if not patterns:
        raise DataError("data.inputs is empty: list the jsonl files (or globs) to preprocess")
    seen: set[str] = set()
    files: list[InputFile] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                raise DataError(f"input {pattern!r} matches no file")
        else:
            if not os.path.exists(pattern):
                raise DataError(f"input {pattern!r} does not exist")
            if not os.path.isfile(pattern):
                raise DataError(f"input {pattern!r} is not a file")
            matches = [pattern]
        for path in matches:
            real = os.path.abspath(path)
            if real in seen:
                continue
            seen.add(real)
            st = os.stat(real)
            ext = os.path.splitext(real)[1].lower()
            files.append(InputFile(real, st.st_size, st.st_mtime_ns, COMPRESSED.get(ext)))
    return files


def _balanced_cuts(weights: list[int], n: int) -> list[int]:
    """Indices 0 = c0 < c1 < ... < cn = len(weights) splitting weights into n non-empty runs."""
    m = len(weights)
    if sum(weights) == 0:
        weights = [1] * m
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    total = prefix[-1]
    cuts = [0]
    for k in range(1, n):
        target = total * k / n
        lo, hi = cuts[-1] + 1, m - (n - k)
        best = min(range(lo, hi + 1), key=lambda j: (abs(prefix[j] - target), j))
        cuts.append(best)
    cuts.append(m)
    return cuts


def assign(files: list[InputFile], shards: int) -> list[list[Piece]]:
    """The pieces of every shard, in order."""
    if len(files) >= shards:
        cuts = _balanced_cuts([f.size for f in files], shards)
        return [[Piece(f) for f in files[cuts[k]:cuts[k + 1]]] for k in range(shards)]
    total = sum(f.size for f in files)
    starts, pos = [], 0
    for f in files:
        starts.append(pos)
        pos += f.size
    bounds = [0]
    for k in range(1, shards):
        cut = total * k // shards
        for f, g in zip(files, starts):
            if f.compression and g < cut < g + f.size:  # never split a compressed file
                cut = g if cut - g <= g + f.size - cut else g + f.size
                break
        bounds.append(max(cut, bounds[-1]))
    bounds.append(total)
    out: list[list[Piece]] = []
    for k in range(shards):
        lo, hi = bounds[k], bounds[k + 1]
        pieces = []
        for f, g in zip(files, starts):
            a, b = max(lo, g), min(hi, g + f.size)
            if a >= b:
                continue
            if f.compression or (a == g and b == g + f.size):
                pieces.append(Piece(f))
            else:
                pieces.append(Piece(f, a - g, None if b == g + f.size else b - g))
        out.append(pieces)
    return out


class _Source:
    """An open piece: a binary line reader plus the raw file (for progress on compressed input)."""

    def __init__(self, piece: Piece) -> None:
        self.raw = open(piece.file.path, "rb", buffering=READ_BUFFER)
        self.reader: BinaryIO
        if piece.file.compression == "gz":
            self.reader = gzip.GzipFile(fileobj=self.raw, mode="rb")  # type: ignore[assignment]
        elif piece.file.compression == "zst":
            import zstandard

            stream = zstandard.ZstdDecompressor().stream_reader(self.raw, read_across_frames=True)
            self.reader = io.BufferedReader(stream, READ_BUFFER)  # type: ignore[arg-type]
        else:
            self.reader = self.raw

    def close(self) -> None:
        if self.reader is not self.raw:
            self.reader.close()
        self.raw.close()


def _lines(piece: Piece, src: _Source) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for every line that starts in the piece's range."""
    reader, pos = src.reader, 0
    if piece.start > 0:
        reader.seek(piece.start - 1)
        pos = piece.start
        if reader.read(1) != b"\n":  # mid-line: that line belongs to the previous range
            pos += len(reader.readline())
    while piece.end is None or pos < piece.end:
        line = reader.readline()
        if not line:
            return
        yield pos, line
        pos += len(line)


def read_chunks(pieces: list[Piece], chunk_lines: int = 2048, chunk_bytes: int = 4 << 20) -> Iterator[Chunk]:
    """Stream every piece's lines in chunks of at most chunk_lines lines / about chunk_bytes bytes."""
    for index, piece in enumerate(pieces):
        try:
            src = _Source(piece)
        except OSError as exc:
            raise DataError(f"cannot open {piece.file.path}: {exc.strerror or exc}") from None
        try:
            lines: list[bytes] = []
            size, first_off, number = 0, piece.start, 1 if piece.start == 0 else None
            line_no = number
            try:
                for off, line in _lines(piece, src):
                    if not lines:
                        first_off, number = off, line_no
                    lines.append(line)
                    size += len(line)
                    if line_no is not None:
                        line_no += 1
                    if len(lines) >= chunk_lines or size >= chunk_bytes:
                        yield Chunk(index, number, first_off, lines, src.raw.tell())
                        lines, size = [], 0
            except (OSError, EOFError, ValueError) as exc:  # truncated/corrupt compressed data
                raise DataError(f"cannot read {piece.file.path}: {exc}") from None
            if lines:
                yield Chunk(index, number, first_off, lines, src.raw.tell())
        finally:
            src.close()


def line_number(path: str, offset: int) -> int:
    """1-based number of the line starting at `offset` of an uncompressed file (counts newlines)."""
    count = 0
    with open(path, "rb") as fh:
        remaining = offset
        while remaining > 0:
            block = fh.read(min(remaining, 8 << 20))
            if not block:
                break
            count += block.count(b"\n")
            remaining -= len(block)
    return count + 1
