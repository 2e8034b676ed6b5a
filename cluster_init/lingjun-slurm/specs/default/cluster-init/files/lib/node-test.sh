# shellcheck shell=bash disable=SC2034 # sourced by the specs' node tests
# What the specs' CycleCloud node tests (specs/*/cluster-init/tests/test_ROLE.sh) share: a
# check runner and readers of what the installer recorded in
# /etc/lingjun-slurm/installed-ROLE.env. Paths are under $LINGJUN_NODE_ROOT in sandboxes.
R=${LINGJUN_NODE_ROOT:-}
failures=0
state_file=""

# check WHAT CMD...: print "ok   WHAT" or "FAIL WHAT" and count failures.
check() {
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then
        echo "ok   $what"
    else
        echo "FAIL $what"
        failures=$((failures + 1))
    fi
}
has_mode() { [ -f "$R$1" ] && [ "$(stat -c %a "$R$1")" = "$2" ]; }
has_line() { grep -qxF -- "$2" "$R$1"; }
# one_pyxis_entry DIR: the files of DIR that the include glob matches (no dot files) hold
# exactly one required/optional spank_pyxis.so line ('#' starts a comment, as for Slurm).
one_pyxis_entry() {
    local -a files=("$1"/*)
    [ -e "${files[0]}" ] || return 1
    awk '{ sub(/#.*/, "") } ($1 == "required" || $1 == "optional") && $2 ~ /(^|\/)spank_pyxis\.so$/ { n++ }
        END { exit n != 1 }' "${files[@]}"
}
state() { sed -n "s/^$1=//p" "$state_file"; }

# lj_test_begin ROLE: the role's record, or exit 1 when the role never ran on this node.
lj_test_begin() {
    state_file=$R/etc/lingjun-slurm/installed-$1.env
    if [ ! -f "$state_file" ]; then
        echo "FAIL the $1 spec has not run here (no /etc/lingjun-slurm/installed-$1.env)"
        exit 1
    fi
}

# lj_test_pyxis: the pyxis plugin and its plugstack entry (every role that installs pyxis).
lj_test_pyxis() {
    local plugin conf_dir
    [ "$(state PYXIS_MODE)" != skip ] || return 0
    plugin=$(state PYXIS_PLUGIN)
    conf_dir=$(state SLURM_CONF_DIR)
    check "pyxis plugin $plugin (0644)" has_mode "$plugin" 644
    check "pyxis enabled in $conf_dir/plugstack.conf.d/pyxis.conf" grep -q "^required $plugin " "$R$conf_dir/plugstack.conf.d/pyxis.conf"
    check "pyxis container_scope=$(state PYXIS_CONTAINER_SCOPE)" grep -Eq \
        "^required $plugin .*container_scope=$(state PYXIS_CONTAINER_SCOPE)( |\$)" "$R$conf_dir/plugstack.conf.d/pyxis.conf"
    # Slurm loads every entry of every file the include glob matches, a plugin listed twice too
    # (see files/lingjun-pyxis-plugstack), so another installer's second pyxis line is a failure.
    check "exactly one pyxis entry in $conf_dir/plugstack.conf.d/*" one_pyxis_entry "$R$conf_dir/plugstack.conf.d"
    check "plugstack.conf includes plugstack.conf.d/*" grep -Eq "^[[:space:]]*include[[:space:]]+$conf_dir/plugstack.conf.d/\*" "$R$conf_dir/plugstack.conf"
    if [ -z "$R" ] && command -v srun >/dev/null 2>&1; then
        check "srun --help shows pyxis's --container-image" bash -c 'srun --help 2>&1 | grep -q -- --container-image'
    fi
}

# lj_test_end: exit 1 when a check failed.
lj_test_end() {
    if [ "$failures" -gt 0 ]; then
        echo "$failures check(s) failed"
        exit 1
    fi
}
