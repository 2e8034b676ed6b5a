# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# The scratch base for enroot and pyxis: lingjun_slurm.storage.scratch when set; else local
# NVMe (already mounted at storage.nvme_mount, or unused NVMe disks formatted and mounted
# there, as RAID0 when there are 2 or more); else /mnt when it is a mount point (Azure's
# resource disk); else /tmp.
#
# A disk is used only when it is an NVMe namespace with no partitions, no holders (RAID,
# LVM), not mounted, no filesystem or RAID signature, and whose model does not match
# storage.nvme_exclude_models (by default Azure's remote OS and data disks). Nothing is
# written to /etc/fstab: local NVMe is ephemeral, and cluster-init runs again at each boot.

LJ_SCRATCH=""
readonly LJ_MD_NAME=lingjun-nvme

# lj_mount_source NODE_PATH: the device mounted at NODE_PATH, or nothing.
lj_mount_source() {
    local mounts
    mounts=$(lj_path /proc/mounts)
    [ -r "$mounts" ] || return 0
    awk -v p="$1" '$2 == p { src = $1 } END { if (src != "") print src }' "$mounts"
}

# lj_has_signature DEV: whether blkid finds a filesystem, RAID or partition-table signature
# on DEV. Only blkid's "nothing found" (exit status 2) means none: any other failure
# (ambivalent result, 8; a device it cannot open) counts as "in use", so that such a disk is
# never formatted.
lj_has_signature() {
    local rc=0
    blkid -p "$1" >/dev/null 2>&1 || rc=$?
    [ "$rc" -ne 2 ]
}

# lj_is_our_scratch DEV: whether DEV holds the XFS file system lj_mount_scratch made on a
# single disk (label $LJ_MD_NAME): after a reboot it is mounted again, never reformatted.
lj_is_our_scratch() {
    local type label
    type=$(blkid -p -s TYPE -o value "$1" 2>/dev/null) || return 1
    label=$(blkid -p -s LABEL -o value "$1" 2>/dev/null) || return 1
    [ "$type" = xfs ] && [ "$label" = "$LJ_MD_NAME" ]
}

lj_nvme_excluded() {
    local model=$1 pattern
    local -a patterns
    IFS=, read -r -a patterns <<<"$(lj_cfg storage.nvme_exclude_models)"
    for pattern in "${patterns[@]}"; do
        pattern=$(printf '%s' "$pattern" | sed 's/^ *//; s/ *$//')
        [ -n "$pattern" ] && [[ $model == *"$pattern"* ]] && return 0
    done
    return 1
}

# lj_nvme_candidates: the unused local NVMe namespaces, one /dev path per line.
lj_nvme_candidates() {
    local sys name model
    for sys in "$(lj_path /sys/block)"/nvme*n*; do
        [ -d "$sys" ] || continue
        name=${sys##*/}
        [[ $name =~ ^nvme[0-9]+n[0-9]+$ ]] || continue
        compgen -G "$sys/${name}p*" >/dev/null && continue
        [ -n "$(ls -A "$sys/holders" 2>/dev/null)" ] && continue
        model=""
        [ -r "$sys/device/model" ] && model=$(tr -s ' ' <"$sys/device/model" | sed 's/ *$//')
        lj_nvme_excluded "$model" && continue
        [ -n "$(lj_mount_source_of_dev "/dev/$name")" ] && continue
        if lj_is_our_scratch "/dev/$name"; then
            printf 'ours /dev/%s\n' "$name"
            continue
        fi
        lj_has_signature "/dev/$name" && continue
        printf 'free /dev/%s\n' "$name"
    done | sort -k2,2V
}

lj_mount_source_of_dev() {
    local mounts
    mounts=$(lj_path /proc/mounts)
    [ -r "$mounts" ] || return 0
    awk -v d="$1" '$1 == d { print $2; exit }' "$mounts"
}

lj_mount_scratch() {
    local dev=$1 mnt=$2
    lj_has_signature "$dev" || lj_run mkfs.xfs -f -q -L "$LJ_MD_NAME" "$dev"
    lj_ensure_dir "$mnt" 0755
    lj_run mount -o noatime "$dev" "$mnt"
    lj_changed "mounted $dev at $mnt"
}

# lj_nvme_setup MOUNT: set LJ_NVME_MOUNTED=1 when local NVMe is mounted at MOUNT.
LJ_NVME_MOUNTED=0
lj_nvme_setup() {
    local mnt=$1 md="" existing
    LJ_NVME_MOUNTED=0
    local -a disks=()
    for existing in "$(lj_path /dev/md)/$LJ_MD_NAME"*; do
        [ -e "$existing" ] && md="/dev/md/${existing##*/}" && break
    done
    if [ -n "$md" ]; then
        lj_log "found the NVMe RAID0 array $md"
        lj_mount_scratch "$md" "$mnt"
        LJ_NVME_MOUNTED=1
        return 0
    fi
    local -a found=()
    local line ours=""
    mapfile -t found < <(lj_nvme_candidates)
    for line in "${found[@]}"; do
        case $line in
        "ours "*) [ -n "$ours" ] || ours=${line#ours } ;;
        "free "*) disks+=("${line#free }") ;;
        esac
    done
    if [ -n "$ours" ]; then
        lj_log "found the NVMe scratch file system $ours (label $LJ_MD_NAME)"
        lj_mount_scratch "$ours" "$mnt"
        LJ_NVME_MOUNTED=1
        return 0
    fi
    case ${#disks[@]} in
    0)
        lj_log "no unused local NVMe disk"
        return 0
        ;;
    1)
        lj_log "one unused local NVMe disk: ${disks[0]}"
        lj_mount_scratch "${disks[0]}" "$mnt"
        ;;
    *)
        lj_log "${#disks[@]} unused local NVMe disks: ${disks[*]}; assembling RAID0 /dev/md/$LJ_MD_NAME"
        lj_run mdadm --create "/dev/md/$LJ_MD_NAME" --run --level=0 --raid-devices="${#disks[@]}" \
            --name="$LJ_MD_NAME" "${disks[@]}"
        lj_changed "assembled RAID0 /dev/md/$LJ_MD_NAME from ${disks[*]}"
        lj_mount_scratch "/dev/md/$LJ_MD_NAME" "$mnt"
        ;;
    esac
    LJ_NVME_MOUNTED=1
}

lj_storage_setup() {
    local configured mnt
    configured=$(lj_cfg storage.scratch)
    mnt=$(lj_cfg storage.nvme_mount)
    if [ -n "$configured" ]; then
        lj_create_dir "$configured" 0755
        LJ_SCRATCH=$configured
        lj_log "scratch: $LJ_SCRATCH (lingjun_slurm.storage.scratch)"
        return 0
    fi
    if [ -n "$(lj_mount_source "$mnt")" ]; then
        LJ_SCRATCH=$mnt
        lj_log "scratch: $LJ_SCRATCH (local NVMe, already mounted)"
        return 0
    fi
    if lj_cfg_true storage.nvme_raid; then
        lj_nvme_setup "$mnt"
    fi
    if [ "$LJ_NVME_MOUNTED" -eq 1 ]; then
        LJ_SCRATCH=$mnt
        lj_log "scratch: $LJ_SCRATCH (local NVMe)"
        return 0
    fi
    if [ -n "$(lj_mount_source /mnt)" ]; then
        LJ_SCRATCH=/mnt
        lj_log "scratch: /mnt (no local NVMe; /mnt is a mount point)"
        return 0
    fi
    LJ_SCRATCH=/tmp
    lj_warn "scratch: /tmp (no local NVMe and /mnt is not a mount point): container images will live on the OS disk"
}
