"""The user's terminal: the `lingjun-slurm` commands and how they draw.

main.py holds the click group and the commands that need no other module (validate, render);
every other command group has a module of its own, imported only when the command line names
it (main.LAZY_COMMANDS): runs.py (submit, status, logs, cancel, resubmit, list, forget),
plan.py, image.py, checkpoint.py, doctor.py, health.py, nccltest.py, report.py, devcluster.py;
remote.py holds the --host/--cluster options they share, and ui.py the terminal drawing.
This is the only wing that imports click or rich (tests/unit/test_wings.py).
"""
