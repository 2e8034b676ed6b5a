"""`python3 -m lingjun_slurm.stages STAGE --plan PLAN.json`: see lingjun_slurm/injob/stages/dispatch.py."""

import sys

from lingjun_slurm.injob.stages.dispatch import main

if __name__ == "__main__":
    sys.exit(main())
