"""`python3 -m lingjun_slurm.data.synthetic OUT_DIR ...`: the toy corpus of the tiny-gpt example
(lingjun_slurm/injob/data/synthetic.py), at the path its spec and users call."""

import sys

from lingjun_slurm.injob.data.synthetic import main

if __name__ == "__main__":
    sys.exit(main())
