"""Message sizes as nccl-tests writes them: "8", "512K", "16G" (binary units, as its parsesize())."""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^(\d+)([KMGkmg]?)$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
MAX_BYTES = 1 << 40  # 1 TiB: far beyond any GPU's memory, so a typo is caught


def parse_size(text: str) -> int:
    """'16G' -> 17179869184 (K, M, G are powers of 1024, as in nccl-tests' parsesize). ValueError if bad."""
    match = _SIZE_RE.match(str(text).strip())
    if not match:
        raise ValueError(f"expected a size in bytes such as 8, 512K, 64M or 16G, got {text!r}")
    value = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if not 1 <= value <= MAX_BYTES:
        raise ValueError(f"size {text!r} must be between 1 byte and 1T")
    return value


def nccl_size(nbytes: int) -> str:
    """The shortest exact nccl-tests notation: 17179869184 -> '16G', 1000 -> '1000'."""
    for suffix in ("G", "M", "K"):
        unit = _UNITS[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def human_size(nbytes: int) -> str:
    """For tables and charts: 8 -> '8 B', 1048576 -> '1 MiB', 3221225472 -> '3 GiB', 1536 -> '1.5 KiB'."""
    for suffix, unit in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= unit:
            value = nbytes / unit
            return f"{value:.0f} {suffix}" if value == int(value) else f"{value:.3g} {suffix}"
    return f"{nbytes} B"
