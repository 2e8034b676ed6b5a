"""The contract of the built-in stages' one entry command: its arguments and the plan file it reads
(`python3 -m lingjun_slurm.stages STAGE --plan PLAN.json ...`, injob/stages/dispatch.py; the train
stage's own `python3 -m lingjun_slurm.injob.stages.train --plan PLAN.json`, injob/stages/train.py).

Standard library only: the pre-flight runs it in images without the training stack.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .runtime import PLAN_SCHEMA

STAGES = ("image", "preprocess", "merge", "train", "checkpoint", "preflight", "preflight-judge")
NO_RUNTIME_CHECK = ("preflight", "preflight-judge")  # standard library only: no torch needed


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.stages")
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("--plan", required=True, type=Path, help="plan.json written by `lingjun-slurm render`")
    parser.add_argument("--shard", type=int, help="preprocess: the array task id")
    parser.add_argument("--out", type=Path, help="preflight, preflight-judge: the reports' directory")
    parser.add_argument("--nodes", help="preflight-judge: the job's nodes, space-separated (expanded)")
    parser.add_argument("--skew-s", type=float, help="preflight-judge: the clock bound, seconds")
    args = parser.parse_args(argv)
    if args.stage == "preprocess" and args.shard is None:
        parser.error("preprocess needs --shard (the Slurm array task id)")
    if args.stage in NO_RUNTIME_CHECK and args.out is None:
        parser.error(f"{args.stage} needs --out DIR")
    if args.stage == "preflight-judge" and not (args.nodes or "").split():
        parser.error("preflight-judge needs --nodes \"n1 n2 ...\" (the job's nodes)")
    return args


def load_plan(path: Path) -> dict:
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"lingjun-slurm: cannot read plan {path}: {exc}") from None
    if plan.get("schema") != PLAN_SCHEMA:
        raise SystemExit(f"lingjun-slurm: {path} has plan schema {plan.get('schema')!r}; "
                         f"this version reads schema {PLAN_SCHEMA}: re-render the run")
    return plan


# 0.2.0 moved the modules the batch scripts run on the host (docs/architecture.md):
# lingjun_slurm.{exclusion,watchdog,retry,crashlog} -> lingjun_slurm.injob.host.*, lingjun_slurm.pyrun
# -> lingjun_slurm.injob.pyrun. `python3 -m lingjun_slurm.stages` kept its path.
LAYOUT_MOVED_IN = (0, 2)


def layout_note(plan: dict, running: str) -> str | None:
    """The warning for a plan rendered before the module move and run by this lingjun_slurm.

    A run carries its own lingjun_slurm in $RUN_DIR/site (run.ship_code), so its scripts always
    find the modules they name; this runs only where that copy is not used (ship_code: false and
    a newer lingjun_slurm installed on the hosts). The stage itself still works; the host tools
    the older scripts call by their old paths do not, and their own probe turns them off.
    """
    rendered = str(plan.get("tool_version") or "")
    try:
        version = tuple(int(x) for x in rendered.split(".")[:2])
    except ValueError:
        return None
    if len(version) != 2 or version >= LAYOUT_MOVED_IN:
        return None
    return (f"lingjun-slurm: warning: this run was rendered by lingjun_slurm {rendered}; the lingjun_slurm "
            f"running it is {running}, which moved the modules the run's batch scripts call on the host "
            "(lingjun_slurm.exclusion, .watchdog, .retry, .crashlog -> lingjun_slurm.injob.host.*; "
            "lingjun_slurm.pyrun -> lingjun_slurm.injob.pyrun): this job runs without its hang watchdog, "
            "node exclusion and crash attribution. Re-render the run (`lingjun-slurm resubmit RUN --from STAGE`) "
            "or keep run.ship_code: true, which runs every job with the code that rendered it.")
