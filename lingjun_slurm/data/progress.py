"""Progress: a rich bar when stderr is a terminal, otherwise one log line every `interval_s`
(LINGJUN_PROGRESS_INTERVAL_S, default 10 s) with docs/s, MB/s and tokens/s; a summary at the end."""

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
        self._task: Any = None
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import (BarColumn, Progress as RichProgress, TaskProgressColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                     TextColumn("{task.fields[rates]}"), TimeElapsedColumn(),
                                     TimeRemainingColumn(), console=Console(file=self.stream))
            self._task = self._bar.add_task(label, total=self.total_raw, rates="")
            self._bar.start()

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
            self._bar.update(self._task, completed=self.raw_done, rates=self.rates())
        elif now - self.last >= self.interval_s:
            self.last = now
            pct = 100.0 * self.raw_done / self.total_raw
            print(f"{self.label}: {pct:5.1f}% {self.docs:,} docs, {self.text_bytes / 1e6:,.1f} MB, "
                  f"{self.tokens:,} tokens; {self.rates()}", file=self.stream, flush=True)

    def close(self) -> str:
        secs = time.monotonic() - self.start
        if self._bar is not None:
            self._bar.update(self._task, completed=self.total_raw, rates=self.rates())
            self._bar.stop()
        line = (f"{self.label}: done, {self.docs:,} docs, {self.text_bytes / 1e6:,.1f} MB, {self.tokens:,} "
                f"tokens in {secs:.1f} s ({self.rates()})")
        print(line, file=self.stream, flush=True)
        return line
