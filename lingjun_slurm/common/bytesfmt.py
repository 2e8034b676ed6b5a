"""Byte counts as people read them: `image list`, `plan` and `report` print sizes this one way."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1023 -> '1023 B', 1536 -> '1.5 KiB', 3 * 2**30 -> '3.0 GiB', up to TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable: TiB is the last unit
