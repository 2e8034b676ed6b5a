"""Slurm time limits: parse every form sbatch accepts and print one canonical form."""

from __future__ import annotations

import re

_FORMS = [
    # (regex, group names) in the order sbatch documents them
    (re.compile(r"^(?P<m>[0-9]+)$"), "minutes"),
    (re.compile(r"^(?P<m>[0-9]+):(?P<s>[0-9]+)$"), "minutes:seconds"),
    (re.compile(r"^(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)$"), "hours:minutes:seconds"),
    (re.compile(r"^(?P<d>[0-9]+)-(?P<h>[0-9]+)$"), "days-hours"),
    (re.compile(r"^(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+)$"), "days-hours:minutes"),
    (re.compile(r"^(?P<d>[0-9]+)-(?P<h>[0-9]+):(?P<m>[0-9]+):(?P<s>[0-9]+)$"), "days-hours:minutes:seconds"),
]

TIME_HELP = (
    'a Slurm time limit: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" or "D-HH:MM:SS"'
)


def parse_time(value: str | int) -> int:
    """Seconds in a Slurm time limit. Raises ValueError for anything sbatch would reject."""
    if isinstance(value, bool):
        raise ValueError(f"expected {TIME_HELP}, got {value!r}")
    text = str(value).strip()
    for regex, _name in _FORMS:
        match = regex.match(text)
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
            seconds = (
                parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
            )
            if seconds <= 0:
                raise ValueError(f"time limit must be positive, got {value!r}")
            return seconds
    raise ValueError(f"expected {TIME_HELP}, got {value!r}")


def format_time(seconds: int) -> str:
    """Canonical D-HH:MM:SS (HH:MM:SS under a day); Slurm rounds seconds up to minutes."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms
