"""Stage entry points run inside the jobs: `python3 -m lingjun_slurm.stages STAGE --plan PLAN.json`."""
