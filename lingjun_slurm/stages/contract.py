"""The contract of the built-in stages' one entry command: its arguments and the plan file it reads
(`python3 -m lingjun_slurm.stages STAGE --plan PLAN.json ...`, stages/__main__.py; the train
stage's own `python3 -m lingjun_slurm.stages.train --plan PLAN.json`, stages/train.py).

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
