# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# enroot: the pinned packages, /etc/enroot/enroot.conf, the extra hooks, and registry
# credentials that users' pyxis imports can use.

LJ_ENROOT_PKGS=()   # verified package files to install (empty: nothing to install)
LJ_ENROOT_NAMES=()  # package names (enroot, enroot+caps)
LJ_ENROOT_HELD=""   # of those, the ones held now: released for the upgrade and held again
LJ_NVCLI_PKGS=()    # verified libnvidia-container package files to install
LJ_NVCLI_HELD=""
readonly LJ_NVCLI_NAMES=(libnvidia-container1 libnvidia-container-tools)
# The oldest libnvidia-container kept by default: 1.16.2 fixes CVE-2024-0132, a container
# escape through nvidia-container-cli's mounts (advisory GHSA-q2v4-jw5g-9xxj of
# NVIDIA/libnvidia-container; "critical security updates", NVIDIA Container Toolkit 1.16.2
# release notes, NVIDIA/cloud-native-docs#106).
readonly LJ_NVCLI_FLOOR=1.16.2
readonly LJ_CRED_MASTER=/etc/lingjun-slurm/enroot/credentials
readonly LJ_CRED_BASE=/run/lingjun-slurm/enroot-config
readonly LJ_PROLOG_NAME=60-lingjun-enroot-credentials.sh
readonly LJ_HOOKS_STATE=/var/lib/lingjun-slurm/enroot-hooks # the hooks this installer enabled

# lj_enroot_package_file NAME VERSION: the release asset name NVIDIA publishes.
lj_enroot_package_file() {
    if [ "$LJ_OS_FAMILY" = deb ]; then
        printf '%s_%s-1_%s.deb' "$1" "$2" "$(lj_arch_deb)"
    else
        printf '%s-%s-1.el8.%s.rpm' "$1" "$2" "$(lj_arch_rpm)"
    fi
}

# Before any change: decide whether the enroot packages must be installed, and fetch and verify
# them. What is installed is kept when it is at least lingjun_slurm.enroot.min_version (default:
# enroot.version), held or not: cyclecloud-slurm 4.0.x installs enroot and enroot+caps 4.0.1
# from its own artifacts and holds them (Azure/cyclecloud-slurm 4.0.9 azure-slurm-install/
# ubuntu.sh:11,41-54,153). An older one is upgraded to enroot.version, and held again when it
# was held. cyclecloud-slurm runs ubuntu.sh only until /etc/azslurm-bins.installed records a
# success for the same Slurm version (install.py run_installer, 256-291), so it does not put
# 4.0.1 back at the next boot.
lj_enroot_preflight() {
    local version floor name file have need=0 held="" all_pinned=1
    local -a found=()
    lj_nvcli_preflight
    lj_cfg_true enroot.install || return 0
    version=$(lj_cfg enroot.version)
    floor=$(lj_cfg_floor enroot.min_version "$version")
    lj_version_ge "$version" "$floor" ||
        lj_config_bad lingjun_slurm.enroot.min_version "the floor $floor is above lingjun_slurm.enroot.version $version"
    LJ_ENROOT_NAMES=(enroot)
    if lj_cfg_true enroot.caps; then
        LJ_ENROOT_NAMES+=("enroot+caps")
    elif lj_pkg_installed "enroot+caps"; then
        # installed by someone else (cyclecloud-slurm): it depends on exactly its enroot's
        # version (NVIDIA/enroot pkg/deb/control, "#PACKAGE# (= ${binary:Version})"), so it
        # moves with enroot
        LJ_ENROOT_NAMES+=("enroot+caps")
    fi
    for name in "${LJ_ENROOT_NAMES[@]}"; do
        have=$(lj_pkg_version "$name")
        found+=("$(lj_pkg_describe "$name")")
        ! lj_pkg_held "$name" || held+=" $name"
        [ "$have" = "$version" ] || all_pinned=0
        if [ -z "$have" ] || ! lj_version_ge "$have" "$floor"; then
            need=1
        fi
    done
    if [ $need -eq 0 ]; then
        if [ $all_pinned -eq 1 ]; then
            lj_log "enroot $version is installed"
        else
            lj_log "enroot: adopting the installed $(lj_join ', ' "${found[@]}"): at least $floor (lingjun_slurm.enroot.min_version), so the pinned $version is not installed"
        fi
        return 0
    fi
    LJ_ENROOT_HELD=${held# }
    if [ -n "$LJ_ENROOT_HELD" ]; then
        lj_log "enroot: upgrading the held $(lj_join ', ' "${found[@]}") to the pinned $version (below the floor $floor, lingjun_slurm.enroot.min_version); they are held again afterwards"
    else
        lj_log "enroot: installing the pinned $version (found $(lj_join ', ' "${found[@]}"); floor $floor)"
    fi
    for name in "${LJ_ENROOT_NAMES[@]}"; do
        lj_require_checksum "$(lj_enroot_package_file "$name" "$version")"
    done
    for name in "${LJ_ENROOT_NAMES[@]}"; do
        file=$(lj_enroot_package_file "$name" "$version")
        lj_fetch "$file" "https://github.com/NVIDIA/enroot/releases/download/v$version/$file"
        LJ_ENROOT_PKGS+=("$LJ_FETCHED")
    done
}

lj_enroot_install() {
    local version name extra
    if lj_cfg_true enroot.install; then
        version=$(lj_cfg enroot.version)
        if [ ${#LJ_ENROOT_PKGS[@]} -gt 0 ]; then
            lj_pkg_install_pinned enroot "$LJ_ENROOT_HELD" "${LJ_ENROOT_PKGS[@]}"
            for name in "${LJ_ENROOT_NAMES[@]}"; do
                [ "$(lj_pkg_version "$name")" = "$version" ] ||
                    lj_die "$name $version is not installed after installing its package (found '$(lj_pkg_version "$name")')"
            done
        fi
        read -r -a extra <<<"$(lj_cfg enroot.extra_packages)"
        [ ${#extra[@]} -eq 0 ] || lj_pkg_ensure "${extra[@]}"
    fi
    lj_nvcli_install
}

# lj_join SEP WORDS...: the words joined by SEP.
lj_join() {
    local sep=$1 out=""
    shift
    local word
    for word in "$@"; do out+="${out:+$sep}$word"; done
    printf '%s' "$out"
}

# lj_nvcli_package_file NAME VERSION / lj_nvcli_url FILE: the file names and locations of
# NVIDIA's libnvidia-container repository, https://nvidia.github.io/libnvidia-container (the
# gh-pages branch of NVIDIA/libnvidia-container: stable/deb/ARCH/NAME_VERSION-1_ARCH.deb,
# stable/rpm/ARCH/NAME-VERSION-1.ARCH.rpm; its Packages index lists the SHA-256 of each .deb).
lj_nvcli_package_file() {
    if [ "$LJ_OS_FAMILY" = deb ]; then
        printf '%s_%s-1_%s.deb' "$1" "$2" "$(lj_arch_deb)"
    else
        printf '%s-%s-1.%s.rpm' "$1" "$2" "$(lj_arch_rpm)"
    fi
}
lj_nvcli_url() {
    local dir
    if [ "$LJ_OS_FAMILY" = deb ]; then dir="deb/$(lj_arch_deb)"; else dir="rpm/$(lj_arch_rpm)"; fi
    printf 'https://github.com/NVIDIA/libnvidia-container/raw/gh-pages/stable/%s/%s' "$dir" "$1"
}

# Before any change: nvidia-container-cli, which enroot's 98-nvidia.sh hook runs for every
# container that asks for GPUs and without which it fails ("Command not found:
# nvidia-container-cli", NVIDIA/enroot 8ea147d conf/hooks/98-nvidia.sh:73-75; requirement
# libnvidia-container-tools >= 1.0, doc/requirements.md:57; the enroot package only Suggests it,
# pkg/deb/control:33). Images built on NVIDIA's CUDA images (NGC's) carry
# NVIDIA_VISIBLE_DEVICES=all in their environment, so the hook runs it for them.
# lingjun_slurm.enroot.nvidia_container_cli: install (default) keeps an installed one at least
# libnvidia_container_min_version (the Azure HPC images ship and hold one) and otherwise installs
# the pinned, checksum-verified libnvidia-container1 and libnvidia-container-tools; require
# installs nothing and refuses a node without one; off checks nothing (nodes without GPUs).
lj_nvcli_preflight() {
    local mode version floor have="" seen="" cli="" name file held=""
    mode=$(lj_cfg enroot.nvidia_container_cli)
    if [ "$mode" = off ]; then
        lj_log "nvidia-container-cli: not checked (lingjun_slurm.enroot.nvidia_container_cli is off); enroot cannot start GPU containers without it"
        return 0
    fi
    version=$(lj_cfg enroot.libnvidia_container_version)
    floor=$(lj_cfg_floor enroot.libnvidia_container_min_version "$LJ_NVCLI_FLOOR")
    lj_version_ge "$version" "$floor" ||
        lj_config_bad lingjun_slurm.enroot.libnvidia_container_min_version "the floor $floor is above lingjun_slurm.enroot.libnvidia_container_version $version"
    have=$(lj_pkg_version libnvidia-container-tools)
    cli=$(lj_node_command nvidia-container-cli) || cli=""
    if [ -n "$have" ]; then
        seen=$(lj_pkg_describe libnvidia-container-tools)
    elif [ -n "$cli" ]; then
        # not from a package (built from source): its own report, "cli-version: X"
        # (NVIDIA/libnvidia-container src/cli/main.c print_version)
        have=$("$(lj_path "$cli")" --version 2>/dev/null | sed -n 's/^cli-version: //p' | head -n 1) || have=""
        seen="$cli ${have:-(version unknown)}, not from a package"
    fi
    if [ -n "$have" ] && lj_version_ge "$have" "$floor"; then
        [ -n "$cli" ] || lj_warn "nvidia-container-cli: libnvidia-container-tools is installed but there is no nvidia-container-cli on the node"
        lj_log "nvidia-container-cli: keeping $seen (at least $floor, lingjun_slurm.enroot.libnvidia_container_min_version)"
        return 0
    fi
    if [ "$mode" = require ]; then
        lj_die "enroot cannot start GPU containers on this node: its 98-nvidia.sh hook needs nvidia-container-cli from libnvidia-container-tools $floor or later, found ${seen:-none}. Install libnvidia-container-tools (NVIDIA's repository https://nvidia.github.io/libnvidia-container), or set lingjun_slurm.enroot.nvidia_container_cli to install (the pinned, checksum-verified packages) or to off (nodes without GPUs)"
    fi
    for name in "${LJ_NVCLI_NAMES[@]}"; do
        ! lj_pkg_held "$name" || held+=" $name"
    done
    LJ_NVCLI_HELD=${held# }
    lj_log "nvidia-container-cli: installing the pinned libnvidia-container $version (found ${seen:-none}; floor $floor)"
    [ -z "$cli" ] || [ -n "$(lj_pkg_version libnvidia-container-tools)" ] ||
        lj_warn "nvidia-container-cli: $cli is not from a package; the packaged one goes to /usr/bin, and whichever comes first on PATH is the one enroot runs"
    for name in "${LJ_NVCLI_NAMES[@]}"; do
        lj_require_checksum "$(lj_nvcli_package_file "$name" "$version")"
    done
    for name in "${LJ_NVCLI_NAMES[@]}"; do
        file=$(lj_nvcli_package_file "$name" "$version")
        lj_fetch "$file" "$(lj_nvcli_url "$file")"
        LJ_NVCLI_PKGS+=("$LJ_FETCHED")
    done
}

lj_nvcli_install() {
    local version name
    [ ${#LJ_NVCLI_PKGS[@]} -gt 0 ] || return 0
    version=$(lj_cfg enroot.libnvidia_container_version)
    lj_pkg_install_pinned libnvidia-container "$LJ_NVCLI_HELD" "${LJ_NVCLI_PKGS[@]}"
    for name in "${LJ_NVCLI_NAMES[@]}"; do
        [ "$(lj_pkg_version "$name")" = "$version" ] ||
            lj_die "$name $version is not installed after installing its package (found '$(lj_pkg_version "$name")')"
    done
    lj_node_command nvidia-container-cli >/dev/null ||
        lj_die "libnvidia-container-tools $version is installed but there is no nvidia-container-cli on the node"
}

lj_enroot_conf_text() {
    local base=$1 credentials=$2
    cat <<EOF
# Managed by lingjun-slurm cluster-init (execute spec): set lingjun_slurm.enroot.* instead.
# Per-user paths on the node's scratch ($LJ_SCRATCH); enroot evaluates \$(id -u) per user.
ENROOT_RUNTIME_PATH $base/runtime/user-\$(id -u)
ENROOT_CACHE_PATH $base/cache/user-\$(id -u)
ENROOT_DATA_PATH $base/data/user-\$(id -u)
ENROOT_TEMP_PATH $base/tmp
ENROOT_SQUASH_OPTIONS $(lj_cfg enroot.squash_options)
ENROOT_MOUNT_HOME $(lj_yes_no enroot.mount_home)
ENROOT_RESTRICT_DEV $(lj_yes_no enroot.restrict_dev)
ENROOT_ROOTFS_WRITABLE $(lj_yes_no enroot.rootfs_writable)
# MELLANOX_VISIBLE_DEVICES is in /etc/enroot/environ.d/50-lingjun-mellanox.env: this file takes
# MELLANOX_* and NVIDIA_* keys too, but a value here would also override a container's own
# "enroot start --env MELLANOX_VISIBLE_DEVICES=...".
EOF
    if [ "$credentials" = true ]; then
        cat <<EOF
# Registry credentials: a per-user copy made by the Slurm prolog $LJ_PROLOG_NAME.
ENROOT_CONFIG_PATH $LJ_CRED_BASE/\$(id -u)
EOF
    fi
}

lj_yes_no() { if lj_cfg_true "$1"; then printf yes; else printf no; fi; }

lj_enroot_configure() {
    local base="$LJ_SCRATCH/enroot" dir hook src credentials=false
    lj_ensure_dir "$base" 0755
    for dir in runtime cache data tmp; do
        lj_ensure_dir "$base/$dir" 1777
    done
    lj_enroot_credentials_configured && credentials=true
    lj_enroot_conf_text "$base" "$credentials" | lj_install_text /etc/enroot/enroot.conf 0644
    lj_ensure_dir /etc/enroot/environ.d 0755
    printf 'MELLANOX_VISIBLE_DEVICES=%s\n' "$(lj_cfg enroot.mellanox_visible_devices)" |
        lj_install_text /etc/enroot/environ.d/50-lingjun-mellanox.env 0644
    lj_ensure_dir /etc/enroot/hooks.d 0755
    local -a enabled=()
    for hook in $(lj_cfg enroot.hooks); do
        src=$(lj_path "/usr/share/enroot/hooks.d/$hook")
        if [ -f "$src" ]; then
            lj_install_file "$src" "/etc/enroot/hooks.d/$hook" 0755
            enabled+=("$hook")
        else
            lj_warn "enroot hook /usr/share/enroot/hooks.d/$hook not found (is enroot installed?); not enabled"
        fi
    done
    # A hook enabled by an earlier run and no longer in lingjun_slurm.enroot.hooks is disabled
    # again; hooks the installer never enabled (enroot's own, an admin's) are left alone.
    local state old
    state=$(lj_path "$LJ_HOOKS_STATE")
    if [ -f "$state" ]; then
        while IFS= read -r old; do
            [[ $old =~ ^[A-Za-z0-9._+-]+$ ]] || continue
            [[ " ${enabled[*]} " == *" $old "* ]] || lj_remove "/etc/enroot/hooks.d/$old"
        done <"$state"
    fi
    if [ ${#enabled[@]} -gt 0 ]; then
        printf '%s\n' "${enabled[@]}" | lj_install_text "$LJ_HOOKS_STATE" 0644
    elif [ -f "$state" ]; then
        lj_remove "$LJ_HOOKS_STATE"
    fi
}

lj_enroot_credentials_configured() {
    [ -n "$(lj_cfg enroot.credentials)" ] || [ -n "$(lj_cfg enroot.credentials_file)" ]
}

# lj_enroot_credentials_write DEST: the credentials, one validated netrc entry per line,
# into DEST. Entries are checked and errors name the entry's position, never its content.
lj_enroot_credentials_write() {
    local dest=$1 value source n=0 entry
    local -a entries words
    if [ -n "$(lj_cfg enroot.credentials)" ]; then
        [ -z "$(lj_cfg enroot.credentials_file)" ] ||
            lj_die 2 "set lingjun_slurm.enroot.credentials or lingjun_slurm.enroot.credentials_file, not both"
        value=$(lj_cfg enroot.credentials)
        source="lingjun_slurm.enroot.credentials"
        IFS=';' read -r -a entries <<<"${value//$'\n'/;}"
    else
        source=$(lj_cfg enroot.credentials_file)
        [ -r "$(lj_path "$source")" ] || lj_die 2 "cannot read lingjun_slurm.enroot.credentials_file $source"
        mapfile -t entries <"$(lj_path "$source")"
    fi
    : >"$dest"
    for entry in "${entries[@]}"; do
        read -r -a words <<<"$entry"
        [ ${#words[@]} -eq 0 ] && continue
        [[ ${words[0]} == \#* ]] && continue
        n=$((n + 1))
        if [ ${#words[@]} -lt 6 ] || [ "${words[0]}" != machine ] || [ "${words[2]}" != login ] ||
            [ "${words[4]}" != password ] || { [ ${#words[@]} -gt 6 ] && [[ ${words[5]} != \$* ]]; }; then
            lj_die 2 "$source: entry $n is not \"machine HOST login USER password SECRET\""
        fi
        printf '%s\n' "${words[*]}" >>"$dest"
    done
    [ $n -gt 0 ] || lj_die 2 "$source: no credential entries"
}

LJ_CRED_STAGED=""

# Before any change: read and check the credentials into a private staging file.
lj_enroot_credentials_preflight() {
    lj_enroot_credentials_configured || return 0
    LJ_CRED_STAGED=$(umask 077 && mktemp "$LJ_WORK/credentials.XXXXXX")
    lj_enroot_credentials_write "$LJ_CRED_STAGED"
}

lj_enroot_credentials() {
    local staged=$LJ_CRED_STAGED prolog_dir
    prolog_dir="$(lj_cfg slurm.conf_dir)/prolog.d"
    if [ -z "$staged" ]; then
        lj_remove "$LJ_CRED_MASTER"
        lj_remove "$LJ_CRED_BASE/0/.credentials"
        return 0
    fi
    lj_ensure_dir "$(dirname "$LJ_CRED_MASTER")" 0700
    lj_install_file "$staged" "$LJ_CRED_MASTER" 0600
    # root's own copy, for imports run as root (the boot health check's image)
    lj_ensure_dir "$LJ_CRED_BASE" 0755
    lj_ensure_dir "$LJ_CRED_BASE/0" 0700
    lj_install_file "$staged" "$LJ_CRED_BASE/0/.credentials" 0600
    rm -f -- "$staged"
    lj_ensure_dir "$prolog_dir" 0755
    lj_install_file "$LJ_FILES/enroot-credentials-prolog.sh" "$prolog_dir/$LJ_PROLOG_NAME" 0755
    lj_slurm_prolog_covers "$prolog_dir" ||
        lj_warn "slurm.conf has no Prolog=$prolog_dir/* (CycleCloud Slurm sets it): users' containers will not see the registry credentials until it does"
}
