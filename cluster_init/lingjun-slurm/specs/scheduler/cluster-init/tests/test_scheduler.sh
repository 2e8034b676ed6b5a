#!/usr/bin/env bash
# CycleCloud node test (scheduler spec): the pyxis plugin and the slurm.conf health-check settings are in place.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_scheduler.sh) and, in
# the repository's tests, against a sandboxed node (LINGJUN_NODE_ROOT). Exit status 1 = a check failed.
set -euo pipefail
spec_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On a node: /mnt/cluster-init/lingjun-slurm/{default,scheduler}/; in the repository: specs/*/cluster-init/.
lib=$spec_dir/../default/files/lib/node-test.sh
[ -f "$lib" ] || lib=$spec_dir/../../default/cluster-init/files/lib/node-test.sh
# shellcheck source=SCRIPTDIR/../../../default/cluster-init/files/lib/node-test.sh
. "$lib"
lj_test_begin scheduler
if [ "$(state HEALTH)" = true ]; then
    conf=$(state SLURM_CONF_DIR)/slurm.conf
    check "$conf runs the health check dispatcher $(state HEALTH_PROGRAM)" has_line "$conf" "HealthCheckProgram=$(state HEALTH_PROGRAM)"
    check "$conf has one HealthCheckProgram" test "$(grep -ciE '^[[:space:]]*HealthCheckProgram[[:space:]]*=' "$R$conf")" = 1
fi
lj_test_pyxis
lj_test_end
