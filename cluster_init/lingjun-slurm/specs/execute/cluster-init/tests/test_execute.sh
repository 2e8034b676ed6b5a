#!/usr/bin/env bash
# CycleCloud node test (execute spec): enroot, pyxis, /etc/nccl.conf and the health checks are in place.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_execute.sh) and, in
# the repository's tests, against a sandboxed node (LINGJUN_NODE_ROOT). Exit status 1 = a check failed.
set -euo pipefail
R=${LINGJUN_NODE_ROOT:-}
failures=0

check() {
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then
        echo "ok   $what"
    else
        echo "FAIL $what"
        failures=$((failures + 1))
    fi
}
has_mode() { [ -f "$R$1" ] && [ "$(stat -c %a "$R$1")" = "$2" ]; }
has_line() { grep -qxF -- "$2" "$R$1"; }
state_file=$R/etc/lingjun-slurm/installed-execute.env
state() { sed -n "s/^$1=//p" "$state_file"; }
if [ ! -f "$state_file" ]; then
    echo "FAIL the execute spec has not run here (no /etc/lingjun-slurm/installed-execute.env)"
    exit 1
fi
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
fi
if [ -z "$R" ] && [ "$(state ENROOT_INSTALL)" = true ]; then
    check "enroot version is $(state ENROOT_VERSION)" test "$(enroot version 2>/dev/null)" = "$(state ENROOT_VERSION)"
fi
if [ "$(state PYXIS_MODE)" != skip ]; then
    plugin=$(state PYXIS_PLUGIN)
    conf_dir=$(state SLURM_CONF_DIR)
    check "pyxis plugin $plugin (0644)" has_mode "$plugin" 644
    check "pyxis enabled in $conf_dir/plugstack.conf.d/pyxis.conf" grep -q "^required $plugin " "$R$conf_dir/plugstack.conf.d/pyxis.conf"
    check "plugstack.conf includes plugstack.conf.d/*" grep -Eq "^[[:space:]]*include[[:space:]]+$conf_dir/plugstack.conf.d/\*" "$R$conf_dir/plugstack.conf"
    if [ -z "$R" ] && command -v srun >/dev/null 2>&1; then
        check "srun --help shows pyxis's --container-image" bash -c 'srun --help 2>&1 | grep -q -- --container-image'
    fi
fi

if [ "$failures" -gt 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
