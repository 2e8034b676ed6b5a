# shellcheck shell=bash disable=SC2034 # globals are shared by the lib/*.sh files install.sh sources
# Artifacts (enroot packages, the pyxis source tarball): find the SHA-256 to check against,
# fetch from the project's files/artifacts/, a configured mirror or the upstream URL, and
# refuse anything that does not match. Nothing is installed from an unverified file.

# lj_pins_file: the pins file in use.
lj_pins_file() {
    local custom
    custom=$(lj_cfg pins_file)
    if [ -n "$custom" ]; then
        printf '%s' "$(lj_path "$custom")"
    else
        printf '%s' "$LJ_FILES/pins.tsv"
    fi
}

# lj_pin_field FILE COLUMN: a column (2 = sha256, 3 = url) of FILE's row in the pins file.
lj_pin_field() {
    local pins
    pins=$(lj_pins_file)
    [ -r "$pins" ] || lj_die 2 "cannot read the pins file $pins"
    awk -F'\t' -v f="$1" -v c="$2" '!/^#/ && $1 == f { print $c; exit }' "$pins"
}

# lj_checksum_for FILE: the expected SHA-256 (lingjun_slurm.checksums first, then the pins
# file), or nothing when none is known.
lj_checksum_for() {
    local file=$1 pair sum
    for pair in $(lj_cfg checksums); do
        if [ "${pair%%=*}" = "$file" ]; then
            sum=${pair#*=}
            sum=${sum,,}
            [[ $sum =~ ^[0-9a-f]{64}$ ]] || lj_die 2 "${LJ_CFG_SRC[lingjun_slurm.checksums]}: lingjun_slurm.checksums: the checksum for $file is not 64 hex digits"
            printf '%s' "$sum"
            return 0
        fi
    done
    sum=$(lj_pin_field "$file" 2)
    [ "$sum" = "-" ] && sum=""
    if [ -n "$sum" ] && ! [[ $sum =~ ^[0-9a-f]{64}$ ]]; then
        lj_die 2 "the pins file $(lj_pins_file) has a malformed checksum for $file"
    fi
    printf '%s' "$sum"
}

# lj_require_checksum FILE: refuse (exit 2) when no checksum is known for FILE.
lj_require_checksum() {
    local sum
    sum=$(lj_checksum_for "$1")
    [ -n "$sum" ] || lj_die 2 "refusing to install $1: no published SHA-256 for it in $(lj_pins_file). Add one you trust with lingjun_slurm.checksums (\"$1=SHA256\") or lingjun_slurm.pins_file; never install unverified software"
}

# lj_redact URL: URL with any user[:password]@ replaced by ***@, for logs and messages (a
# mirror URL may carry a token).
lj_redact() {
    local re='^([A-Za-z][A-Za-z0-9+.-]*://)[^/]*@(.*)$'
    if [[ $1 =~ $re ]]; then
        printf '%s***@%s' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
    else
        printf '%s' "$1"
    fi
}

# lj_download URL DEST: fetch URL (http, https or file, or a plain absolute path) into DEST.
# The URL goes to curl on stdin (--config -), never on its command line, where ps shows it.
lj_download() {
    local url=$1 dest=$2 quoted
    if [[ $url == /* ]]; then
        # the project's own files/artifacts/: copied as is (a file:// URL would need its
        # spaces and other special characters percent-encoded)
        cp -- "$url" "$dest"
    elif command -v curl >/dev/null 2>&1; then
        quoted=${url//\\/\\\\}
        quoted=${quoted//\"/\\\"}
        curl -fsSL --retry 3 --connect-timeout 30 -o "$dest" --config - <<<"url = \"$quoted\""
    elif [[ $url == file://* ]]; then
        cp -- "${url#file://}" "$dest"
    elif command -v wget >/dev/null 2>&1; then
        wget -q -O "$dest" -i - <<<"$url"
    else
        lj_die "neither curl nor wget is installed: cannot fetch $(lj_redact "$url")"
    fi
}

LJ_FETCHED=""

# lj_fetch FILE DEFAULT_URL: set LJ_FETCHED to the local path of a verified copy of FILE. Tries, in
# order: the verified cache, the project's files/artifacts/FILE, lingjun_slurm.artifacts.url,
# then the upstream URL (pins file, else DEFAULT_URL) unless lingjun_slurm.artifacts.offline.
lj_fetch() {
    local file=$1 default_url=$2 sum cache cached tmp got url mirror upstream
    local -a sources=()
    sum=$(lj_checksum_for "$file")
    [ -n "$sum" ] || lj_require_checksum "$file"
    cache=$(lj_path /var/cache/lingjun-slurm/artifacts)
    cached="$cache/$file"
    LJ_FETCHED=""
    if [ -f "$cached" ] && [ "$(lj_sha256 "$cached")" = "$sum" ]; then
        LJ_FETCHED=$cached
        return 0
    fi
    [ -f "$LJ_FILES/artifacts/$file" ] && sources+=("$LJ_FILES/artifacts/$file")
    mirror=$(lj_cfg artifacts.url)
    [ -n "$mirror" ] && sources+=("${mirror%/}/$file")
    if ! lj_cfg_true artifacts.offline; then
        upstream=$(lj_pin_field "$file" 3)
        sources+=("${upstream:-$default_url}")
    fi
    [ ${#sources[@]} -gt 0 ] || lj_die "cannot fetch $file: not in the project's files/artifacts/, no lingjun_slurm.artifacts.url, and lingjun_slurm.artifacts.offline is true"
    mkdir -p -- "$cache"
    for url in "${sources[@]}"; do
        tmp=$(mktemp "$cache/.$file.XXXXXX")
        if ! lj_download "$url" "$tmp" 2>"$LJ_WORK/download.err"; then
            rm -f -- "$tmp"
            lj_warn "could not fetch $file from $(lj_redact "$url"): $(head -c 300 "$LJ_WORK/download.err")"
            continue
        fi
        got=$(lj_sha256 "$tmp")
        if [ "$got" != "$sum" ]; then
            rm -f -- "$tmp"
            lj_die "checksum mismatch for $file from $(lj_redact "$url"): expected $sum, got $got; refusing it"
        fi
        mv -f -- "$tmp" "$cached"
        lj_log "fetched $file from $(lj_redact "$url") (sha256 $sum verified)"
        LJ_FETCHED=$cached
        return 0
    done
    local shown=()
    for url in "${sources[@]}"; do shown+=("$(lj_redact "$url")"); done
    lj_die "cannot fetch $file from any source (${shown[*]})"
}
