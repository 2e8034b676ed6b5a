# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# pyxis: build spank_pyxis.so from the pinned, checksum-verified source tarball against the
# installed Slurm's headers (or install a provided build), and enable it in plugstack.conf.

LJ_PYXIS_PLUGIN=""     # node path of the installed plugin
LJ_PYXIS_TARBALL=""    # verified source tarball, when a build is needed
LJ_PYXIS_ADOPTED=""    # node path of a pyxis build found on the node and adopted (mode build)
LJ_PYXIS_ADOPTED_VERSION=""
LJ_PYXIS_INCLUDE=""    # node path of the directory holding slurm/spank.h
LJ_PYXIS_STAMP_TEXT="" # what the build stamp must say for the installed plugin to be current
LJ_SLURMD_RESTART=0
readonly LJ_PYXIS_STAMP=/var/lib/lingjun-slurm/pyxis.stamp
# cyclecloud-slurm 4.0.x builds pyxis 0.21.0 into /opt/pyxis/spank_pyxis.so (no package; built
# only when that file is missing) and names it in plugstack.conf.d/pyxis.conf
# (Azure/cyclecloud-slurm 4.0.9 azure-slurm-install/ubuntu.sh:12-13,155-163, rhel.sh:144-152,
# install.py:990-997).
readonly LJ_PYXIS_CYCLECLOUD=/opt/pyxis/spank_pyxis.so

# lj_slurm_conf_value KEY: a slurm.conf setting (keys are case-insensitive), or nothing.
lj_slurm_conf_value() {
    local conf
    conf=$(lj_path "$(lj_cfg slurm.conf_dir)/slurm.conf")
    [ -r "$conf" ] || return 0
    awk -v k="${1,,}" '{ line = $0; sub(/#.*/, "", line) }
        match(line, /^[ \t]*[A-Za-z]+[ \t]*=/) {
            key = substr(line, 1, RLENGTH - 1); gsub(/[ \t]/, "", key)
            if (tolower(key) == k) { v = substr(line, RLENGTH + 1); gsub(/^[ \t]+|[ \t]+$/, "", v) }
        }
        END { if (v != "") print v }' "$conf"
}

lj_pyxis_plugin_dir() {
    local dir arch
    dir=$(lj_cfg pyxis.plugin_dir)
    if [ -z "$dir" ]; then
        dir=$(lj_slurm_conf_value PluginDir)
        dir=${dir%%:*}
    fi
    if [ -z "$dir" ]; then
        arch=$(uname -m)
        for dir in /usr/lib64/slurm "/usr/lib/$arch-linux-gnu/slurm-wlm" "/usr/lib/$arch-linux-gnu/slurm" \
            /usr/lib/slurm /usr/local/lib/slurm /opt/slurm/lib/slurm ""; do
            [ -n "$dir" ] && compgen -G "$(lj_path "$dir")/*.so" >/dev/null && break
        done
    fi
    [ -n "$dir" ] || lj_die 2 "cannot find Slurm's plugin directory (no PluginDir in slurm.conf, no Slurm plugins in the usual places): set lingjun_slurm.pyxis.plugin_dir"
    printf '%s' "$dir"
}

lj_pyxis_find_include() {
    local dir
    dir=$(lj_cfg pyxis.slurm_include)
    if [ -n "$dir" ]; then
        [ -f "$(lj_path "$dir")/slurm/spank.h" ] || lj_die 2 "lingjun_slurm.pyxis.slurm_include: no slurm/spank.h under $dir"
        printf '%s' "$dir"
        return 0
    fi
    for dir in /usr/include /usr/local/include /opt/slurm/include; do
        if [ -f "$(lj_path "$dir")/slurm/spank.h" ]; then
            printf '%s' "$dir"
            return 0
        fi
    done
    lj_die 2 "no Slurm headers (slurm/spank.h) to build pyxis against: install the development package of the Slurm that runs here (libslurm-dev, slurm-devel, ...), set lingjun_slurm.pyxis.slurm_include, or use lingjun_slurm.pyxis.mode: provided"
}

# The build is current when the stamp records this pyxis version, this tarball and these
# Slurm headers, and the installed plugin is the one that build produced.
lj_pyxis_build_current() {
    local stamp plugin recorded
    stamp=$(lj_path "$LJ_PYXIS_STAMP")
    plugin=$(lj_path "$LJ_PYXIS_PLUGIN")
    [ -f "$stamp" ] && [ -f "$plugin" ] || return 1
    recorded=$(sed -n 's/^plugin_sha256=//p' "$stamp")
    [ "$(grep -v '^plugin_sha256=' "$stamp")" = "$LJ_PYXIS_STAMP_TEXT" ] && [ "$recorded" = "$(lj_sha256 "$plugin")" ]
}

# lj_pyxis_plugin_version FILE: the version a pyxis plugin reports, from the string its slurmd
# init logs, "pyxis: version v" PYXIS_VERSION (NVIDIA/pyxis v0.21.0 and v0.24.0
# pyxis_slurmd.c:27-28; the Makefile sets PYXIS_VERSION, Makefile:9,16); nothing when absent.
lj_pyxis_plugin_version() {
    local found
    found=$(grep -a -o -m 1 'pyxis: version v[0-9][0-9A-Za-z.+~-]*' -- "$1" 2>/dev/null | head -n 1) || true
    printf '%s' "${found#pyxis: version v}"
}

# lj_pyxis_floor VERSION: the oldest pyxis that may be adopted: lingjun_slurm.pyxis.min_version
# (default VERSION), raised to the first release that knows every option the plugstack line will
# carry, since pyxis refuses an unknown one and a required plugin that fails stops slurmd
# (config.c "unknown configuration option", v0.21.0:91-93). container_scope (always written)
# since v0.9.0, sbatch_support since v0.12.0, use_enroot_load and importer since v0.21.0,
# use_squashfuse since v0.22.0 (config.c of each tag).
lj_pyxis_floor() {
    local floor opt need
    floor=$(lj_cfg_floor pyxis.min_version "$1")
    for opt in container_scope= $(lj_cfg pyxis.options); do
        case ${opt%%=*} in
        container_scope | runtime_path | execute_entrypoint) need=0.9.0 ;;
        sbatch_support) need=0.12.0 ;;
        use_enroot_load | importer) need=0.21.0 ;;
        use_squashfuse) need=0.22.0 ;;
        *) need=$1 ;; # not known here: only the pinned version is trusted with it
        esac
        lj_version_ge "$floor" "$need" || floor=$need
    done
    printf '%s' "$floor"
}

# lj_pyxis_own_build: whether the plugin at LJ_PYXIS_PLUGIN is one this installer built (its
# stamp records a build and the plugin's checksum).
lj_pyxis_own_build() {
    local stamp plugin
    stamp=$(lj_path "$LJ_PYXIS_STAMP")
    plugin=$(lj_path "$LJ_PYXIS_PLUGIN")
    [ -f "$stamp" ] && [ -f "$plugin" ] && grep -q '^tarball_sha256=' "$stamp" &&
        [ "$(sed -n 's/^plugin_sha256=//p' "$stamp")" = "$(lj_sha256 "$plugin")" ]
}

# lj_pyxis_adopt_candidates: node paths of pyxis builds on the node that this installer did not
# make, one per line, most specific first: the one adopted last time (the stamp), the plugin the
# pyxis entry of plugstack.conf.d/pyxis.conf names (whoever wrote it), cyclecloud-slurm's, and a
# plugin already at our destination (a package's, say).
lj_pyxis_adopt_candidates() {
    local stamp conf entry
    stamp=$(lj_path "$LJ_PYXIS_STAMP")
    [ ! -f "$stamp" ] || sed -n 's/^adopted_from=//p' "$stamp"
    conf=$(lj_path "$(lj_cfg slurm.conf_dir)/plugstack.conf.d/pyxis.conf")
    if [ -f "$conf" ]; then
        entry=$(awk '{ sub(/#.*/, "") } ($1 == "required" || $1 == "optional") && $2 ~ /(^|\/)spank_pyxis\.so$/ { print $2; exit }' "$conf")
        [ -z "$entry" ] || [ "$entry" = "$LJ_PYXIS_PLUGIN" ] || printf '%s\n' "$entry"
    fi
    printf '%s\n' "$LJ_PYXIS_CYCLECLOUD"
    lj_pyxis_own_build || printf '%s\n' "$LJ_PYXIS_PLUGIN"
}

# lj_pyxis_adopt_check VERSION (mode build): adopt a pyxis build found on the node when it
# reports at least the floor; otherwise say what was found and build VERSION. The adopted plugin
# is copied to LJ_PYXIS_PLUGIN (0644) rather than named where it is: the copy is what pyxis.conf
# and the node tests see, whoever rewrites pyxis.conf, and a rebuild of the original (cyclecloud-
# slurm's, when /opt/pyxis is emptied) is picked up by the next run.
lj_pyxis_adopt_check() {
    local version=$1 floor candidate have seen=" "
    floor=$(lj_pyxis_floor "$version")
    while IFS= read -r candidate; do
        [[ $candidate == /* ]] || continue
        [[ $seen != *" $candidate "* ]] || continue
        seen+="$candidate "
        [ -f "$(lj_path "$candidate")" ] || continue
        have=$(lj_pyxis_plugin_version "$(lj_path "$candidate")")
        if [ -z "$have" ]; then
            lj_log "pyxis: $candidate reports no version; not adopted"
        elif lj_version_ge "$have" "$floor"; then
            LJ_PYXIS_ADOPTED=$candidate
            LJ_PYXIS_ADOPTED_VERSION=$have
            lj_log "pyxis: adopting pyxis $have found at $candidate: at least $floor (lingjun_slurm.pyxis.min_version and the plugstack options), so $version is not built"
            return 0
        else
            lj_log "pyxis: pyxis $have at $candidate is below the floor $floor (lingjun_slurm.pyxis.min_version and the plugstack options): building $version instead"
        fi
    done < <(lj_pyxis_adopt_candidates)
}

# lj_pyxis_adopt_install: the adopted build at LJ_PYXIS_PLUGIN, and a stamp saying where it came
# from (a later build never mistakes it for one of its own: the stamp has no tarball).
lj_pyxis_adopt_install() {
    local src
    src=$(lj_path "$LJ_PYXIS_ADOPTED")
    if [ "$LJ_PYXIS_ADOPTED" != "$LJ_PYXIS_PLUGIN" ]; then
        lj_install_file "$src" "$LJ_PYXIS_PLUGIN" 0644
        [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SLURMD_RESTART=1
    fi
    printf 'adopted_from=%s\nversion=%s\nplugin=%s\nplugin_sha256=%s\n' "$LJ_PYXIS_ADOPTED" \
        "$LJ_PYXIS_ADOPTED_VERSION" "$LJ_PYXIS_PLUGIN" "$(lj_sha256 "$(lj_path "$LJ_PYXIS_PLUGIN")")" |
        lj_install_text "$LJ_PYXIS_STAMP" 0644
}

# Before any change: decide whether pyxis must be built, and fetch and verify what it needs.
lj_pyxis_preflight() {
    local mode version file headers inc provided expected
    mode=$(lj_cfg pyxis.mode)
    lj_pyxis_options_check
    [ "$mode" != skip ] || return 0
    LJ_PYXIS_PLUGIN="$(lj_pyxis_plugin_dir)/spank_pyxis.so"
    if [ "$mode" = provided ]; then
        provided=$(lj_cfg pyxis.provided_plugin)
        [ -n "$provided" ] || lj_die 2 "lingjun_slurm.pyxis.mode is provided but lingjun_slurm.pyxis.provided_plugin is empty"
        [ -f "$(lj_path "$provided")" ] || lj_die 2 "lingjun_slurm.pyxis.provided_plugin: $provided does not exist"
        expected=$(lj_cfg pyxis.provided_sha256)
        if [ -n "$expected" ] && [ "$(lj_sha256 "$(lj_path "$provided")")" != "$expected" ]; then
            lj_die "checksum mismatch for $provided: expected $expected (lingjun_slurm.pyxis.provided_sha256); refusing it"
        fi
        return 0
    fi
    version=$(lj_cfg pyxis.version)
    lj_pyxis_adopt_check "$version"
    [ -z "$LJ_PYXIS_ADOPTED" ] || return 0
    file="pyxis-$version.tar.gz"
    lj_require_checksum "$file"
    LJ_PYXIS_INCLUDE=$(lj_pyxis_find_include)
    inc=$(lj_path "$LJ_PYXIS_INCLUDE")
    # slurm_version.h when present (a missing one must not stop the install without a word:
    # with pipefail, a failing cat here would)
    local -a header_files=("$inc/slurm/spank.h")
    [ ! -f "$inc/slurm/slurm_version.h" ] || header_files+=("$inc/slurm/slurm_version.h")
    headers=$(cat -- "${header_files[@]}" | sha256sum)
    LJ_PYXIS_STAMP_TEXT=$(printf 'version=%s\ntarball_sha256=%s\nslurm_headers_sha256=%s\nplugin=%s' \
        "$version" "$(lj_checksum_for "$file")" "${headers%% *}" "$LJ_PYXIS_PLUGIN")
    if lj_pyxis_build_current; then
        lj_log "pyxis $version is built and installed at $LJ_PYXIS_PLUGIN"
        return 0
    fi
    lj_fetch "$file" "https://github.com/NVIDIA/pyxis/archive/refs/tags/v$version.tar.gz"
    LJ_PYXIS_TARBALL=$LJ_FETCHED
}

lj_pyxis_build() {
    local src stage so top
    if ! command -v make >/dev/null 2>&1 || ! command -v gcc >/dev/null 2>&1; then
        lj_pkg_install make gcc || lj_die "installing make and gcc to build pyxis failed (the package manager's error is above)"
    fi
    src="$LJ_WORK/pyxis-src"
    stage="$LJ_WORK/pyxis-stage"
    mkdir -p -- "$src" "$stage"
    tar -xzf "$LJ_PYXIS_TARBALL" -C "$src"
    top=$(find "$src" -mindepth 1 -maxdepth 1 -type d | head -n 1)
    [ -f "$top/Makefile" ] || lj_die "the pyxis tarball has no Makefile"
    lj_log "run: make (pyxis $(lj_cfg pyxis.version), CPPFLAGS=-I$LJ_PYXIS_INCLUDE) && make install"
    # CPPFLAGS goes in the environment: pyxis's Makefile appends it to its own flags, which
    # a command-line CPPFLAGS=... would replace.
    if ! (cd "$top" && env CPPFLAGS="-I$(lj_path "$LJ_PYXIS_INCLUDE")" make &&
        make install DESTDIR="$stage" prefix=/usr libdir=/lib) >"$LJ_WORK/pyxis-build.log" 2>&1; then
        cat "$LJ_WORK/pyxis-build.log" >&2
        lj_die "building pyxis failed (output above)"
    fi
    so=$(find "$stage" -name spank_pyxis.so -type f | head -n 1)
    [ -n "$so" ] || lj_die "pyxis's make install produced no spank_pyxis.so"
    lj_install_file "$so" "$LJ_PYXIS_PLUGIN" 0644
    [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SLURMD_RESTART=1
    { printf '%s\n' "$LJ_PYXIS_STAMP_TEXT"; printf 'plugin_sha256=%s\n' "$(lj_sha256 "$so")"; } |
        lj_install_text "$LJ_PYXIS_STAMP" 0644
}

lj_pyxis_runtime_path() {
    local path
    path=$(lj_cfg pyxis.runtime_path)
    if [ -z "$path" ]; then
        if [ -n "$LJ_SCRATCH" ]; then path="$LJ_SCRATCH/enroot/pyxis"; else path=/run/pyxis; fi
    fi
    printf '%s' "$path"
}

readonly LJ_PYXIS_HOOK=/usr/local/sbin/lingjun-pyxis-plugstack
readonly LJ_PYXIS_HOOK_STATE=/etc/lingjun-slurm/pyxis-plugstack.env
readonly LJ_SYSTEMD_DIR=/etc/systemd/system
LJ_SYSTEMD_RELOAD=0

# lj_pyxis_options_check: lingjun_slurm.pyxis.options must not set what a key of its own sets
# (pyxis takes the last of repeated options, config.c:43-104, so which one wins would depend
# on the order of the line).
lj_pyxis_options_check() {
    local opt
    for opt in $(lj_cfg pyxis.options); do
        case $opt in
        container_scope=*) lj_config_bad lingjun_slurm.pyxis.options "container_scope is set by lingjun_slurm.pyxis.container_scope (job or global), not here" ;;
        runtime_path=*) lj_config_bad lingjun_slurm.pyxis.options "runtime_path is set by lingjun_slurm.pyxis.runtime_path, not here" ;;
        esac
    done
}

# lj_pyxis_units CONF_DIR: the systemd units that re-apply our pyxis entry after another
# installer rewrote pyxis.conf (see files/lingjun-pyxis-plugstack): before slurmd starts
# (execute nodes; cyclecloud-slurm starts slurmd after every cluster-init script, its
# delayed_services.rb), and whenever the file changes (every role: srun/sbatch read it too).
lj_pyxis_units() {
    local conf_dir=$1 role=$2
    {
        printf '# Managed by lingjun-slurm cluster-init: re-applies lingjun-slurm'"'"'s pyxis entry.\n'
        printf '[Unit]\nDescription=lingjun-slurm: the pyxis entry of %s/plugstack.conf.d/pyxis.conf\n\n' "$conf_dir"
        printf '[Service]\nType=oneshot\nExecStart=%s\n' "$LJ_PYXIS_HOOK"
    } | lj_install_text "$LJ_SYSTEMD_DIR/lingjun-pyxis-plugstack.service" 0644
    [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SYSTEMD_RELOAD=1
    {
        printf '# Managed by lingjun-slurm cluster-init: another installer rewriting pyxis.conf\n'
        printf '# (cyclecloud-slurm'"'"'s install.py) is undone at once.\n'
        printf '[Unit]\nDescription=lingjun-slurm: watch %s/plugstack.conf.d/pyxis.conf\n\n' "$conf_dir"
        printf '[Path]\nPathChanged=%s/plugstack.conf.d/pyxis.conf\nUnit=lingjun-pyxis-plugstack.service\n\n' "$conf_dir"
        printf '[Install]\nWantedBy=multi-user.target\n'
    } | lj_install_text "$LJ_SYSTEMD_DIR/lingjun-pyxis-plugstack.path" 0644
    [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SYSTEMD_RELOAD=1
    if [ "$role" = execute ]; then
        {
            printf '# Managed by lingjun-slurm cluster-init: slurmd loads lingjun-slurm'"'"'s pyxis entry,\n'
            printf '# whichever installer wrote pyxis.conf last ("-": never keeps slurmd from starting).\n'
            printf '[Service]\nExecStartPre=-%s\n' "$LJ_PYXIS_HOOK"
        } | lj_install_text "$LJ_SYSTEMD_DIR/slurmd.service.d/lingjun-pyxis.conf" 0644
        [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SYSTEMD_RELOAD=1
    fi
    if [ "$LJ_SYSTEMD_RELOAD" -eq 1 ]; then
        lj_run systemctl daemon-reload || lj_warn "systemctl daemon-reload failed"
        lj_run systemctl enable --now lingjun-pyxis-plugstack.path ||
            lj_warn "could not enable lingjun-pyxis-plugstack.path: slurmd still re-applies the pyxis entry when it starts"
    fi
}

# lj_pyxis_install ROLE: the plugin (build or provided) and the one pyxis entry in
# plugstack.conf.d/pyxis.conf, written by files/lingjun-pyxis-plugstack from
# /etc/lingjun-slurm/pyxis-plugstack.env. pyxis.mode = skip installs no plugin: a pyxis entry
# someone else wrote (cyclecloud-slurm's, plugin /opt/pyxis/spank_pyxis.so) keeps its plugin and
# runtime_path and gets our container_scope and options.
lj_pyxis_install() {
    local role=${1-} mode conf_dir runtime="" plugin="" out line changed
    mode=$(lj_cfg pyxis.mode)
    conf_dir=$(lj_cfg slurm.conf_dir)
    if [ "$mode" = provided ]; then
        lj_install_file "$(lj_path "$(lj_cfg pyxis.provided_plugin)")" "$LJ_PYXIS_PLUGIN" 0644
        [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SLURMD_RESTART=1
    elif [ "$mode" = build ] && [ -n "$LJ_PYXIS_ADOPTED" ]; then
        lj_pyxis_adopt_install
    elif [ "$mode" = build ] && [ -n "$LJ_PYXIS_TARBALL" ]; then
        lj_pyxis_build
    fi
    if [ "$mode" = skip ]; then
        runtime=$(lj_cfg pyxis.runtime_path)
    else
        plugin=$LJ_PYXIS_PLUGIN
        runtime=$(lj_pyxis_runtime_path)
        [ -z "$LJ_SCRATCH" ] || lj_ensure_dir "$runtime" 0755
    fi
    lj_install_file "$LJ_FILES/lingjun-pyxis-plugstack" "$LJ_PYXIS_HOOK" 0755
    {
        printf '# Written by lingjun-slurm cluster-init; read by %s.\n' "$LJ_PYXIS_HOOK"
        printf '# PLUGIN and RUNTIME_PATH empty: keep those of the pyxis entry found in CONF.\n'
        printf 'CONF=%s\nPLUGIN=%s\nRUNTIME_PATH=%s\nCONTAINER_SCOPE=%s\nOPTIONS=%s\n' \
            "$conf_dir/plugstack.conf.d/pyxis.conf" "$plugin" "$runtime" \
            "$(lj_cfg pyxis.container_scope)" "$(lj_cfg pyxis.options)"
    } | lj_install_text "$LJ_PYXIS_HOOK_STATE" 0644
    out=$(LINGJUN_NODE_ROOT=$LJ_ROOT "$(lj_path "$LJ_PYXIS_HOOK")") || lj_die "$LJ_PYXIS_HOOK failed"
    changed=0
    while IFS= read -r line; do
        case $line in
        "changed: "*) lj_changed "${line#changed: }"; changed=1 ;;
        ?*) lj_log "$line" ;;
        esac
    done <<<"$out"
    [ "$changed" -eq 0 ] || LJ_SLURMD_RESTART=1
    lj_pyxis_units "$conf_dir" "$role"
    if [ "$mode" != skip ]; then
        lj_plugstack_include "$conf_dir"
        [ "$LJ_LAST_CHANGED" -eq 0 ] || LJ_SLURMD_RESTART=1
    fi
}
