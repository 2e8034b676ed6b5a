"""Progress: a bar redrawn in place when stderr is a terminal, otherwise one log line every
`interval_s` (LINGJUN_PROGRESS_INTERVAL_S, default 10 s) with docs/s, MB/s and tokens/s; a summary
at the end. Plain text only: this runs inside the jobs, where rich may not be installed (only the
CLI wing draws with rich: tests/unit/test_wings.py)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

DEFAULT_INTERVAL_S = 10.0


def interval_from_env() -> float:
    try:
        return float(os.environ.get("LINGJUN_PROGRESS_INTERVAL_S", DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S


def _rate(value: float, seconds: float) -> float:
    return value / seconds if seconds > 0 else 0.0


class _TerminalBar:
    """One line redrawn with a carriage return, at most every 0.2 s: label, bar, percent, rates,
    elapsed and remaining time."""

    WIDTH = 30
    EVERY_S = 0.2

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.drawn_at = float("-inf")
        self.width = 0

    def draw(self, fraction: float, rates: str, elapsed_s: float, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.drawn_at < self.EVERY_S:
            return
        self.drawn_at = now
        fraction = min(max(fraction, 0.0), 1.0)
        filled = int(self.WIDTH * fraction)
        left = elapsed_s * (1 - fraction) / fraction if fraction > 0 else None
        eta = "-:--:--" if left is None else _clock(left)
        line = (f"{self.label} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {100 * fraction:5.1f}% {rates} "
                f"{_clock(elapsed_s)} elapsed, {eta} left")
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()
        self.width = len(line)

    def stop(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, label: str, total_raw: int, interval_s: float | None = None,
                 stream: TextIO | None = None) -> None:
        self.label = label
        self.total_raw = max(total_raw, 1)
        self.interval_s = interval_from_env() if interval_s is None else interval_s
        self.stream = stream or sys.stderr
        self.start = self.last = time.monotonic()
        self.docs = self.text_bytes = self.tokens = self.raw_done = 0
        self._bar: Any = None
        if getattr(self.stream, "isatty", lambda: False)():
            self._bar = _TerminalBar(self.stream, label)

    def rates(self) -> str:
        secs = time.monotonic() - self.start
        return (f"{_rate(self.docs, secs):,.0f} docs/s, {_rate(self.text_bytes, secs) / 1e6:,.2f} MB/s, "
                f"{_rate(self.tokens, secs):,.0f} tokens/s")

    def update(self, docs: int, text_bytes: int, tokens: int, raw_done: int) -> None:
        self.docs += docs
        self.text_bytes += text_bytes
        self.tokens += tokens
        self.raw_done = min(raw_done, self.total_raw)
        now = time.monotonic()
        if self._bar is not None:
            self._bar.draw(self.raw_done / self.total_raw, self.rates(), now - self.start)
        elif now - self.last >= self.interval_s:
            self.last = now
            pct = 100.0 * self.raw_done / self.total_raw
            print(f"{self.label}: {pct:5.1f}% {self.docs:,} docs, {self.text_bytes / 1e6:,.1f} MB, "
                  f"{self.tokens:,} tokens; {self.rates()}", file=self.stream, flush=True)

    def close(self) -> str:
        secs = time.monotonic() - self.start
        if self._bar is not None:
            self._bar.draw(1.0, self.rates(), secs, force=True)
            self._bar.stop()
        line = (f"{self.label}: done, {self.docs:,} docs, {self.text_bytes / 1e6:,.1f} MB, {self.tokens:,} "
                f"tokens in {secs:.1f} s ({self.rates()})")
        print(line, file=self.stream, flush=True)
        return line
