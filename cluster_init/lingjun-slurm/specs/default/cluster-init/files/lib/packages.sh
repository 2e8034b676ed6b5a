# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# The operating system (from /etc/os-release) and its package manager: what is installed (and
# held), version floors, installing pinned package files beside packages someone else holds.
#
# The package tools run as they are: with LINGJUN_NODE_ROOT the caller points them at the
# sandbox (the tests set APT_CONFIG, DPKG_ROOT and DPKG_ADMINDIR for the real apt-get, apt-mark
# and dpkg-query, see tests/cluster_init/test_packages_real.py).

LJ_OS_ID=""
LJ_OS_VERSION=""
LJ_OS_FAMILY="" # deb | rpm

# lj_os_release_value FILE KEY: the value of KEY in an os-release file, unquoted. The file is
# read, never sourced.
lj_os_release_value() {
    awk -F= -v k="$2" '$1 == k { v = substr($0, length(k) + 2); gsub(/^["'\'']|["'\'']$/, "", v); print v; exit }' "$1"
}

lj_os_detect() {
    local file id_like word
    file=$(lj_path /etc/os-release)
    [ -r "$file" ] || lj_die "cannot read /etc/os-release"
    LJ_OS_ID=$(lj_os_release_value "$file" ID)
    LJ_OS_VERSION=$(lj_os_release_value "$file" VERSION_ID)
    id_like=$(lj_os_release_value "$file" ID_LIKE)
    for word in $LJ_OS_ID $id_like; do
        case $word in
        ubuntu | debian) LJ_OS_FAMILY=deb ;;
        rhel | centos | fedora | almalinux | rocky | ol) LJ_OS_FAMILY=rpm ;;
        *) continue ;;
        esac
        break
    done
    [ -n "$LJ_OS_FAMILY" ] || lj_die "unsupported operating system '$LJ_OS_ID' (Ubuntu/Debian or RHEL-family only)"
    lj_log "operating system: $LJ_OS_ID $LJ_OS_VERSION ($LJ_OS_FAMILY packages)"
}

# lj_arch_deb / lj_arch_rpm: the machine architecture as each package format names it.
lj_arch_rpm() { uname -m; }
lj_arch_deb() {
    case $(uname -m) in
    x86_64) printf amd64 ;;
    aarch64) printf arm64 ;;
    *) uname -m ;;
    esac
}

# lj_dpkg_status NAME: "WANT|VERSION" of a package dpkg has installed, or nothing. dpkg-query's
# ${Status} is "WANT FLAG STATUS"; the package is on the node when FLAG is ok and STATUS is
# installed, whatever WANT says. WANT is "hold" for a package pinned with apt-mark hold, as
# cyclecloud-slurm 4.0.x does to enroot and enroot+caps (Azure/cyclecloud-slurm 4.0.9,
# azure-slurm-install/ubuntu.sh:41-54, which itself counts "hi" and "ii" rows of dpkg -l as
# installed) and the Azure HPC images to libnvidia-container1 and libnvidia-container-tools
# (Azure/azhpc-images components/install_nvidia_container_toolkit.sh:19-22). Real dpkg-query
# output, held and not: "hold ok installed|4.0.1-1", "install ok installed|4.2.1-1".
lj_dpkg_status() {
    local out
    # shellcheck disable=SC2016 # dpkg-query's format fields, not shell expansions
    out=$(dpkg-query -W -f='${Status}|${Version}' "$1" 2>/dev/null) || return 0
    [[ $out == *" ok installed|"* ]] || return 0
    printf '%s|%s' "${out%% *}" "${out#*|}"
}

# lj_pkg_version NAME: the installed version of a package (upstream part, without the
# Debian revision or RPM release), or nothing when it is not installed. A held package is
# installed.
lj_pkg_version() {
    local out
    if [ "$LJ_OS_FAMILY" = deb ]; then
        out=$(lj_dpkg_status "$1")
        [ -n "$out" ] || return 0
        out=${out#*|}
        printf '%s' "${out%-*}"
    else
        out=$(rpm -q --qf '%{VERSION}' "$1" 2>/dev/null) || return 0
        printf '%s' "$out"
    fi
}

lj_pkg_installed() { [ -n "$(lj_pkg_version "$1")" ]; }

# lj_pkg_held NAME: whether the package is installed and held (apt-mark hold). RPM systems have
# no per-package hold in rpm itself: cyclecloud-slurm's rhel.sh holds nothing (it removes enroot
# with rpm -e --nodeps and installs its own, rhel.sh:136), and the dnf.conf exclude= lines the
# Azure HPC images write do not filter package files named on dnf's command line (dnf
# "Exclude system and commandline pkg from filtering", rpm-software-management/dnf#1220).
lj_pkg_held() {
    [ "$LJ_OS_FAMILY" = deb ] || return 1
    [[ $(lj_dpkg_status "$1") == hold\|* ]]
}

# lj_version_ge A B: whether version A is at least B (dpkg's ordering on Debian-family nodes,
# sort -V's elsewhere; upstream versions such as 4.2.1, 0.24.0, 1.20.1 order the same in both).
lj_version_ge() {
    if [ "$LJ_OS_FAMILY" = deb ] && command -v dpkg >/dev/null 2>&1; then
        dpkg --compare-versions "$1" ge "$2"
    else
        [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
    fi
}

# lj_pkg_describe NAME: "NAME VERSION" with " (held)" when held, or "NAME (not installed)".
lj_pkg_describe() {
    local version
    version=$(lj_pkg_version "$1")
    if [ -z "$version" ]; then
        printf '%s (not installed)' "$1"
    elif lj_pkg_held "$1"; then
        printf '%s %s (held)' "$1" "$version"
    else
        printf '%s %s' "$1" "$version"
    fi
}

# lj_pkg_install ARGS...: install package names and/or package files with their dependencies.
# A configuration file the node changed (a conffile: enroot's package ships /etc/enroot/enroot.conf
# and its hooks there, and cyclecloud-slurm and this installer rewrite enroot.conf) is kept
# when a package brings a new one (--force-confdef --force-confold): without them dpkg asks,
# reads end of file on cluster-init's stdin, and leaves the package unpacked but not configured
# ("end of file on stdin at conffile prompt", apt-get exit 100; dpkg 1.21 here). This installer
# writes enroot.conf itself after the packages.
LJ_APT_UPDATED=0 # apt-get update runs once per installer run
lj_pkg_install() {
    local rc=0
    if [ "$LJ_OS_FAMILY" = deb ]; then
        if [ "$LJ_APT_UPDATED" -eq 0 ]; then
            lj_run env DEBIAN_FRONTEND=noninteractive apt-get update -qq || rc=$?
            [ "$rc" -eq 0 ] || { lj_warn "apt-get update failed (exit $rc)"; return "$rc"; }
            LJ_APT_UPDATED=1
        fi
        lj_run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" </dev/null || rc=$?
        [ "$rc" -eq 0 ] || { lj_warn "apt-get install failed (exit $rc)"; return "$rc"; }
    elif command -v dnf >/dev/null 2>&1; then
        lj_run dnf install -y -q "$@" || rc=$?
        [ "$rc" -eq 0 ] || { lj_warn "dnf install failed (exit $rc)"; return "$rc"; }
    else
        lj_run yum install -y -q "$@" || rc=$?
        [ "$rc" -eq 0 ] || { lj_warn "yum install failed (exit $rc)"; return "$rc"; }
    fi
    local arg names=()
    for arg in "$@"; do names+=("${arg##*/}"); done
    lj_changed "installed packages: ${names[*]}"
}

# lj_pkg_install_pinned "WHAT" "HELD NAMES" FILES...: install verified package files for a
# deliberate upgrade (or first install). The packages named in HELD (installed and held, e.g.
# by cyclecloud-slurm) are released with apt-mark unhold just for this install and held again
# afterwards, whether it worked or not. Not apt-get --allow-change-held-packages: that would let
# apt change every other held package too (the NVIDIA container toolkit an image holds beside
# libnvidia-container-tools, say); this way a held package that the upgrade would break still
# stops it (apt-get exits 100), and the node keeps what it had.
lj_pkg_install_pinned() {
    local what=$1 held=$2 rc=0
    shift 2
    local -a hold_names
    read -r -a hold_names <<<"$held"
    if [ ${#hold_names[@]} -gt 0 ]; then
        lj_log "$what: releasing the hold on ${hold_names[*]} for this upgrade; they are held again afterwards"
        lj_run apt-mark unhold "${hold_names[@]}" || lj_die "$what: apt-mark unhold ${hold_names[*]} failed"
    fi
    lj_pkg_install "$@" || rc=$?
    if [ ${#hold_names[@]} -gt 0 ]; then
        if lj_run apt-mark hold "${hold_names[@]}"; then
            [ "$rc" -ne 0 ] || lj_changed "held again: ${hold_names[*]}"
        else
            lj_warn "$what: apt-mark hold ${hold_names[*]} failed: hold them again by hand"
        fi
    fi
    if [ "$rc" -ne 0 ]; then
        local msg="$what: installing ${*##*/} failed (exit $rc; the package manager's error is above)"
        [ ${#hold_names[@]} -eq 0 ] || msg+="; ${hold_names[*]} are held again, as they were"
        lj_die "$msg"
    fi
}

# lj_pkg_ensure NAMES...: install the named packages that are missing (held ones are installed).
lj_pkg_ensure() {
    local name missing=()
    for name in "$@"; do
        lj_pkg_installed "$name" || missing+=("$name")
    done
    [ ${#missing[@]} -eq 0 ] || lj_pkg_install "${missing[@]}" ||
        lj_die "installing ${missing[*]} failed (the package manager's error is above)"
}

# lj_cfg_floor NAME DEFAULT: the version floor lingjun_slurm.NAME, or DEFAULT when it is empty.
# Call it as floor=$(lj_cfg_floor ...) (never local floor=$(...)): a bad value exits 2.
lj_cfg_floor() {
    local value
    value=$(lj_cfg "$1")
    if [ -z "$value" ]; then
        printf '%s' "$2"
        return 0
    fi
    [[ $value =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] ||
        lj_config_bad "lingjun_slurm.$1" "expected a version like 1.2.3 (or nothing), got \"$value\""
    printf '%s' "$value"
}
