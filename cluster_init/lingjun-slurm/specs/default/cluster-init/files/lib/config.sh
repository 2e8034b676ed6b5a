# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# Configuration: the keys of lib/config-keys.tsv, read from `jetpack config` (CycleCloud) or
# from a flat YAML file (node.yaml, anywhere else), then validated by type.
#
# Errors name where the value came from ("node.yaml:7", "jetpack config KEY") and the key,
# never the value: lingjun_slurm.enroot.credentials holds secrets.

declare -gA LJ_CFG=()      # key -> value
declare -gA LJ_CFG_SRC=()  # key -> where the value came from
declare -gA LJ_CFG_TYPE=() # key -> type
LJ_CFG_KEYS=()             # keys in table order
LJ_CONFIG_MODE=""          # jetpack | file
LJ_CONFIG_FILE=""
readonly LJ_UNSET="__lingjun_slurm_unset__"
readonly LJ_US=$'\037'

lj_config_table() {
    local table="$LJ_LIB/config-keys.tsv" key type default
    while IFS=$LJ_US read -r key type default; do
        [ "$default" = '""' ] && default=""
        LJ_CFG_KEYS+=("$key")
        LJ_CFG_TYPE[$key]=$type
        LJ_CFG[$key]=$default
        LJ_CFG_SRC[$key]="default"
    done < <(awk -F'\t' -v us="$LJ_US" '!/^#/ && NF >= 3 { print $1 us $2 us $3 }' "$table")
}

# lj_cfg NAME: the value of lingjun_slurm.NAME.
lj_cfg() {
    local key="lingjun_slurm.$1"
    [ -n "${LJ_CFG_TYPE[$key]+set}" ] || lj_die "internal error: unknown configuration key $key"
    printf '%s' "${LJ_CFG[$key]}"
}

lj_cfg_true() { [ "$(lj_cfg "$1")" = true ]; }

lj_config_load_jetpack() {
    local key value
    LJ_CONFIG_MODE="jetpack"
    for key in "${LJ_CFG_KEYS[@]}"; do
        value=$(jetpack config "$key" "$LJ_UNSET") || lj_die "jetpack config $key failed"
        if [ "$value" != "$LJ_UNSET" ]; then
            LJ_CFG[$key]=$value
            LJ_CFG_SRC[$key]="jetpack config $key"
        fi
    done
}

lj_config_load_file() {
    local file=$1 records line key value
    LJ_CONFIG_MODE="file"
    LJ_CONFIG_FILE=$file
    if [ ! -f "$file" ] || [ ! -r "$file" ]; then
        lj_die 2 "cannot read the config file $file"
    fi
    if ! records=$(awk -v file="$file" -f "$LJ_LIB/yaml-subset.awk" "$file" 2>"$LJ_WORK/yaml.err"); then
        lj_die 2 "invalid config file: $(cat "$LJ_WORK/yaml.err")"
    fi
    while IFS=$LJ_US read -r line key value; do
        [ -n "$line" ] || continue
        [ -n "${LJ_CFG_TYPE[$key]+set}" ] || lj_die 2 "$file:$line: unknown key $key (see the key table in docs/admin-guide.md)"
        LJ_CFG[$key]=$value
        LJ_CFG_SRC[$key]="$file:$line"
    done <<<"$records"
}

lj_config_bad() {
    local key=$1 msg=$2
    lj_die 2 "${LJ_CFG_SRC[$key]}: $key: $msg"
}

# Normalize and check every value against its type.
lj_config_validate() {
    local key type value
    for key in "${LJ_CFG_KEYS[@]}"; do
        type=${LJ_CFG_TYPE[$key]}
        value=${LJ_CFG[$key]}
        case $type in
        bool)
            case ${value,,} in
            true | yes | on | 1) LJ_CFG[$key]=true ;;
            false | no | off | 0) LJ_CFG[$key]=false ;;
            *) lj_config_bad "$key" "expected true or false, got \"$value\"" ;;
            esac
            ;;
        int)
            [[ $value =~ ^[0-9]+$ ]] || lj_config_bad "$key" "expected a whole number, got \"$value\""
            ;;
        path)
            [ -z "$value" ] || [[ $value =~ ^/[^[:space:]]*$ ]] ||
                lj_config_bad "$key" "expected an absolute path without spaces, got \"$value\""
            ;;
        url)
            [ -z "$value" ] || [[ $value =~ ^(https?|file)://[^[:space:]]+$ ]] ||
                lj_config_bad "$key" "expected an http://, https:// or file:// URL, got \"$value\""
            ;;
        sha256)
            LJ_CFG[$key]=${value,,}
            [ -z "$value" ] || [[ ${value,,} =~ ^[0-9a-f]{64}$ ]] ||
                lj_config_bad "$key" "expected 64 hex digits, got \"$value\""
            ;;
        version)
            [[ $value =~ ^[0-9][0-9A-Za-z.+~-]*$ ]] || lj_config_bad "$key" "expected a version like 1.2.3, got \"$value\""
            ;;
        name)
            [ -z "$value" ] || [[ $value =~ ^[a-z0-9][a-z0-9._-]*$ ]] ||
                lj_config_bad "$key" "expected a lowercase name, got \"$value\""
            ;;
        word)
            [[ $value =~ ^[A-Za-z0-9_,.-]+$ ]] || lj_config_bad "$key" "expected a single word, got \"$value\""
            ;;
        list)
            [[ $value =~ ^[^\;\|\&\$\`\"\']*$ ]] || lj_config_bad "$key" "expected space-separated words, got \"$value\""
            ;;
        enum:*)
            [[ "|${type#enum:}|" == *"|$value|"* ]] || lj_config_bad "$key" "expected one of ${type#enum:}, got \"$value\""
            ;;
        str) ;;
        secret) ;;
        *) lj_die "internal error: $key has an unknown type $type" ;;
        esac
    done
}

# Log the effective configuration; secrets appear as <set> or <unset>.
lj_config_log() {
    local key value
    lj_log "configuration ($LJ_CONFIG_MODE${LJ_CONFIG_FILE:+: $LJ_CONFIG_FILE}):"
    for key in "${LJ_CFG_KEYS[@]}"; do
        value=${LJ_CFG[$key]}
        if [ "${LJ_CFG_TYPE[$key]}" = secret ]; then
            if [ -n "$value" ]; then value="<set>"; else value="<unset>"; fi
        elif [ "${LJ_CFG_TYPE[$key]}" = url ]; then
            value=$(lj_redact "$value")
        fi
        lj_log "  $key = $value"
    done
}

lj_config_init() {
    local config_file=$1
    lj_config_table
    if [ -n "$config_file" ]; then
        lj_config_load_file "$config_file"
    elif command -v jetpack >/dev/null 2>&1; then
        lj_config_load_jetpack
    else
        lj_die 2 "no jetpack on PATH (not a CycleCloud node): run install.sh --config node.yaml --role ROLE"
    fi
    lj_config_validate
}

# lj_jetpack_value KEY: a CycleCloud value outside lingjun_slurm.* (empty when unset or
# when the configuration comes from a file).
lj_jetpack_value() {
    local value
    [ "$LJ_CONFIG_MODE" = jetpack ] || return 0
    value=$(jetpack config "$1" "$LJ_UNSET") || lj_die "jetpack config $1 failed"
    [ "$value" = "$LJ_UNSET" ] || printf '%s' "$value"
}
