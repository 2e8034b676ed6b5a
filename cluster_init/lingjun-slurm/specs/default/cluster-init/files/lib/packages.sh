# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# The operating system (from /etc/os-release) and its package manager.

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

# lj_pkg_version NAME: the installed version of a package (upstream part, without the
# Debian revision or RPM release), or nothing when it is not installed.
lj_pkg_version() {
    local out
    if [ "$LJ_OS_FAMILY" = deb ]; then
        # shellcheck disable=SC2016 # dpkg-query's format fields, not shell expansions
        out=$(dpkg-query -W -f='${Status}|${Version}' "$1" 2>/dev/null) || return 0
        [[ $out == "install ok installed|"* ]] || return 0
        out=${out#*|}
        printf '%s' "${out%-*}"
    else
        out=$(rpm -q --qf '%{VERSION}' "$1" 2>/dev/null) || return 0
        printf '%s' "$out"
    fi
}

lj_pkg_installed() { [ -n "$(lj_pkg_version "$1")" ]; }

# lj_pkg_install ARGS...: install package names and/or package files with their dependencies.
lj_pkg_install() {
    if [ "$LJ_OS_FAMILY" = deb ]; then
        lj_run env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        lj_run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades "$@"
    elif command -v dnf >/dev/null 2>&1; then
        lj_run dnf install -y -q "$@"
    else
        lj_run yum install -y -q "$@"
    fi
    local arg names=()
    for arg in "$@"; do names+=("${arg##*/}"); done
    lj_changed "installed packages: ${names[*]}"
}

# lj_pkg_ensure NAMES...: install the named packages that are missing.
lj_pkg_ensure() {
    local name missing=()
    for name in "$@"; do
        lj_pkg_installed "$name" || missing+=("$name")
    done
    [ ${#missing[@]} -eq 0 ] || lj_pkg_install "${missing[@]}"
}
