"""The report's PNGs, drawn with matplotlib's Agg backend from report data (data.py).

matplotlib is optional (`pip install 'lingjun-slurm[plot]'`) and imported only here, as the
nccl-test chart does (nccltests/chart.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.errors import UsageError

INSTALL_HINT = "the report needs matplotlib: pip install 'lingjun-slurm[plot]'"
STATE_COLORS = {"COMPLETED": "tab:green", "RUNNING": "tab:blue", "FAILED": "tab:red", "TIMEOUT": "tab:red",
                "CANCELLED": "tab:gray", "PENDING": "tab:orange"}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; UsageError (exit 2) naming the extra without it."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)  # no display needed, as nccltests/chart.py
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return plt


def draw(doc: dict[str, Any], out: Path, now: float) -> list[str]:
    """Write the charts the data has into out/; their file names, in page order. now: where a
    running attempt's bar ends."""
    plt = pyplot()
    m = doc["metrics"]
    train, evals = m["train"], m["eval"]
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
        """(iterations, values) of the records whose `key` is a number (older or hand-made records
        may lack one; a diverged loss is null in the document)."""
        pts = [(r["iteration"], r[key]) for r in records
               if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        return [a for a, _ in pts], [b for _, b in pts]

    if train:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(*series(train, "loss"), label="train loss", color="tab:blue")
        if evals:
            ax.plot(*series(evals, "loss"), "o-", label="validation loss", color="tab:orange")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "loss.png")
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(*series(train, "lr"), color="tab:purple")
        ax.set_xlabel("iteration")
        ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
        save(fig, "lr.png")
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(*series(train, "tokens_per_s"), color="tab:green", label="tokens/s")
        ax.set_xlabel("iteration")
        ax.set_ylabel("tokens/s (global)")
        ax.grid(alpha=0.3)
        its, mfu = series(train, "mfu")
        if mfu:
            ax2 = ax.twinx()
            ax2.plot(its, [100 * b for b in mfu], color="tab:red", label="MFU")
            ax2.set_ylabel("MFU (%)")
        save(fig, "throughput.png")
        its, mem = series(train, "max_memory_allocated")
        if mem:
            fig, ax = plt.subplots(figsize=(8, 3))
            ax.plot(its, [b / 2 ** 30 for b in mem], color="tab:brown")
            ax.set_xlabel("iteration")
            ax.set_ylabel("GPU memory peak (GiB)")
            ax.grid(alpha=0.3)
            save(fig, "memory.png")
    stages = [s for s in doc["stages"] if s["submitted_at"] or s["attempts"]]
    if stages:
        t0 = min(s["submitted_at"] or s["started_at"] for s in stages)
        fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * len(stages)))
        for row, s in enumerate(reversed(stages)):
            if s["submitted_at"] and s["started_at"] and s["started_at"] > s["submitted_at"]:
                ax.barh(row, s["started_at"] - s["submitted_at"], left=s["submitted_at"] - t0, color="lightgray",
                        edgecolor="gray")
            for a in s["attempts"]:
                end = a["end"] if a["end"] is not None else now  # still running: up to now
                if a["end"] is None:
                    color = STATE_COLORS["RUNNING"]
                elif a["exit_code"] == 0:
                    color = STATE_COLORS["COMPLETED"]
                else:  # an attempt that failed or was signalled, though a requeue may have completed
                    color = STATE_COLORS["FAILED"] if (a["exit_code"] or 0) <= 128 else STATE_COLORS["CANCELLED"]
                ax.barh(row, max(end - a["start"], 0.5), left=a["start"] - t0, color=color, edgecolor="black",
                        linewidth=0.5)
        ax.set_yticks(range(len(stages)))
        ax.set_yticklabels([s["name"] for s in reversed(stages)])
        ax.set_xlabel("seconds since the first submit (gray: waiting in the queue or on dependencies; "
                      "one bar per attempt or array task)")
        ax.grid(axis="x", alpha=0.3)
        save(fig, "timeline.png")
    return written
