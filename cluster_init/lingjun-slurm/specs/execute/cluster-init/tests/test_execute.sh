#!/usr/bin/env bash
# CycleCloud node test (execute spec): enroot, pyxis, /etc/nccl.conf and the health checks are in place.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_execute.sh) and, in
# the repository's tests, against a sandboxed node (LINGJUN_NODE_ROOT). Exit status 1 = a check failed.
set -euo pipefail
spec_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On a node: /mnt/cluster-init/lingjun-slurm/{default,execute}/; in the repository: specs/*/cluster-init/.
lib=$spec_dir/../default/files/lib/node-test.sh
[ -f "$lib" ] || lib=$spec_dir/../../default/cluster-init/files/lib/node-test.sh
# shellcheck source=SCRIPTDIR/../../../default/cluster-init/files/lib/node-test.sh
. "$lib"
lj_test_begin execute
check "/etc/enroot/enroot.conf (0644)" has_mode /etc/enroot/enroot.conf 644
scratch=$(state SCRATCH)
check "enroot's paths are on the scratch $scratch" grep -q "^ENROOT_DATA_PATH $scratch/enroot/data/" "$R/etc/enroot/enroot.conf"
for dir in runtime cache data tmp; do
    check "$scratch/enroot/$dir (1777)" test "$(stat -c %a "$R$scratch/enroot/$dir")" = 1777
done
for hook in $(state HOOKS); do
    check "enroot hook $hook enabled (0755)" has_mode "/etc/enroot/hooks.d/$hook" 755
done
check "MELLANOX_VISIBLE_DEVICES for enroot's hook" grep -q "^MELLANOX_VISIBLE_DEVICES=" "$R/etc/enroot/environ.d/50-lingjun-mellanox.env"
if [ "$(state CREDENTIALS)" = true ]; then
    check "registry credentials (0600)" has_mode /etc/lingjun-slurm/enroot/credentials 600
    check "enroot.conf points ENROOT_CONFIG_PATH at the per-user copies" grep -q "^ENROOT_CONFIG_PATH /run/lingjun-slurm/enroot-config/" "$R/etc/enroot/enroot.conf"
    check "the credentials prolog (0755)" has_mode "$(state SLURM_CONF_DIR)/prolog.d/60-lingjun-enroot-credentials.sh" 755
fi
if [ -n "$(state NCCL_PROFILE)" ]; then
    check "/etc/nccl.conf (0644) from profile $(state NCCL_PROFILE)" has_mode /etc/nccl.conf 644
fi
if [ "$(state HEALTH)" = true ]; then
    check "/usr/local/sbin/lingjun-health (0755)" has_mode /usr/local/sbin/lingjun-health 755
    check "/etc/lingjun-slurm/health.conf (0644)" has_mode /etc/lingjun-slurm/health.conf 644
    check "health.conf names the SKU $(state SKU)" has_line /etc/lingjun-slurm/health.conf "SKU=$(state SKU)"
    check "/etc/lingjun-slurm/health.conf.d/ for site settings (0755)" test "$(stat -c %a "$R/etc/lingjun-slurm/health.conf.d")" = 755
    check "the installed thresholds are listed in their manifest" has_mode /etc/lingjun-slurm/health/thresholds.installed 644
    if [ -z "$R" ] && [ "$(state HEALTH_BOOT_CHECK)" != off ]; then
        # A real node: the program accepts its configuration (exit 2 = bad health.conf or drop-in).
        check "lingjun-health accepts health.conf and health.conf.d" bash -c '/usr/local/sbin/lingjun-health --no-drain; [ $? -ne 2 ]'
    fi
fi
if [ -z "$R" ] && [ "$(state ENROOT_INSTALL)" = true ]; then
    check "enroot version is $(state ENROOT_VERSION)" test "$(enroot version 2>/dev/null)" = "$(state ENROOT_VERSION)"
fi
lj_test_pyxis
lj_test_end
