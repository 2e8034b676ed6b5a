"""Shared by the report page's tests: a hand-made report document and the pixel helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# matplotlib's default colour cycle ("tab:" names; matplotlib/_color_data.py TABLEAU_COLORS) and
# the CSS colour the timeline draws waits in (matplotlib/_color_data.py CSS4_COLORS "lightgray").
TAB = {"blue": (0x1F, 0x77, 0xB4), "orange": (0xFF, 0x7F, 0x0E), "green": (0x2C, 0xA0, 0x2C),
       "red": (0xD6, 0x27, 0x28), "purple": (0x94, 0x67, 0xBD), "brown": (0x8C, 0x56, 0x4B),
       "gray": (0x7F, 0x7F, 0x7F), "lightgray": (0xD3, 0xD3, 0xD3)}
# Which colours each chart draws its data in (lingjun_slurm/report/charts.py draw).
CHART_COLOURS = {"loss.png": ["blue", "orange"], "lr.png": ["purple"], "throughput.png": ["green"],
                 "memory.png": ["brown"], "timeline.png": ["green", "lightgray"], "goodput.png": ["green"]}


def colour_columns(img: Any, rgb: tuple[int, int, int], tol: int = 8) -> list[int]:
    """The x positions of the columns of a PIL RGB image that hold a pixel of this colour. A gray
    (a bar's fill) counts only inside a 3x3 block of it: the anti-aliased edges of black lines and
    text have every shade of gray, a bar's interior is one."""
    px = img.load()
    w, h = img.size

    def near(x: int, y: int) -> bool:
        return max(abs(a - b) for a, b in zip(px[x, y][:3], rgb)) <= tol

    if max(rgb) - min(rgb) > 30:  # a colour: no black or gray edge comes near it
        return [x for x in range(w) if any(near(x, y) for y in range(h))]
    return [x for x in range(1, w - 1)
            if any(all(near(x + dx, y + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1)) for y in range(1, h - 1))]


def border_ink(path: Path, width: int = 2) -> list[tuple[int, int]]:
    """Pixels within `width` of a PNG's edge that are not the figure's white: what a label cut off
    at the figure's edge leaves there (tight_layout keeps everything it fits well inside)."""
    from PIL import Image

    img = Image.open(path).convert("RGB")
    w, h = img.size
    px = img.load()
    edge = [(x, y) for x in range(w) for y in (*range(width), *range(h - width, h))]
    edge += [(x, y) for y in range(h) for x in (*range(width), *range(w - width, w))]
    return [(x, y) for x, y in edge if min(px[x, y]) < 235]


def doc(stages: list[dict[str, Any]], train: int = 30) -> dict[str, Any]:
    """A report document (lingjun_slurm/report/data.py collect's shape)."""
    recs = [{"type": "train", "iteration": i, "loss": 8.0 - i / 10, "lr": 1e-3 * min(1, i / 5),
             "tokens_per_s": 1000.0 + 10 * i, "mfu": 0.3, "max_memory_allocated": 2 ** 30 + i}
            for i in range(1, train + 1)]
    return {"schema": 1,
            "run": {"run_id": "r-1", "name": "r", "executor": "local", "host": "h", "run_dir": "/x/runs/r-1",
                    "created_at": 1000.0, "slurm_error": None},
            "stages": stages,
            "metrics": {"train": recs, "eval": [{"type": "eval", "iteration": 10, "loss": 7.5},
                                                {"type": "eval", "iteration": 30, "loss": 6.0}],
                        "save": [], "events": []},
            "nccl_tests": [],
            "checkpoints": {"dir": None, "readable": False, "tracker": None, "iterations": []}}


def stage(name: str, submitted: float, attempts: list[tuple[float, Any, Any]]) -> dict[str, Any]:
    """A stage with these (start, end, exit code) attempts."""
    runs = [{"job": "7", "start": s, "end": e, "exit_code": rc, "restarts": 0, "nodes": "n1"} for s, e, rc in attempts]
    ends = [a["end"] for a in runs]
    return {"name": name, "kind": "command", "job_ids": ["7"], "previous_attempts": 0, "state": "COMPLETED",
            "reason": "", "exit_code": 0, "restarts": 0, "nodes": "n1", "submitted_at": submitted,
            "attempts": runs, "started_at": runs[0]["start"] if runs else None,
            "ended_at": None if None in ends or not ends else max(ends),
            "queue_wait_s": runs[0]["start"] - submitted if runs else None,
            "run_s": None, "requeues": max(0, len(runs) - 1)}
