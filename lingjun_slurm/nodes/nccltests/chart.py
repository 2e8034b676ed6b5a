"""PNG chart of bus bandwidth by message size (log2 x axis), with matplotlib's Agg backend.

matplotlib is optional (`pip install 'lingjun-slurm[plot]'`) and imported only here, only when a
chart is written: the rest of the CLI never loads it (nor numpy).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from lingjun_slurm.common.errors import LingjunError, UsageError
from .parse import NcclTestResult
from .sizes import human_size

# Red is kept for slow pairs of a bisection.
_COLORS = ["tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:cyan", "tab:olive", "tab:gray",
           "tab:pink"]
INSTALL_HINT = "the chart needs matplotlib: pip install 'lingjun-slurm[plot]' (or pass --no-chart)"


@dataclass(frozen=True)
class Series:
    label: str
    sizes: tuple[int, ...]
    busbw: tuple[float, ...]
    highlight: bool = False  # drawn in red (a slow pair in a bisection)


@dataclass(frozen=True)
class Threshold:
    label: str
    busbw_gbps: float


def series_of(label: str, result: NcclTestResult, highlight: bool = False) -> Optional[Series]:
    """Out-of-place busbw by size (in-place where out-of-place is N/A); None without any value."""
    points = []
    for row in result.rows:
        value = row.oop_busbw if row.oop_busbw is not None else row.ip_busbw
        if value is not None and not math.isnan(value) and row.size_bytes > 0:
            points.append((row.size_bytes, value))
    if not points:
        return None
    points.sort()
    return Series(label, tuple(p[0] for p in points), tuple(p[1] for p in points), highlight)


def require_matplotlib() -> None:
    """Fail early (before any job is submitted) when the chart cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


def write_chart(path: str, series: list[Series], *, title: str, thresholds: tuple[Threshold, ...] = ()) -> str:
    """Draw the series and write a PNG to path (atomically); return path."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    if not series:
        raise LingjunError(f"no bandwidth values to chart in {path}")
    fig = Figure(figsize=(10, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    calm = iter(_COLORS * (len(series) // len(_COLORS) + 1))
    for s in series:
        color, width = ("tab:red", 2.2) if s.highlight else (next(calm), 1.5)
        ax.plot(s.sizes, s.busbw, marker="o", markersize=3, label=s.label, color=color, linewidth=width)
    for th in thresholds:
        ax.axhline(th.busbw_gbps, linestyle="--", color="gray", linewidth=1)
        ax.annotate(th.label, xy=(0.01, th.busbw_gbps), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8, color="dimgray")
    ax.set_xscale("log", base=2)
    sizes = sorted({x for s in series for x in s.sizes})
    step = max(1, math.ceil(len(sizes) / 12))  # at most a dozen labels
    ticks = sizes[::step]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(ticks, [human_size(x) for x in ticks], rotation=45, ha="right", fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth (GB/s, out-of-place)")
    ax.set_ylim(bottom=0)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(title if len(title) <= 110 else title[:107] + "...", fontsize=10)
    if len(series) > 1 or thresholds:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp{os.getpid()}.png")
    try:
        os.makedirs(directory, exist_ok=True)
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    except OSError as exc:
        raise LingjunError(f"cannot write the chart {path}: {exc.strerror}") from None
    return path
