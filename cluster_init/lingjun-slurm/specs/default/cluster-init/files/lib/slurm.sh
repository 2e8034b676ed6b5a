# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# Slurm configuration: the plugstack.conf include, the health-check block of slurm.conf,
# the prolog check, and restarting or reconfiguring the daemons only after a change.

readonly LJ_HC_BEGIN="# BEGIN lingjun-slurm health checks"
readonly LJ_HC_END="# END lingjun-slurm health checks"
readonly LJ_HC_DISABLED="#lingjun-slurm# "
readonly LJ_HEALTH_PROGRAM=/usr/local/sbin/lingjun-health
# slurm.conf's HealthCheckProgram is one path for every node. It names a dispatcher beside the
# real slurm.conf (on CycleCloud /sched/CLUSTER/, shared with every node, where cyclecloud-slurm
# keeps slurm.conf and its healthagent health.sh): nodes with the execute spec run
# lingjun-health, the others (a CPU nodearray without it) run the HealthCheckProgram the block
# replaced, so they keep CycleCloud's healthagent check.
readonly LJ_HEALTH_DISPATCH_NAME=lingjun-healthcheck
LJ_HEALTH_DISPATCH=""

# lj_plugstack_include CONF_DIR: plugstack.conf includes plugstack.conf.d/* (appended when
# missing; the file is created when absent). Sets LJ_LAST_CHANGED.
lj_plugstack_include() {
    local conf_dir=$1 node real want mode
    node="$conf_dir/plugstack.conf"
    want="include $conf_dir/plugstack.conf.d/*"
    real=$(lj_resolve "$node")
    LJ_LAST_CHANGED=0
    if [ -f "$real" ] && awk -v w="$want" '{ $1 = $1 } $0 == w { found = 1 } END { exit !found }' "$real"; then
        return 0
    fi
    if [ -f "$real" ]; then
        mode=$(lj_mode_of "$real")
        { cat -- "$real"; printf '# Added by lingjun-slurm cluster-init: SPANK plugins such as pyxis\n%s\n' "$want"; } |
            lj_install_text "$node" "0$mode"
    else
        printf '%s\n' "$want" | lj_install_text "$node" 0644
    fi
}

# lj_slurm_prolog_covers DIR: whether slurm.conf runs the scripts in DIR as prologs.
lj_slurm_prolog_covers() {
    local prolog
    prolog=$(lj_slurm_conf_value Prolog)
    [[ ",$prolog," == *",$1/*,"* ]]
}

lj_health_block_text() {
    printf '%s\n' "$LJ_HC_BEGIN"
    printf '# Managed by lingjun-slurm cluster-init (scheduler spec): set lingjun_slurm.health.* instead.\n'
    printf 'HealthCheckProgram=%s\n' "$LJ_HEALTH_DISPATCH"
    printf 'HealthCheckInterval=%s\n' "$(lj_cfg health.interval)"
    printf 'HealthCheckNodeState=%s\n' "$(lj_cfg health.node_state)"
    printf '%s\n' "$LJ_HC_END"
}

# lj_health_replaced SLURM_CONF: the HealthCheckProgram slurm.conf had before our block (the
# live line, or the one we commented out), without quotes; empty when none or "".
lj_health_replaced() {
    awk -v b="$LJ_HC_BEGIN" -v e="$LJ_HC_END" -v mark="$LJ_HC_DISABLED" '
        $0 == b { skip = 1; next }
        skip { if ($0 == e) skip = 0; next }
        {
            line = $0
            if (index(line, mark) == 1) line = substr(line, length(mark) + 1)
            if (tolower(line) !~ /^[ \t]*healthcheckprogram[ \t]*=/) next
            v = line; sub(/^[^=]*=[ \t]*/, "", v); sub(/[ \t]*#.*$/, "", v); sub(/[ \t]+$/, "", v)
            if (v ~ /^".*"$/) v = substr(v, 2, length(v) - 2)
            prog = v
        }
        END { print prog }
    ' "$1"
}

# lj_health_dispatch_text REPLACED: the dispatcher script (POSIX sh: the nodes' /bin/sh).
lj_health_dispatch_text() {
    local replaced=$1
    printf '#!/bin/sh\n'
    printf '# Managed by lingjun-slurm cluster-init (scheduler spec): the HealthCheckProgram of every node.\n'
    printf '# Nodes with the execute spec run lingjun-health; the others run what slurm.conf had before:\n'
    printf "replaced='%s'\n" "$replaced" # a path without "'" (lj_slurm_health_conf)
    cat <<'EOF'
# LINGJUN_HEALTH_ROOT: a node tree to look in instead of / (as lingjun-health --root; tests).
root=${LINGJUN_HEALTH_ROOT:-}
if [ -x "$root/usr/local/sbin/lingjun-health" ]; then
    exec "$root/usr/local/sbin/lingjun-health" "$@"
fi
if [ -n "$replaced" ] && [ -x "$root$replaced" ]; then
    exec "$root$replaced" "$@"
fi
exit 0
EOF
}

# The scheduler's slurm.conf: our marked block with the health-check settings, and any other
# HealthCheck* line commented out (prefix "#lingjun-slurm# ") so that Slurm sees each setting
# once. With lingjun_slurm.health.enabled false, the block goes and those lines come back.
lj_slurm_health_conf() {
    local node real enabled=0 block mode replaced dir
    node="$(lj_cfg slurm.conf_dir)/slurm.conf"
    real=$(lj_resolve "$node")
    [ -f "$real" ] || lj_die "no $node: is this the Slurm scheduler?"
    lj_cfg_true health.enabled && enabled=1
    # The dispatcher goes beside the real slurm.conf (through CycleCloud's /etc/slurm symlinks).
    dir=$(dirname -- "$real")
    LJ_HEALTH_DISPATCH="${dir#"$LJ_ROOT"}/$LJ_HEALTH_DISPATCH_NAME"
    replaced=$(lj_health_replaced "$real")
    if [ "$replaced" = "$LJ_HEALTH_DISPATCH" ] || [ "$replaced" = "$LJ_HEALTH_PROGRAM" ]; then replaced=""; fi
    if [[ $replaced == *"'"* || ( -n $replaced && $replaced != /* ) ]]; then
        lj_warn "the HealthCheckProgram slurm.conf had, $replaced, is not an absolute path without quotes: nodes without lingjun-health get no health check"
        replaced=""
    fi
    if ((enabled)); then
        lj_health_dispatch_text "$replaced" | lj_install_text "$LJ_HEALTH_DISPATCH" 0755
        if [ -n "$replaced" ]; then
            lj_log "HealthCheckProgram: $LJ_HEALTH_DISPATCH (lingjun-health where the execute spec installed it, else $replaced)"
        fi
    else
        lj_remove "$LJ_HEALTH_DISPATCH"
    fi
    block="$LJ_WORK/health-block"
    lj_health_block_text >"$block"
    mode=$(lj_mode_of "$real")
    awk -v enabled="$enabled" -v block="$block" -v b="$LJ_HC_BEGIN" -v e="$LJ_HC_END" -v mark="$LJ_HC_DISABLED" '
        $0 == b { skip = 1; next }
        skip { if ($0 == e) skip = 0; next }
        index($0, mark) == 1 { if (enabled) print; else print substr($0, length(mark) + 1); next }
        enabled && tolower($0) ~ /^[ \t]*healthcheck(program|interval|nodestate)[ \t]*=/ { print mark $0; next }
        { print }
        END { if (enabled) while ((getline line < block) > 0) print line }
    ' "$real" | lj_install_text "$node" "0$mode"
    if [ "$LJ_LAST_CHANGED" -eq 1 ]; then
        if lj_service_active slurmctld; then
            lj_run scontrol reconfigure
        else
            lj_log "slurmctld is not running: the health-check settings apply when it starts"
        fi
    fi
}

readonly LJ_RESTART_PENDING=/run/lingjun-slurm/slurmd-restart-pending

# Remember a needed restart until it is done: a run that stops before it (a failed boot
# health check) leaves the marker, and the next run restarts slurmd although nothing changes.
lj_slurmd_restart_mark() {
    [ "$LJ_SLURMD_RESTART" -eq 1 ] || return 0
    mkdir -p -- "$(lj_path "$(dirname "$LJ_RESTART_PENDING")")"
    : >"$(lj_path "$LJ_RESTART_PENDING")"
}

lj_slurmd_restart_if_needed() {
    local pending
    pending=$(lj_path "$LJ_RESTART_PENDING")
    [ "$LJ_SLURMD_RESTART" -eq 1 ] || [ -f "$pending" ] || return 0
    rm -f -- "$pending"
    if ! lj_cfg_true slurm.restart_slurmd; then
        lj_log "pyxis changed; not restarting slurmd (lingjun_slurm.slurm.restart_slurmd is false)"
    elif lj_service_active slurmd; then
        lj_run systemctl restart slurmd
    else
        lj_log "pyxis changed; slurmd is not running, so it loads the plugin when it starts"
    fi
}
