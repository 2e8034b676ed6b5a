#!/usr/bin/env bash
# lingjun-slurm node installer: enroot, pyxis, NCCL defaults and health checks for Slurm nodes.
#
#   install.sh --role ROLE                     on CycleCloud (configuration from jetpack config)
#   install.sh --role ROLE --config node.yaml  anywhere else (Lingjun, on-premises)
#
# ROLE is default, execute (GPU nodes), scheduler or login; the CycleCloud specs' numbered
# scripts call this with their role. Idempotent: every change is logged as "changed: ...",
# and a second run changes nothing. Exit status: 0 done, 1 failure, 2 invalid configuration
# or input (including a missing checksum). Log: /var/log/lingjun-slurm/install.log.
# Never run it with `bash -x`: configuration values include registry secrets (it turns
# tracing off itself).
set -euo pipefail
set +o xtrace
shopt -s lastpipe # "... | lj_install_text" runs in this shell, so its change count is kept
umask 022

LJ_FILES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LJ_LIB=$LJ_FILES/lib
for lj_lib in common config packages artifacts storage enroot pyxis slurm nccl health roles; do
    # shellcheck source=/dev/null
    . "$LJ_LIB/$lj_lib.sh"
done
unset lj_lib

lj_usage() {
    cat <<'EOF'
usage: install.sh --role default|execute|scheduler|login [--config node.yaml] [--spec-dir DIR]

  --role      what to install: default (every node), execute (GPU nodes: enroot, pyxis,
              /etc/nccl.conf, health checks), scheduler (pyxis plugin, slurm.conf health
              checks), login (pyxis plugin)
  --config    read the configuration from a flat YAML file instead of `jetpack config`
  --spec-dir  the calling spec's directory (its files/ holds the role's data); found
              automatically next to this project's default spec otherwise

See docs/admin-guide.md for every configuration key.
EOF
}

# lj_spec_files ROLE [SPEC_DIR]: the files/ directory of ROLE's spec, in the repository
# layout (specs/ROLE/cluster-init/files) or on a CycleCloud node (/mnt/cluster-init/PROJECT/ROLE/files).
lj_spec_files() {
    local role=$1 spec_dir=${2-} candidate
    if [ -n "$spec_dir" ]; then
        [ -d "$spec_dir/files" ] || lj_die 2 "--spec-dir $spec_dir has no files/ directory"
        (cd "$spec_dir/files" && pwd)
        return 0
    fi
    if [ "$role" = default ]; then
        printf '%s' "$LJ_FILES"
        return 0
    fi
    for candidate in "$LJ_FILES/../../../$role/cluster-init/files" "$LJ_FILES/../../$role/files"; do
        if [ -d "$candidate" ]; then
            (cd "$candidate" && pwd)
            return 0
        fi
    done
    lj_die 2 "cannot find the $role spec's files/ next to $LJ_FILES (attach lingjun-slurm:$role, or pass --spec-dir)"
}

lj_main() {
    local role="" config="" spec_dir=""
    while [ $# -gt 0 ]; do
        case $1 in
        --role) role=${2-}; shift 2 || lj_die 2 "--role needs a value" ;;
        --config) config=${2-}; shift 2 || lj_die 2 "--config needs a value" ;;
        --spec-dir) spec_dir=${2-}; shift 2 || lj_die 2 "--spec-dir needs a value" ;;
        -h | --help) lj_usage; exit 0 ;;
        *) lj_usage >&2; lj_die 2 "unknown argument: $1" ;;
        esac
    done
    case $role in
    default | execute | scheduler | login) ;;
    *) lj_usage >&2; lj_die 2 "--role must be default, execute, scheduler or login" ;;
    esac
    if [ -n "$LJ_ROOT" ]; then
        if [[ $LJ_ROOT != /* ]] || [ ! -d "$LJ_ROOT" ] || [ "$LJ_ROOT" = / ]; then
            lj_die 2 "LINGJUN_NODE_ROOT must be an existing absolute directory other than /"
        fi
    elif [ "$(id -u)" -ne 0 ]; then
        lj_die "run as root"
    fi
    lj_work_init
    export TMPDIR=$LJ_WORK
    lj_log_init
    lj_log "install.sh --role $role${config:+ --config $config}${LJ_ROOT:+ (node root $LJ_ROOT)}"
    lj_config_init "$config"
    lj_config_log
    lj_os_detect
    # shellcheck disable=SC2034 # read by lib/*.sh
    LJ_SPEC_FILES=$(lj_spec_files "$role" "$spec_dir")
    case $role in
    default) lj_role_default ;;
    execute) lj_role_execute ;;
    scheduler | login) lj_role_submit_host "$role" ;;
    esac
    lj_log "done ($role): $LJ_CHANGES change(s)"
}

lj_main "$@"
