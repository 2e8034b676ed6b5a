"""Tests against a real single-host Slurm cluster (lingjun_slurm.devcluster)."""
