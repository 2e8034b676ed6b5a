"""The path users call for the toy corpus: `python3 -m lingjun_slurm.data.synthetic OUT_DIR`, as the
tiny-gpt example's first stage does (and specs copied from it before 0.2.0). The code lives in
lingjun_slurm/injob/data/ (the job-side wing); nothing in the package imports this one."""
