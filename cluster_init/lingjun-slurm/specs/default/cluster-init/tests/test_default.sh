#!/usr/bin/env bash
# CycleCloud node test (default spec): the lingjun-slurm configuration was read and checked.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_default.sh) and, in
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
state_file=$R/etc/lingjun-slurm/installed-default.env
state() { sed -n "s/^$1=//p" "$state_file"; }
if [ ! -f "$state_file" ]; then
    echo "FAIL the default spec has not run here (no /etc/lingjun-slurm/installed-default.env)"
    exit 1
fi
check "configuration mode recorded ($(state CONFIG_MODE))" test -n "$(state CONFIG_MODE)"

if [ "$failures" -gt 0 ]; then
    echo "$failures check(s) failed"
    exit 1
fi
