"""`python3 -m lingjun_slurm.cli ...`: the same as the `lingjun-slurm` console script."""

from lingjun_slurm.cli.main import main

if __name__ == "__main__":
    main()
