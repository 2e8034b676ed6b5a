"""Ways to damage a checkpoint copy."""

from __future__ import annotations

from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"


def flip_byte(path: Path, offset: int | None = None) -> int:
    """Invert one byte (the middle one by default); returns its offset."""
    data = bytearray(path.read_bytes())
    pos = len(data) // 2 if offset is None else offset
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))
    return pos


def truncate(path: Path, size: int) -> int:
    """Cut a file to size bytes; returns its former size."""
    before = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size)
    return before
