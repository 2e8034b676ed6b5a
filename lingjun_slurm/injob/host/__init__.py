"""Run by the batch script on the batch host with the host's python3, outside the container
(slurm_templates/partials/faults.sh.j2, train.sbatch.j2: `host_py -m lingjun_slurm.injob.host.X`).

That python3 is whatever the host has, so every module here imports only the standard library
and other standard-library-only lingjun_slurm modules (tests/unit/test_wings.py imports each
one in a subprocess with every third-party package blocked):
exclusion.py (the run's excluded nodes), watchdog.py (the hang watchdog), retry.py (retry or
stop after a failed attempt), crashlog.py (which node a crash points at), stagenotes.py (the
one-line cause a stage leaves for `lingjun-slurm status`), straggler.py (slow ranks from the step
times), ledger.py (the goodput ledger: also imported by `status --goodput` and `report`),
promfile.py (node_exporter textfiles).
"""
