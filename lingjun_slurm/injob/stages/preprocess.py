"""The built-in preprocess stage: one Slurm array task = one shard (see docs/preprocessing.md).

    python3 -m lingjun_slurm.stages preprocess --plan PLAN.json --shard N  ->  main(plan, N)

With one shard (settings.data.merge_in_preprocess, lingjun_slurm/plan.py) the plan has no merge
job: this task then runs the merge too (stages/merge.py; one shard's outputs are hard links).
"""

from __future__ import annotations

import sys

from ..host import stagenotes
from ..data import DataError


def main(plan: dict, shard: int) -> int:
    """Tokenize shard `shard` of settings.data; 0 on success (or already done), 1 on a data error."""
    from ..data.shard import DataSettings, run_shard

    try:
        ds = DataSettings.from_plan(plan)
        run_shard(ds, shard)
    except DataError as exc:
        print(f"lingjun-slurm: preprocess shard {shard}: {exc}", file=sys.stderr, flush=True)
        # The cause in `status`'s REASON (stagenotes.py): "input '/data/*.jsonl' matches no file".
        stagenotes.note_failure(stagenotes.run_dir_of(plan), "preprocess", str(exc))
        return 1
    except KeyboardInterrupt:
        print(f"lingjun-slurm: preprocess shard {shard}: interrupted; partial outputs removed",
              file=sys.stderr, flush=True)
        return 130
    if plan["settings"]["data"].get("merge_in_preprocess") and ds.shards == 1:
        # The plan has no merge job (plan.merge_in_preprocess): its work, here. One shard: hard links.
        from . import merge

        return merge.main(plan, stage="preprocess")
    return 0
