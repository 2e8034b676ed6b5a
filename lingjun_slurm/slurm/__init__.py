"""Talking to Slurm: the command-line client, pure parsers of its output, and the queue readers
status chooses between (queue.py: squeue/sacct, or pyslurm when it passes the guard)."""
