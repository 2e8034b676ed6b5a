"""The report's PNGs, drawn with matplotlib's Agg backend from report data (data.py).

matplotlib is optional (`pip install 'lingjun-slurm[plot]'`) and imported only here, as the
nccl-test chart does (nccltests/chart.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UsageError

INSTALL_HINT = "the report needs matplotlib: pip install 'lingjun-slurm[plot]'"
STATE_COLORS = {"COMPLETED": "tab:green", "RUNNING": "tab:blue", "FAILED": "tab:red", "TIMEOUT": "tab:red",
                "CANCELLED": "tab:gray", "PENDING": "tab:orange"}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)  # no display needed, as nccltests/chart.py
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    return plt


def draw(doc: dict[str, Any], out: Path) -> list[str]:
    """Write the charts the data has into out/; their file names, in page order."""
    plt = _pyplot()
    m = doc["metrics"]
    train, evals = m["train"], m["eval"]
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    if train:
        it = [r["iteration"] for r in train]
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(it, [r["loss"] for r in train], label="train loss", color="tab:blue")
        if evals:
            ax.plot([r["iteration"] for r in evals], [r["loss"] for r in evals], "o-", label="validation loss",
                    color="tab:orange")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "loss.png")
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(it, [r["lr"] for r in train], color="tab:purple")
        ax.set_xlabel("iteration")
        ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
        save(fig, "lr.png")
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(it, [r["tokens_per_s"] for r in train], color="tab:green", label="tokens/s")
        ax.set_xlabel("iteration")
        ax.set_ylabel("tokens/s (global)")
        ax.grid(alpha=0.3)
        mfu = [(r["iteration"], r["mfu"]) for r in train if isinstance(r.get("mfu"), (int, float))]
        if mfu:
            ax2 = ax.twinx()
            ax2.plot([a for a, _ in mfu], [100 * b for _, b in mfu], color="tab:red", label="MFU")
            ax2.set_ylabel("MFU (%)")
        save(fig, "throughput.png")
        mem = [(r["iteration"], r["max_memory_allocated"]) for r in train if "max_memory_allocated" in r]
        if mem:
            fig, ax = plt.subplots(figsize=(8, 3))
            ax.plot([a for a, _ in mem], [b / 2 ** 30 for _, b in mem], color="tab:brown")
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
                end = a["end"] if a["end"] is not None else a["start"]
                ax.barh(row, max(end - a["start"], 0.5), left=a["start"] - t0,
                        color=STATE_COLORS.get(s["state"] or "", "tab:blue"), edgecolor="black", linewidth=0.5)
        ax.set_yticks(range(len(stages)))
        ax.set_yticklabels([s["name"] for s in reversed(stages)])
        ax.set_xlabel("seconds since the first submit (gray: waiting in the queue or on dependencies; "
                      "one bar per attempt or array task)")
        ax.grid(axis="x", alpha=0.3)
        save(fig, "timeline.png")
    return written
