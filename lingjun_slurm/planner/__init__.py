"""Estimates made before a run starts: GPU memory per rank (memory.py). Pure: no torch."""
