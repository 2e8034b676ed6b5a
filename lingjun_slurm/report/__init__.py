"""`lingjun-slurm report RUN`: one self-contained HTML page of a run, PNG charts beside it.

data.py gathers what the run left (metrics.jsonl, the stage markers in <run_dir>/jobs/, the
status, the checkpoints) into one JSON document, which the page embeds; charts.py draws it with
matplotlib (the `plot` extra, imported only here); page.py writes the HTML. docs/report.md.
"""
