"""Megatron-LM versions: parsing, the supported floor, and which flags a version has.

Megatron-LM tags its releases core_vX.Y.Z (megatron-core X.Y.Z); older images carry
calendar tags such as 23.06 (PAI's megatron-training:23.06 images). The supported floor
is the megatron-core 0.16 era; flags and their first/last versions live in
presets/megatron_flags.yaml, so adding a version is a data change.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..presets import load

FLOOR = (0, 16)
FLOOR_TEXT = "core_v0.16.x (megatron-core 0.16)"

_CORE_RE = re.compile(r"^(?:core_[vr])?v?(\d+)\.(\d+)(?:\.(\d+))?(?:rc\d+)?$")
_CALENDAR_RE = re.compile(r"^(\d{2})\.(\d{2})(?:[.-].*)?$")

Version = tuple[int, int, int]


def parse_version(raw: str | float | int) -> Version:
    """'0.16.1' / 'core_v0.16.1' / 'core_r0.16.0' -> (0, 16, 1); ValueError otherwise.

    Calendar versions (e.g. '23.06') and anything below the floor get an error naming it.
    """
    text = str(raw).strip()
    cal = _CALENDAR_RE.match(text)
    if cal and int(cal.group(1)) >= 19:
        raise ValueError(
            f"Megatron-LM {text} is a calendar release that predates the supported floor {FLOOR_TEXT}; "
            "use an image with megatron-core >= 0.16 and give its version, e.g. '0.16.1'"
        )
    match = _CORE_RE.match(text)
    if not match:
        raise ValueError(f"expected a Megatron-LM version like '0.16.1' or 'core_v0.16.1', got {text!r}")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    if version[:2] < FLOOR:
        raise ValueError(
            f"Megatron-LM {text} is older than the supported floor {FLOOR_TEXT}; "
            "use an image with megatron-core >= 0.16"
        )
    return version


@lru_cache(maxsize=None)
def _table() -> dict[str, dict[str, tuple[Version | None, Version | None]]]:
    out: dict[str, dict[str, tuple[Version | None, Version | None]]] = {}
    for script, flags in load("megatron_flags.yaml").items():
        out[script] = {}
        for flag, rng in flags.items():
            since = parse_version(rng["since"]) if rng.get("since") else None
            until = _parse_any(rng["removed"]) if rng.get("removed") else None
            out[script][flag] = (since, until)
    return out


def _parse_any(text: str) -> Version:
    match = _CORE_RE.match(str(text))
    if not match:
        raise ValueError(f"bad version in megatron_flags.yaml: {text!r}")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def has_flag(script: str, flag: str, version: Version) -> bool:
    """True if that script of that Megatron-LM version accepts the flag.

    A flag missing from the table is a programming error: every flag this tool emits is
    listed there, with the version range it exists in.
    """
    try:
        since, removed = _table()[script][flag]
    except KeyError:
        raise KeyError(f"{script} flag {flag} is not in megatron_flags.yaml") from None
    if since is not None and version < since:
        return False
    return not (removed is not None and version >= removed)


def known_flags(script: str) -> list[str]:
    return sorted(_table()[script])
