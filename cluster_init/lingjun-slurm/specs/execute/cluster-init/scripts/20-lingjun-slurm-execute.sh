#!/usr/bin/env bash
# CycleCloud cluster-init (execute spec): GPU nodes: enroot, pyxis, /etc/nccl.conf, health checks.
# A thin shim over the tested, idempotent installer in the default spec's files/install.sh,
# which reads its settings with `jetpack config lingjun_slurm.*` (docs/admin-guide.md).
set -euo pipefail
spec_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On a node: /mnt/cluster-init/lingjun-slurm/{default,execute}/; in the repository:
# specs/{default,execute}/cluster-init/.
for installer in "$spec_dir/../default/files/install.sh" "$spec_dir/../../default/cluster-init/files/install.sh"; do
    if [ -f "$installer" ]; then
        exec bash "$installer" --role execute --spec-dir "$spec_dir"
    fi
done
echo "lingjun-slurm: the default spec is missing: attach lingjun-slurm:default (first) to this node" >&2
exit 1
