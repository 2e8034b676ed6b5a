#!/usr/bin/env bash
# CycleCloud node test (default spec): the lingjun-slurm configuration was read and checked.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_default.sh) and, in
# the repository's tests, against a sandboxed node (LINGJUN_NODE_ROOT). Exit status 1 = a check failed.
set -euo pipefail
spec_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On a node: /mnt/cluster-init/lingjun-slurm/{default,default}/; in the repository: specs/*/cluster-init/.
lib=$spec_dir/../default/files/lib/node-test.sh
[ -f "$lib" ] || lib=$spec_dir/../../default/cluster-init/files/lib/node-test.sh
# shellcheck source=SCRIPTDIR/../../../default/cluster-init/files/lib/node-test.sh
. "$lib"
lj_test_begin default
check "configuration mode recorded ($(state CONFIG_MODE))" test -n "$(state CONFIG_MODE)"
lj_test_end
