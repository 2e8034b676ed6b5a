#!/usr/bin/env bash
# CycleCloud node test (login spec): the pyxis plugin is in place, so that srun --container-* works here.
# CycleCloud runs it in testing mode; it also runs by hand on any node (bash test_login.sh) and, in
# the repository's tests, against a sandboxed node (LINGJUN_NODE_ROOT). Exit status 1 = a check failed.
set -euo pipefail
spec_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# On a node: /mnt/cluster-init/lingjun-slurm/{default,login}/; in the repository: specs/*/cluster-init/.
lib=$spec_dir/../default/files/lib/node-test.sh
[ -f "$lib" ] || lib=$spec_dir/../../default/cluster-init/files/lib/node-test.sh
# shellcheck source=SCRIPTDIR/../../../default/cluster-init/files/lib/node-test.sh
. "$lib"
lj_test_begin login
lj_test_pyxis
lj_test_end
