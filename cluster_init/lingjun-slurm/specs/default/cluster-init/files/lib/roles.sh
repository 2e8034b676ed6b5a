# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# What each role (CycleCloud spec) installs. Every role checks everything it can first
# (configuration, NCCL profile, checksums, downloads) and changes the node only after that.

# lj_state_write ROLE KEY=VALUE...: /etc/lingjun-slurm/installed-ROLE.env, what this role
# installed, for the spec's node tests (CycleCloud's testing mode) and for admins.
lj_state_write() {
    local role=$1 pair
    shift
    {
        printf '# Written by lingjun-slurm cluster-init (%s spec); read by its node tests.\n' "$role"
        printf 'ROLE=%s\nOS_FAMILY=%s\n' "$role" "$LJ_OS_FAMILY"
        for pair in "$@"; do
            printf '%s\n' "$pair"
        done
    } | lj_install_text "/etc/lingjun-slurm/installed-$role.env" 0644
}

lj_role_default() {
    lj_ensure_dir /etc/lingjun-slurm 0755
    lj_state_write default "CONFIG_MODE=$LJ_CONFIG_MODE"
}

# A textfile directory of the jobs' own, writable by every job (sticky, as /tmp): the train
# stage's hang watchdog keeps lingjun-slurm_<job>_<node>_*.prom files there while a job runs, as
# its user (docs/monitoring.md). A directory of its own, e.g.
# /var/lib/prometheus/node-exporter-lingjun-slurm, never Debian's system one
# /var/lib/prometheus/node-exporter (root-owned 0755, where prometheus-node-exporter-collectors'
# timers write as root): world-writable, any user could put a file there that fails to parse
# (node_textfile_scrape_error 1) or fakes node metrics (node_exporter collector/textfile.go v1.5.0
# lines 197-244 read every *.prom of every directory the flag's glob matches). That one is left
# as it is, with a warning; node_exporter is pointed at both with a glob
# (--collector.textfile.directory=/var/lib/prometheus/node-exporter*, 1.5.0) or a repeated flag (>= 1.9.0).
lj_textfile_dir() {
    local dir
    dir=$(lj_cfg monitoring.textfile_dir)
    [ -n "$dir" ] || return 0
    case "${dir%/}" in
        /var/lib/prometheus/node-exporter)
            lj_warn "monitoring.textfile_dir $dir is node_exporter's system textfile directory: left as it is (not made world-writable); use a directory of its own, e.g. /var/lib/prometheus/node-exporter-lingjun-slurm (docs/monitoring.md)"
            return 0 ;;
    esac
    lj_ensure_dir "$dir" 1777
}

lj_role_execute() {
    local pyxis_mode
    pyxis_mode=$(lj_cfg pyxis.mode)
    lj_instance_type
    if lj_cfg_true nccl.enabled; then
        lj_nccl_select
    fi
    LJ_SKU=${LJ_SKU:-$LJ_NCCL_PROFILE}
    lj_health_preflight
    lj_enroot_credentials_preflight
    lj_enroot_preflight
    lj_pyxis_preflight

    lj_ensure_dir /etc/lingjun-slurm 0755
    lj_storage_setup
    lj_enroot_install
    lj_enroot_configure
    lj_enroot_credentials
    lj_pyxis_install execute
    if lj_cfg_true nccl.enabled; then
        lj_nccl_install
    fi
    lj_health_install
    lj_textfile_dir
    lj_state_write execute "SCRATCH=$LJ_SCRATCH" \
        "ENROOT_INSTALL=$(lj_cfg enroot.install)" "ENROOT_VERSION=$(lj_cfg enroot.version)" \
        "HOOKS=$(lj_cfg enroot.hooks)" "PYXIS_MODE=$pyxis_mode" "PYXIS_PLUGIN=$LJ_PYXIS_PLUGIN" \
        "PYXIS_CONTAINER_SCOPE=$(lj_cfg pyxis.container_scope)" \
        "SLURM_CONF_DIR=$(lj_cfg slurm.conf_dir)" "NCCL_PROFILE=$LJ_NCCL_PROFILE" "SKU=$LJ_SKU" \
        "HEALTH=$(lj_cfg health.enabled)" "HEALTH_BOOT_CHECK=$(lj_cfg health.boot_check)" \
        "CREDENTIALS=$([ -n "$LJ_CRED_STAGED" ] && echo true || echo false)"
    lj_slurmd_restart_mark
    lj_health_boot_check
    lj_slurmd_restart_if_needed
}

# Scheduler and login nodes: the pyxis plugin and its plugstack entry, so that
# srun/sbatch --container-* parse there; no enroot.
lj_role_submit_host() {
    local role=$1
    lj_pyxis_preflight
    lj_ensure_dir /etc/lingjun-slurm 0755
    lj_pyxis_install "$role"
    if [ "$role" = scheduler ]; then
        lj_slurm_health_conf
    fi
    lj_state_write "$role" "PYXIS_MODE=$(lj_cfg pyxis.mode)" "PYXIS_PLUGIN=$LJ_PYXIS_PLUGIN" \
        "PYXIS_CONTAINER_SCOPE=$(lj_cfg pyxis.container_scope)" \
        "SLURM_CONF_DIR=$(lj_cfg slurm.conf_dir)" "HEALTH=$(lj_cfg health.enabled)" \
        "HEALTH_PROGRAM=$LJ_HEALTH_DISPATCH"
}
