"""NVIDIA nccl-tests for `lingjun-slurm nccl-test` (docs/nccl-tests.md).

parse (text tables and -J JSON), sizes, plan (the job and its sbatch script), run (submit, wait
with one squeue per poll), session (one run end to end), results (finding and reading outputs),
verdict (pass/fail against published or --expect figures), report (table, JSON), chart (PNG),
bisect (which pairs to test, pure) and bisect_run (its rounds on Slurm).
"""
