"""The built-in merge stage: the preprocess shards -> {output_prefix}_{key}_document.bin/.idx.

    python3 -m lingjun_slurm.stages merge --plan PLAN.json  ->  main(plan)
"""

from __future__ import annotations

import sys

from ..data import DataError


def main(plan: dict) -> int:
    """Merge every json key's shards in shard order; 1 with a clear message when a shard is missing."""
    from ..data.shard import DataSettings, run_merge

    try:
        run_merge(DataSettings.from_plan(plan))
    except DataError as exc:
        print(f"lingjun-slurm: merge: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0
