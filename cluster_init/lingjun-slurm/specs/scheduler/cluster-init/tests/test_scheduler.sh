#!/usr/bin/env bash
# CycleCloud node test (scheduler spec): the pyxis plugin and the slurm.conf health-check settings are in place.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_scheduler.sh) and, in
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
state_file=$R/etc/lingjun-slurm/installed-scheduler.env
state() { sed -n "s/^$1=//p" "$state_file"; }
if [ ! -f "$state_file" ]; then
    echo "FAIL the scheduler spec has not run here (no /etc/lingjun-slurm/installed-scheduler.env)"
    exit 1
fi
if [ "$(state HEALTH)" = true ]; then
    conf=$(state SLURM_CONF_DIR)/slurm.conf
    check "$conf runs lingjun-health" has_line "$conf" "HealthCheckProgram=/usr/local/sbin/lingjun-health"
    check "$conf has one HealthCheckProgram" test "$(grep -ciE '^[[:space:]]*HealthCheckProgram[[:space:]]*=' "$R$conf")" = 1
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
