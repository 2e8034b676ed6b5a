# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# Node health checks (execute nodes): install the generated lingjun-health program and its
# per-SKU thresholds, write /etc/lingjun-slurm/health.conf, and run `lingjun-health --boot`
# once per boot before the node takes jobs.

readonly LJ_HEALTH_CONF=/etc/lingjun-slurm/health.conf
readonly LJ_THRESHOLDS=/etc/lingjun-slurm/health/thresholds
readonly LJ_BOOT_STAMP=/run/lingjun-slurm/health-boot.done

lj_health_preflight() {
    lj_cfg_true health.enabled || return 0
    [ -f "$LJ_SPEC_FILES/health/lingjun-health" ] ||
        lj_die "missing $LJ_SPEC_FILES/health/lingjun-health: regenerate with python -m lingjun_slurm.clusterinit_gen cluster_init/"
}

lj_health_conf_text() {
    cat <<EOF
# Managed by lingjun-slurm cluster-init (execute spec): set lingjun_slurm.health.* instead.
SKU=$LJ_SKU
THRESHOLDS_DIR=$LJ_THRESHOLDS
NCCL_CONF=/etc/nccl.conf
ENROOT_CONF=/etc/enroot/enroot.conf
ENROOT_IMAGE=$(lj_cfg health.enroot_image)
MIN_FREE_GB=$(lj_cfg health.min_free_gb)
EOF
}

lj_health_install() {
    local src="$LJ_SPEC_FILES/health" f name dest
    lj_cfg_true health.enabled || return 0
    lj_install_file "$src/lingjun-health" "$LJ_HEALTH_PROGRAM" 0755
    lj_ensure_dir "$LJ_THRESHOLDS" 0755
    for f in "$src"/thresholds/*.conf; do
        [ -f "$f" ] && lj_install_file "$f" "$LJ_THRESHOLDS/${f##*/}" 0644
    done
    # the thresholds directory is ours: drop files the project no longer ships
    for dest in "$(lj_path "$LJ_THRESHOLDS")"/*.conf; do
        name=${dest##*/}
        [ -f "$dest" ] && [ ! -f "$src/thresholds/$name" ] && lj_remove "$LJ_THRESHOLDS/$name"
    done
    [ -n "$LJ_SKU" ] || lj_warn "no instance type or NCCL profile: health.conf has an empty SKU"
    lj_health_conf_text | lj_install_text "$LJ_HEALTH_CONF" 0644
}

lj_boot_id() {
    local id
    id=$(lj_path /proc/sys/kernel/random/boot_id)
    if [ -r "$id" ]; then cat -- "$id"; else printf unknown; fi
}

# lingjun-health --boot, once per boot (the stamp lives in /run and names the boot).
lj_health_boot_check() {
    local policy stamp boot rc=0
    lj_cfg_true health.enabled || return 0
    policy=$(lj_cfg health.boot_check)
    [ "$policy" != off ] || return 0
    stamp=$(lj_path "$LJ_BOOT_STAMP")
    boot=$(lj_boot_id)
    if [ -f "$stamp" ] && [ "$(cat -- "$stamp")" = "$boot" ]; then
        lj_log "the boot health check already ran during this boot"
        return 0
    fi
    lj_log "run: $LJ_HEALTH_PROGRAM --boot"
    # in a sandbox, lingjun-health reads the node's files under the same root
    LINGJUN_HEALTH_ROOT=$LJ_ROOT "$(lj_path "$LJ_HEALTH_PROGRAM")" --boot || rc=$?
    if [ $rc -ne 0 ]; then
        if [ "$policy" = fail ]; then
            lj_die "the boot health check failed (lingjun-health --boot exited $rc): this node must not take jobs. Fix it, or set lingjun_slurm.health.boot_check: warn"
        fi
        lj_warn "the boot health check failed (lingjun-health --boot exited $rc); continuing (lingjun_slurm.health.boot_check is warn)"
    else
        lj_log "the boot health check passed"
    fi
    mkdir -p -- "$(dirname -- "$stamp")"
    printf '%s\n' "$boot" >"$stamp"
}
