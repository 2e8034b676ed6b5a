"""lingjun-slurm: Megatron GPT training chains on Slurm + pyxis clusters."""

__version__ = "0.2.0"
