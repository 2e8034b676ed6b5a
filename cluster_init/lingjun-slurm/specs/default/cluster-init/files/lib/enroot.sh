# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# enroot: the pinned packages, /etc/enroot/enroot.conf, the extra hooks, and registry
# credentials that users' pyxis imports can use.

LJ_ENROOT_PKGS=()   # verified package files to install (empty: nothing to install)
LJ_ENROOT_NAMES=()  # package names (enroot, enroot+caps)
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

# Before any change: decide whether the packages must be installed, and fetch and verify them.
lj_enroot_preflight() {
    local version name file need=0
    lj_cfg_true enroot.install || return 0
    version=$(lj_cfg enroot.version)
    LJ_ENROOT_NAMES=(enroot)
    lj_cfg_true enroot.caps && LJ_ENROOT_NAMES+=("enroot+caps")
    for name in "${LJ_ENROOT_NAMES[@]}"; do
        [ "$(lj_pkg_version "$name")" = "$version" ] || need=1
    done
    if [ $need -eq 0 ]; then
        lj_log "enroot $version is installed"
        return 0
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
    lj_cfg_true enroot.install || return 0
    version=$(lj_cfg enroot.version)
    if [ ${#LJ_ENROOT_PKGS[@]} -gt 0 ]; then
        lj_pkg_install "${LJ_ENROOT_PKGS[@]}"
        for name in "${LJ_ENROOT_NAMES[@]}"; do
            [ "$(lj_pkg_version "$name")" = "$version" ] ||
                lj_die "$name $version is not installed after installing its package (found '$(lj_pkg_version "$name")')"
        done
    fi
    read -r -a extra <<<"$(lj_cfg enroot.extra_packages)"
    [ ${#extra[@]} -eq 0 ] || lj_pkg_ensure "${extra[@]}"
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
# MELLANOX_VISIBLE_DEVICES is in /etc/enroot/environ.d/50-lingjun-mellanox.env: enroot reads
# only ENROOT_*, SSL_CERT_* and proxy settings from this file.
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
