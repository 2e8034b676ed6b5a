"""Talking to Slurm: the command-line client and pure parsers of its output."""
