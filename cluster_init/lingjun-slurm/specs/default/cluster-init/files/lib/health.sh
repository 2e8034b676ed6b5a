# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# Node health checks (execute nodes): install the generated lingjun-health program and its
# per-SKU thresholds, write /etc/lingjun-slurm/health.conf, and run `lingjun-health --boot`
# once per boot before the node takes jobs.
#
# What is the site's stays the site's: /etc/lingjun-slurm/health.conf.d/*.conf (read after
# health.conf, so they win) is created empty and never written, and in the thresholds
# directory only the files an earlier run installed (listed in thresholds.installed beside
# it) are ever removed; a site's own thresholds file there survives every rerun.

readonly LJ_HEALTH_CONF=/etc/lingjun-slurm/health.conf
readonly LJ_HEALTH_DROPINS=/etc/lingjun-slurm/health.conf.d
readonly LJ_THRESHOLDS=/etc/lingjun-slurm/health/thresholds
readonly LJ_THRESHOLDS_MANIFEST=/etc/lingjun-slurm/health/thresholds.installed
readonly LJ_BOOT_STAMP=/run/lingjun-slurm/health-boot.done

# lj_health_knows_sku NAME: whether lingjun-health finds thresholds for SKU=NAME among the
# shipped files, resolving it as the program does (case-insensitively: thresholds/NAME.conf,
# else a file listing NAME in INSTANCE_TYPES=).
lj_health_knows_sku() {
    local sku=${1,,} f base
    [ -n "$sku" ] || return 1
    for f in "$LJ_SPEC_FILES"/health/thresholds/*.conf; do
        [ -f "$f" ] || continue
        base=${f##*/}
        [ "${base,,}" != "$sku.conf" ] || return 0
    done
    for f in "$LJ_SPEC_FILES"/health/thresholds/*.conf; do
        [ -f "$f" ] || continue
        if awk -v s="$sku" '/^[ \t]*INSTANCE_TYPES[ \t]*=/ {
                v = $0; sub(/^[^=]*=/, "", v); gsub(/["\047]/, "", v)
                n = split(v, a, /[ \t]+/); for (i = 1; i <= n; i++) if (tolower(a[i]) == s) found = 1
            } END { exit !found }' "$f"; then
            return 0
        fi
    done
    return 1
}

# Sets LJ_SKU to a name lingjun-health has thresholds for: the instance type when a file
# covers it, else the NCCL profile (an instance type without its own thresholds, e.g. a VM
# size mapped to a generic profile by lingjun_slurm.nccl.profile). Refuses (exit 2) when
# neither resolves: the program would reject health.conf at every run and drain nothing.
lj_health_preflight() {
    local image
    lj_cfg_true health.enabled || return 0
    local key
    for key in gpu_count ib_port_count ib_rate_gbps; do
        [[ $(lj_cfg "health.$key") =~ ^[0-9]*$ ]] ||
            lj_config_bad "lingjun_slurm.health.$key" "expected a whole number or empty (the SKU's figure), got \"$(lj_cfg "health.$key")\""
    done
    # lingjun-health starts a container created beforehand (enroot create --name NAME) or a
    # local .sqsh file; it never imports from a registry (every HealthCheckInterval), so a
    # reference such as nvcr.io#nvidia/pytorch:24.05-py3 would fail and drain every node.
    image=$(lj_cfg health.enroot_image)
    if [ -n "$image" ] && ! [[ $image =~ ^/[^[:space:]]+\.sqsh$ ||
    ($image =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ && $image != *.sqsh) ]]; then
        lj_config_bad lingjun_slurm.health.enroot_image "expected the name of an enroot container created beforehand or the absolute path of a .sqsh image (not a registry reference)"
    fi
    [ -f "$LJ_SPEC_FILES/health/lingjun-health" ] ||
        lj_die "missing $LJ_SPEC_FILES/health/lingjun-health: regenerate with python -m lingjun_slurm.nodes.clusterinit_gen cluster_init/"
    if lj_health_knows_sku "$LJ_INSTANCE_TYPE"; then
        LJ_SKU=$LJ_INSTANCE_TYPE
    elif lj_health_knows_sku "$LJ_NCCL_PROFILE"; then
        [ -z "$LJ_INSTANCE_TYPE" ] ||
            lj_log "no health-check thresholds for instance type $LJ_INSTANCE_TYPE: using those of NCCL profile $LJ_NCCL_PROFILE"
        LJ_SKU=$LJ_NCCL_PROFILE
    else
        local what=""
        [ -z "$LJ_INSTANCE_TYPE" ] || what="instance type '$LJ_INSTANCE_TYPE'"
        [ -z "$LJ_NCCL_PROFILE" ] || what="${what:+$what or }NCCL profile '$LJ_NCCL_PROFILE'"
        lj_die 2 "no health-check thresholds for ${what:-this node (no instance type, no NCCL profile)} in the execute spec's files/health/thresholds/: set lingjun_slurm.nccl.profile or lingjun_slurm.nccl.instance_type to a name that has them, or lingjun_slurm.health.enabled: false"
    fi
}

lj_health_conf_text() {
    local key name value
    cat <<EOF
# Managed by lingjun-slurm cluster-init (execute spec): set lingjun_slurm.health.* instead, or put site settings in $LJ_HEALTH_DROPINS/*.conf (read after this file, never written by the installer).
SKU=$LJ_SKU
THRESHOLDS_DIR=$LJ_THRESHOLDS
NCCL_CONF=/etc/nccl.conf
ENROOT_CONF=/etc/enroot/enroot.conf
ENROOT_IMAGE=$(lj_cfg health.enroot_image)
MIN_FREE_GB=$(lj_cfg health.min_free_gb)
EOF
    for key in GPU_COUNT:gpu_count IB_PORT_COUNT:ib_port_count IB_RATE_GBPS:ib_rate_gbps; do
        name=${key%%:*}
        value=$(lj_cfg "health.${key#*:}")
        [ -z "$value" ] || printf '%s=%s\n' "$name" "$value"
    done
}

lj_health_install() {
    local src="$LJ_SPEC_FILES/health" f name manifest
    lj_cfg_true health.enabled || return 0
    lj_install_file "$src/lingjun-health" "$LJ_HEALTH_PROGRAM" 0755
    lj_ensure_dir "$LJ_THRESHOLDS" 0755
    lj_ensure_dir "$LJ_HEALTH_DROPINS" 0755
    # The per-SKU thresholds and the XID table (xid.tsv) the program reads beside them.
    for f in "$src"/thresholds/*.conf "$src"/thresholds/*.tsv; do
        [ -f "$f" ] && lj_install_file "$f" "$LJ_THRESHOLDS/${f##*/}" 0644
    done
    # Files an earlier run installed and the project no longer ships go; anything else in the
    # directory (a site's own thresholds) is left alone.
    manifest=$(lj_path "$LJ_THRESHOLDS_MANIFEST")
    if [ -f "$manifest" ]; then
        while IFS= read -r name; do
            [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*\.(conf|tsv)$ ]] || continue
            [ -f "$src/thresholds/$name" ] || lj_remove "$LJ_THRESHOLDS/$name"
        done <"$manifest"
    fi
    {
        printf '# Written by lingjun-slurm cluster-init: the thresholds files it installed here (it removes only these).\n'
        for f in "$src"/thresholds/*.conf "$src"/thresholds/*.tsv; do
            if [ -f "$f" ]; then printf '%s\n' "${f##*/}"; fi
        done
    } | lj_install_text "$LJ_THRESHOLDS_MANIFEST" 0644
    lj_health_conf_text | lj_install_text "$LJ_HEALTH_CONF" 0644
}

lj_boot_id() {
    local id
    id=$(lj_path /proc/sys/kernel/random/boot_id)
    if [ -r "$id" ]; then cat -- "$id"; else printf unknown; fi
}

# lingjun-health --boot, once per boot (the stamp lives in /run and names the boot).
# drain (the default): a failing node is drained with the failure as reason, or, when Slurm
# cannot take it yet (slurmctld unreachable, slurmd not registered), the program keeps the
# verdict in /var/lib/lingjun-slurm/health/boot-failure and slurmd's first HealthCheckProgram
# run applies it; cluster-init goes on either way (the node is out of service, not broken).
# fail: the same, then cluster-init fails (CycleCloud marks the node failed). warn: check and
# log only (--no-drain); the periodic check drains later. off: no boot check.
# Exit 2 from the program (bad health.conf or drop-in) fails cluster-init under drain and
# fail: the periodic check would reject the same configuration and never drain anything.
lj_health_boot_check() {
    local policy stamp boot node rc=0 out line verdict
    lj_cfg_true health.enabled || return 0
    policy=$(lj_cfg health.boot_check)
    [ "$policy" != off ] || return 0
    stamp=$(lj_path "$LJ_BOOT_STAMP")
    boot=$(lj_boot_id)
    if [ -f "$stamp" ] && [ "$(cat -- "$stamp")" = "$boot" ]; then
        lj_log "the boot health check already ran during this boot"
        return 0
    fi
    # The Slurm node name: on CycleCloud it is the CycleCloud node name (slurmd runs with -N
    # NAME), which need not be the host name lingjun-health falls back to.
    local -a args=(--boot)
    [ "$policy" != warn ] || args+=(--no-drain)
    node=$(lj_jetpack_value cyclecloud.node.name)
    [ -z "$node" ] || args+=(--node "$node")
    lj_log "run: $LJ_HEALTH_PROGRAM ${args[*]}"
    # in a sandbox, lingjun-health reads the node's files under the same root
    out=$(LINGJUN_HEALTH_ROOT=$LJ_ROOT "$(lj_path "$LJ_HEALTH_PROGRAM")" "${args[@]}" 2>&1) || rc=$?
    while IFS= read -r line; do
        [ -z "$line" ] || lj_log "  $line"
    done <<<"$out"
    if [ $rc -eq 2 ] && [ "$policy" != warn ]; then
        lj_die "the boot health check cannot run (lingjun-health --boot exited 2: bad configuration, see above); fix health.conf or $LJ_HEALTH_DROPINS"
    fi
    if [ $rc -ne 0 ]; then
        verdict=$(grep -m 1 -E '^(DRAIN|KEEP|BOOT-FAILURE) ' <<<"$out" || true)
        case $policy in
            fail)
                lj_die "the boot health check failed (lingjun-health --boot exited $rc)${verdict:+: $verdict}; this node must not take jobs. Fix it, or set lingjun_slurm.health.boot_check: drain"
                ;;
            drain)
                lj_warn "the boot health check failed (lingjun-health --boot exited $rc)${verdict:+: $verdict}; the node takes no jobs until the check passes; continuing (lingjun_slurm.health.boot_check is drain)"
                ;;
            *)
                lj_warn "the boot health check failed (lingjun-health --boot exited $rc); continuing (lingjun_slurm.health.boot_check is warn)"
                ;;
        esac
    else
        lj_log "the boot health check passed"
    fi
    mkdir -p -- "$(dirname -- "$stamp")"
    printf '%s\n' "$boot" >"$stamp"
}
