"""Executors: Slurm (sbatch through a Transport) and local (the same scripts on this machine)."""
