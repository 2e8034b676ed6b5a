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


TICK_CHARS = 28  # a stage name longer than this is shortened in the middle on the timeline's axis


def _short(name: str) -> str:
    """A stage name as the timeline's tick label: a name may have 63 characters (spec NAME_RE),
    too wide beside the 8-inch chart (the axes would shrink to nothing and tight_layout give up);
    the stages table above the chart has every name in full."""
    if len(name) <= TICK_CHARS:
        return name
    half = (TICK_CHARS - 1) // 2
    return f"{name[:half]}\u2026{name[-half:]}"


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
        # 1.3 inches for the ticks and the two-line axis label, whatever the number of rows
        fig, ax = plt.subplots(figsize=(8, 1.3 + 0.45 * len(stages)))
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
        ax.set_yticklabels([_short(s["name"]) for s in reversed(stages)])
        # As one line centred under the axes, the label was wider than the 8-inch figure and cut off
        # at its right edge, which tight_layout does not prevent (it moves the axes, never shrinks a
        # text; long tick labels move the axes' centre further right). Two lines, each well under the
        # figure's width, ending at the axes' right edge, which tight_layout keeps inside the figure.
        ax.set_xlabel("seconds since the first submit\n(gray: waiting in the queue or on dependencies; "
                      "one bar per attempt or array task)", loc="right")
        ax.grid(axis="x", alpha=0.3)
        save(fig, "timeline.png")
    written += goodput_chart(doc, out, plt)
    return written


# The ledger's buckets (lingjun_slurm/injob/host/ledger.py BUCKETS), one colour each; productive green.
GOODPUT_COLORS = {"container_start": "tab:olive", "preflight": "tab:cyan", "startup": "tab:blue",
                  "productive": "tab:green", "checkpoint_save": "tab:purple", "evaluation": "tab:pink",
                  "lost_work": "tab:red", "hang_wait": "tab:orange", "failed_tail": "darkred",
                  "image_staging": "tab:brown", "preprocessing": "tan", "other_stages": "lightgray",
                  "unattributed": "black"}


def goodput_chart(doc: dict[str, Any], out: Path, plt: Any) -> list[str]:
    """goodput.png: one stacked bar per attempt (its allocated GPU- or CPU-hours, cut into the ledger's
    buckets); [] when the ledger has no attempt."""
    ledger = doc.get("goodput") or {}
    attempts = [a for a in ledger.get("attempts") or [] if a.get("allocated_seconds", 0) > 0]
    if not attempts:
        return []
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.4 * len(attempts)))
    labels = []
    for row, a in enumerate(reversed(attempts)):
        left = 0.0
        for name, color in GOODPUT_COLORS.items():
            hours = a["buckets"].get(name, 0.0) / 3600
            if hours > 0:
                ax.barh(row, hours, left=left, color=color, edgecolor="black", linewidth=0.3,
                        label=name if name not in ax.get_legend_handles_labels()[1] else None)
                left += hours
        labels.append(_short(f"{a['stage']} {a['job']}#{a['restart']} ({a['kind'].upper()})"))
    ax.set_yticks(range(len(attempts)))
    ax.set_yticklabels(labels)
    ax.set_xlabel("allocated hours (GPU-hours; CPU-hours for stages without GPUs)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(attempts) < 4 else -0.15), ncol=4,
              fontsize="small", frameon=False)
    fig.tight_layout()
    fig.savefig(out / "goodput.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return ["goodput.png"]
