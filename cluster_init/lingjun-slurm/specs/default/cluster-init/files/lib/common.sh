# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# Shared helpers: the node root, logging, and idempotent changes to files.
#
# Every path the installer reads or writes on the node goes through lj_path, so that
# LINGJUN_NODE_ROOT=/some/dir runs the whole installer inside a sandbox (the tests do).
# Paths written into configuration files (enroot.conf, pyxis.conf, ...) stay node paths.
#
# Idempotence: lj_install_file writes only when the content or the mode differs and logs
# "changed: PATH" when it does; a second run over an unchanged node logs no change and
# leaves every file's mtime alone.

LJ_ROOT=${LINGJUN_NODE_ROOT:-}
LJ_LOG_FILE=""
LJ_CHANGES=0
LJ_LAST_CHANGED=0
LJ_WORK=""

# lj_path NODE_PATH: where NODE_PATH lives on this filesystem (under the sandbox root, if any).
lj_path() { printf '%s%s' "$LJ_ROOT" "$1"; }

# lj_log_line LINE: append LINE to the log file with a timestamp (bash's own strftime).
lj_log_line() {
    [ -n "$LJ_LOG_FILE" ] || return 0
    printf '%(%Y-%m-%dT%H:%M:%S%z)T %s\n' -1 "$1" >>"$LJ_LOG_FILE"
}

lj_log() {
    local line="[lingjun-slurm] $*"
    printf '%s\n' "$line"
    lj_log_line "$line"
}

lj_warn() {
    local line="[lingjun-slurm] WARNING: $*"
    printf '%s\n' "$line" >&2
    lj_log_line "$line"
}

# lj_die [CODE] MESSAGE: log the error and exit (1 by default; 2 for invalid input).
lj_die() {
    local code=1
    if [[ ${1-} =~ ^[0-9]+$ ]]; then
        code=$1
        shift
    fi
    local line="[lingjun-slurm] ERROR: $*"
    printf '%s\n' "$line" >&2
    lj_log_line "$line"
    exit "$code"
}

lj_changed() {
    LJ_CHANGES=$((LJ_CHANGES + 1))
    LJ_LAST_CHANGED=1
    lj_log "changed: $*"
}

# lj_run CMD ARGS...: run a command that changes the system, logging it first.
# Never pass secrets as arguments: they would be logged (and visible in ps).
lj_run() {
    lj_log "run: $*"
    "$@"
}

lj_log_init() {
    local dir
    dir=$(lj_path /var/log/lingjun-slurm)
    mkdir -p "$dir"
    LJ_LOG_FILE="$dir/install.log"
    touch "$LJ_LOG_FILE"
    chmod 0640 "$LJ_LOG_FILE"
}

# A private (0700) scratch directory for generated files, removed on exit.
lj_work_init() {
    LJ_WORK=$(mktemp -d "${TMPDIR:-/tmp}/lingjun-slurm.XXXXXX")
    chmod 0700 "$LJ_WORK"
    trap 'rm -rf -- "$LJ_WORK"' EXIT
}

lj_octal() { printf '%o' "$((8#$1))"; }

# lj_mode_of PATH: the permission bits of PATH in octal without a leading zero ("644").
lj_mode_of() { stat -c %a -- "$1"; }

# lj_resolve NODE_PATH: the filesystem path to write for NODE_PATH. A symlink (CycleCloud
# links /etc/slurm/slurm.conf to /sched/<cluster>/slurm.conf) is written through, never
# replaced by a file.
lj_resolve() {
    local real
    real=$(lj_path "$1")
    if [ -L "$real" ]; then
        real=$(readlink -f -- "$real")
        [ -d "$(dirname -- "$real")" ] || lj_die "$1 is a symlink into a missing directory: $(dirname -- "$real")"
    fi
    printf '%s' "$real"
}

# lj_ensure_dir NODE_PATH MODE: create the directory or fix its mode.
lj_ensure_dir() {
    local node=$1 mode=$2 real
    real=$(lj_path "$node")
    LJ_LAST_CHANGED=0
    if [ -L "$real" ] && [ -d "$real" ]; then
        return 0
    fi
    if [ ! -d "$real" ]; then
        [ ! -e "$real" ] || lj_die "$node exists and is not a directory"
        mkdir -p -- "$real"
        chmod "$mode" -- "$real"
        lj_changed "$node (directory, mode $mode)"
        return 0
    fi
    if [ "$(lj_mode_of "$real")" != "$(lj_octal "$mode")" ]; then
        chmod "$mode" -- "$real"
        lj_changed "$node (mode $mode)"
    fi
}

# lj_create_dir NODE_PATH MODE: create the directory (with MODE) when it is missing; an
# existing one is left as it is. For directories the admin names (a scratch such as /tmp or a
# shared /scratch is 1777, and must stay so).
lj_create_dir() {
    local node=$1 mode=$2 real
    real=$(lj_path "$node")
    LJ_LAST_CHANGED=0
    [ -d "$real" ] || lj_ensure_dir "$node" "$mode"
}

# lj_install_file SRC NODE_PATH MODE: make NODE_PATH a copy of SRC with MODE.
# Writes (atomically, via a temporary file in the same directory) only when the content
# differs; fixes only the mode when just the mode differs. Sets LJ_LAST_CHANGED.
lj_install_file() {
    local src=$1 node=$2 mode=$3 real tmp
    real=$(lj_resolve "$node")
    LJ_LAST_CHANGED=0
    if [ -f "$real" ] && cmp -s -- "$src" "$real"; then
        if [ "$(lj_mode_of "$real")" != "$(lj_octal "$mode")" ]; then
            chmod "$mode" -- "$real"
            lj_changed "$node (mode $mode)"
        fi
        return 0
    fi
    [ ! -e "$real" ] || [ -f "$real" ] || lj_die "$node exists and is not a regular file"
    if [ ! -d "$(dirname -- "$real")" ]; then
        lj_ensure_dir "$(dirname -- "$node")" 0755
    fi
    tmp=$(mktemp "$(dirname -- "$real")/.lingjun.XXXXXX")
    cat -- "$src" >"$tmp"
    chmod "$mode" -- "$tmp"
    mv -f -- "$tmp" "$real"
    lj_changed "$node"
}

# lj_install_text NODE_PATH MODE < CONTENT: lj_install_file with the content on stdin.
# The staging copy lives in the private work directory with umask 077, so secrets are
# never readable by others, not even briefly.
lj_install_text() {
    local node=$1 mode=$2 staged
    staged=$(umask 077 && mktemp "$LJ_WORK/text.XXXXXX")
    cat >"$staged"
    lj_install_file "$staged" "$node" "$mode"
    rm -f -- "$staged"
}

# lj_remove NODE_PATH: remove a file this installer manages, when present.
lj_remove() {
    local node=$1 real
    real=$(lj_path "$node")
    LJ_LAST_CHANGED=0
    if [ -e "$real" ] || [ -L "$real" ]; then
        rm -f -- "$real"
        lj_changed "$node (removed)"
    fi
}

# lj_sha256 FILE: the SHA-256 of FILE in lowercase hex.
lj_sha256() {
    local sum
    sum=$(sha256sum -- "$1")
    printf '%s' "${sum%% *}"
}

# lj_node_command NAME: the node path of a program on the node, or nothing (status 1). On a
# real node that is `command -v` (root's PATH); in a sandbox (LINGJUN_NODE_ROOT) the usual
# system directories under the sandbox root.
lj_node_command() {
    local dir
    if [ -z "$LJ_ROOT" ]; then
        command -v "$1" 2>/dev/null
        return
    fi
    for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
        if [ -f "$LJ_ROOT$dir/$1" ] && [ -x "$LJ_ROOT$dir/$1" ]; then
            printf '%s' "$dir/$1"
            return 0
        fi
    done
    return 1
}

# lj_service_active NAME: whether the systemd unit is running.
lj_service_active() { systemctl is-active --quiet "$1" 2>/dev/null; }
