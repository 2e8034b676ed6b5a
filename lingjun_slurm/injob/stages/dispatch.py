"""The one entry command of every built-in stage (the contract the templates render).

    python3 -m lingjun_slurm.stages preprocess --plan PLAN.json --shard N
    python3 -m lingjun_slurm.stages merge      --plan PLAN.json
    python3 -m lingjun_slurm.stages train      --plan PLAN.json
    python3 -m lingjun_slurm.stages checkpoint --plan PLAN.json
    python3 -m lingjun_slurm.stages image      --plan PLAN.json   (on the host: stages the image)
    python3 -m lingjun_slurm.stages preflight  --plan PLAN.json --out DIR   (one task per node)
    python3 -m lingjun_slurm.stages preflight-judge --plan PLAN.json --out DIR --nodes "n1 n2"
    python3 -m lingjun_slurm.stages collective --plan PLAN.json --out DIR   (every rank, in the container)
    python3 -m lingjun_slurm.stages collective-judge --plan PLAN.json --out DIR --nodes "n1 n2"   (host)

This module validates the contract (arguments, plan schema), checks that the Python running
it has the packages the stage needs (runtime.py), and hands the plan to the stage's module:
stages/preprocess.py, merge.py, train.py, checkpoint.py, image.py; the pre-flight's two sides:
lingjun_slurm/injob/preflight/node.py and judge.py (standard library only: no runtime package check);
the collective smoke test's two sides: stages/collective.py (torch, in the container) and
lingjun_slurm/injob/preflight/collective.py (its judge, standard library only). Their arguments are
parsed here (collective_args), ahead of contract.parse.
"""

from __future__ import annotations

import os
import sys

from .contract import layout_note, load_plan, parse
from .runtime import check

COLLECTIVE = ("collective", "collective-judge")


def collective_args(argv: list[str]):
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.stages")
    parser.add_argument("stage", choices=COLLECTIVE)
    parser.add_argument("--plan", required=True, type=Path, help="plan.json written by `lingjun-slurm render`")
    parser.add_argument("--out", required=True, type=Path, help="the smoke test's directory")
    parser.add_argument("--nodes", help="collective-judge: the job's nodes, space-separated (expanded)")
    args = parser.parse_args(argv)
    if args.stage == "collective-judge" and not (args.nodes or "").split():
        parser.error("collective-judge needs --nodes \"n1 n2 ...\" (the job's nodes)")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COLLECTIVE:
        cargs = collective_args(argv)
        cplan = load_plan(cargs.plan)
        if cargs.stage == "collective-judge":
            from ..preflight import collective as collective_judge

            return collective_judge.main(cplan, cargs.out, cargs.nodes.split())
        from . import collective

        return collective.main(cplan, cargs.out)
    args = parse(argv)
    plan = load_plan(args.plan)
    from lingjun_slurm import __file__ as package_file, __version__

    print(f"lingjun-slurm: {args.stage} stage, lingjun_slurm {__version__} from {os.path.dirname(package_file)}, "
          f"python {sys.version.split()[0]} ({sys.executable})", flush=True)
    note = layout_note(plan, __version__)
    if note:
        print(note, file=sys.stderr, flush=True)
    if args.stage == "preflight":
        from ..preflight import node

        return node.main(plan, args.out)
    if args.stage == "preflight-judge":
        from ..preflight import judge

        return judge.main(plan, args.out, args.nodes.split(), args.skew_s)
    if not os.environ.get("LINGJUN_SKIP_RUNTIME_CHECK"):
        settings = plan.get("settings") or {}
        tokenizer = (settings.get("data") or {}).get("tokenizer") or {}
        problem = check(args.stage, tokenizer.get("type"), (settings.get("checkpoint") or {}).get("copy_to"))
        if problem:
            print(problem, file=sys.stderr)
            return 1
    if args.stage == "image":
        from . import image

        return image.main(plan, args.plan)
    if args.stage == "preprocess":
        from . import preprocess

        return preprocess.main(plan, args.shard)
    if args.stage == "merge":
        from . import merge

        return merge.main(plan)
    if args.stage == "checkpoint":
        from . import checkpoint

        return checkpoint.main(plan)
    from . import train

    return train.main(plan)
