"""The built-in preprocess stage: one Slurm array task = one shard (see docs/preprocessing.md).

    python3 -m lingjun_slurm.stages preprocess --plan PLAN.json --shard N  ->  main(plan, N)
"""

from __future__ import annotations

import sys

from ..data import DataError


def main(plan: dict, shard: int) -> int:
    """Tokenize shard `shard` of settings.data; 0 on success (or already done), 1 on a data error."""
    from ..data.shard import DataSettings, run_shard

    try:
        run_shard(DataSettings.from_plan(plan), shard)
    except DataError as exc:
        print(f"lingjun-slurm: preprocess shard {shard}: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"lingjun-slurm: preprocess shard {shard}: interrupted; partial outputs removed",
              file=sys.stderr, flush=True)
        return 130
    return 0
