"""Code that runs inside the jobs, on the cluster's hosts.

- stages/: the built-in stages (image, preprocess, merge, train, checkpoint), entered through
  `python3 -m lingjun_slurm.stages` (lingjun_slurm/stages/);
- train/: the GPT trainer on megatron-core; data/: Megatron's .bin/.idx preprocessing;
  checkpoint/: the checkpoint layout, manifests, verification, retention and copies;
- preflight/: the per-node pre-flight checks and their judge; stacks.py and pyrun.py: the
  stack dumps of every rank and the runner of a custom entrypoint;
- host/: what the batch script runs with the host's own python3, outside the container
  (hang watchdog, node exclusion, crash attribution, the retry decision, stage notes):
  standard library only, and a test imports it with every third-party package blocked.
"""
