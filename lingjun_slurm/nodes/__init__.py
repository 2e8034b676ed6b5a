"""The cluster's nodes as an admin sees them.

- health/: the node health check (lingjun-health, a standalone script cluster-init installs),
  its per-SKU thresholds and the Xid table;
- clusterinit_gen.py: writes the generated files of the CycleCloud cluster-init project in
  cluster_init/ (`python -m lingjun_slurm.nodes.clusterinit_gen cluster_init/`);
- nccltests/: plans, runs, parses and judges nccl-tests across nodes (`lingjun-slurm nccl-test`).
"""
