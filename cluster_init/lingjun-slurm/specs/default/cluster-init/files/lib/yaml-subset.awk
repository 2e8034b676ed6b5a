# Reads node.yaml: a flat subset of YAML, one "key: value" per line (POSIX awk; mawk and gawk).
#
#   # a comment                      blank lines and comments are skipped
#   ---                              allowed once, before the first key
#   lingjun_slurm.nccl.profile: lingjun          plain value; " #" starts a comment
#   lingjun_slurm.pyxis.options: "a=1 b=2"       double quotes: \" and \\ escapes only
#   lingjun_slurm.enroot.squash_options: '-noI'  single quotes: '' is a quote
#   lingjun_slurm.health.enroot_image:           empty value
#
# Anything else (indentation, lists, flow collections, anchors, tags, block scalars, tabs,
# duplicate keys) is rejected with "FILE:LINE: message" on stderr and exit status 2.
# Output: one record per key, "LINE<US>KEY<US>VALUE" with US = \037. Values never appear in
# error messages (some keys hold secrets).

BEGIN { US = "\037"; started = 0 }

function fail(msg) {
    printf "%s:%d: %s\n", file, NR, msg > "/dev/stderr"
    exit 2
}

function closing(rest, quote,    i, c, n, out, tail) {
    out = ""
    n = length(rest)
    for (i = 2; i <= n; i++) {
        c = substr(rest, i, 1)
        if (quote == "\"" && c == "\\") {
            i++
            c = substr(rest, i, 1)
            if (c != "\"" && c != "\\") fail("key " key ": unsupported escape in a double-quoted value (only \\\" and \\\\)")
            out = out c
        } else if (c == quote) {
            if (quote == "'" && substr(rest, i + 1, 1) == "'") {
                out = out "'"
                i++
            } else {
                tail = substr(rest, i + 1)
                if (tail !~ /^ *(#.*)?$/) fail("key " key ": text after the closing quote")
                return out
            }
        } else {
            out = out c
        }
    }
    fail("key " key ": unterminated quoted value")
}

{
    line = $0
    sub(/\r$/, "", line)
    if (line ~ /^[ \t]*$/ || line ~ /^[ \t]*#/) next
    if (line == "---" && !started) { started = 1; next }
    started = 1
    key = ""
    if (line ~ /^[ \t]/) fail("indented line: only flat \"key: value\" lines are supported (write nested keys dotted: lingjun_slurm.nccl.profile: ...)")
    if (line ~ /\t/) fail("tab character: use spaces")
    if (line ~ /^-( |$)/) fail("list item: only flat \"key: value\" lines are supported")
    if (!match(line, /^[A-Za-z0-9_.-]+:/)) fail("expected \"key: value\"")
    key = substr(line, 1, RLENGTH - 1)
    rest = substr(line, RLENGTH + 1)
    if (rest != "" && substr(rest, 1, 1) != " ") fail("key " key ": expected a space after the colon")
    sub(/^ +/, "", rest)
    if (key in seen) fail("key " key ": duplicate key (first on line " seen[key] ")")
    seen[key] = NR
    c = substr(rest, 1, 1)
    if (c == "\"" || c == "'") {
        value = closing(rest, c)
    } else if (c != "" && index("[]{}&*!|>%@`", c) > 0) {
        fail("key " key ": unsupported YAML (flow collections, anchors, aliases, tags and block scalars are not accepted; quote the value)")
    } else {
        if (rest ~ /^#/) rest = ""
        p = index(rest, " #")
        if (p > 0) rest = substr(rest, 1, p - 1)
        sub(/ +$/, "", rest)
        if (rest ~ /: / || rest ~ /:$/) fail("key " key ": a plain value may not contain \": \"; quote it")
        value = rest
    }
    printf "%d%s%s%s%s\n", NR, US, key, US, value
}
