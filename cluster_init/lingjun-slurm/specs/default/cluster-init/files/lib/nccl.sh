# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# NCCL defaults: /etc/nccl.conf from the execute spec's generated files/nccl/PROFILE.conf,
# the profile chosen by lingjun_slurm.nccl.profile or by the instance type
# (files/nccl/instance-types.tsv; on CycleCloud, the VM size by default).

LJ_NCCL_PROFILE=""
LJ_INSTANCE_TYPE=""
LJ_SKU=""

lj_nccl_known_profiles() {
    local f names=()
    for f in "$LJ_SPEC_FILES"/nccl/*.conf; do
        [ -f "$f" ] && names+=("$(basename "$f" .conf)")
    done
    printf '%s' "${names[*]}"
}

lj_nccl_known_types() {
    awk -F'\t' '!/^#/ && NF >= 2 { printf "%s%s", sep, $1; sep = " " }' "$LJ_SPEC_FILES/nccl/instance-types.tsv"
}

LJ_INSTANCE_TYPE_SRC=""

# Sets LJ_INSTANCE_TYPE: lingjun_slurm.nccl.instance_type, else (CycleCloud) the VM size,
# and LJ_SKU, the name health.conf gives the node (instance type, else NCCL profile).
lj_instance_type() {
    LJ_INSTANCE_TYPE=$(lj_cfg nccl.instance_type)
    LJ_INSTANCE_TYPE_SRC=${LJ_CFG_SRC[lingjun_slurm.nccl.instance_type]}
    if [ -z "$LJ_INSTANCE_TYPE" ]; then
        LJ_INSTANCE_TYPE=$(lj_jetpack_value azure.metadata.compute.vmSize)
        LJ_INSTANCE_TYPE_SRC="jetpack config azure.metadata.compute.vmSize"
    fi
    LJ_SKU=$LJ_INSTANCE_TYPE
}

# Sets LJ_NCCL_PROFILE (after lj_instance_type); LJ_SKU falls back to the profile.
lj_nccl_select() {
    local tsv="$LJ_SPEC_FILES/nccl/instance-types.tsv" where=$LJ_INSTANCE_TYPE_SRC
    [ -f "$tsv" ] || lj_die "missing $tsv: regenerate with python -m lingjun_slurm.nodes.clusterinit_gen cluster_init/"
    LJ_NCCL_PROFILE=$(lj_cfg nccl.profile)
    if [ -n "$LJ_NCCL_PROFILE" ]; then
        [ -f "$LJ_SPEC_FILES/nccl/$LJ_NCCL_PROFILE.conf" ] ||
            lj_die 2 "${LJ_CFG_SRC[lingjun_slurm.nccl.profile]}: lingjun_slurm.nccl.profile: unknown NCCL profile '$LJ_NCCL_PROFILE' (known: $(lj_nccl_known_profiles))"
    elif [ -n "$LJ_INSTANCE_TYPE" ]; then
        LJ_NCCL_PROFILE=$(awk -F'\t' -v t="$LJ_INSTANCE_TYPE" '!/^#/ && $1 == t { print $2; exit }' "$tsv")
        if [ -z "$LJ_NCCL_PROFILE" ]; then
            LJ_NCCL_PROFILE=$(awk -F'\t' -v t="${LJ_INSTANCE_TYPE,,}" '!/^#/ && tolower($1) == t { print $2; exit }' "$tsv")
        fi
        [ -n "$LJ_NCCL_PROFILE" ] ||
            lj_die 2 "$where: instance type '$LJ_INSTANCE_TYPE' has no NCCL profile (known instance types: $(lj_nccl_known_types)); set lingjun_slurm.nccl.profile to one of: $(lj_nccl_known_profiles)"
        [ -f "$LJ_SPEC_FILES/nccl/$LJ_NCCL_PROFILE.conf" ] || lj_die "instance-types.tsv names a missing profile $LJ_NCCL_PROFILE"
    else
        lj_die 2 "no NCCL profile: set lingjun_slurm.nccl.profile (one of: $(lj_nccl_known_profiles)) or lingjun_slurm.nccl.instance_type, or lingjun_slurm.nccl.enabled: false"
    fi
    LJ_SKU=${LJ_INSTANCE_TYPE:-$LJ_NCCL_PROFILE}
    lj_log "NCCL profile: $LJ_NCCL_PROFILE${LJ_INSTANCE_TYPE:+ (instance type $LJ_INSTANCE_TYPE)}"
}

lj_nccl_install() {
    lj_install_file "$LJ_SPEC_FILES/nccl/$LJ_NCCL_PROFILE.conf" /etc/nccl.conf 0644
}
