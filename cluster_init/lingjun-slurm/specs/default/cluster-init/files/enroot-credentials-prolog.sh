#!/usr/bin/env bash
# Slurm prolog installed by lingjun-slurm cluster-init (execute spec) as
# <slurm conf dir>/prolog.d/60-lingjun-enroot-credentials.sh. slurmd runs it as root before a
# job starts on the node.
#
# pyxis runs `enroot import` as the job's user, and enroot reads registry credentials only
# from $ENROOT_CONFIG_PATH/.credentials. The cluster's credentials live in a root-only file
# (/etc/lingjun-slurm/enroot/credentials, 0600), so this prolog gives the job's user a private
# copy (0600, owned by the user) in /run/lingjun-slurm/enroot-config/UID, where enroot.conf
# points ENROOT_CONFIG_PATH. Without that file (no credentials configured) it does nothing.
#
# It never fails: a failing prolog drains the node. Problems go to syslog.
set -u

root=${LINGJUN_NODE_ROOT:-}
master=$root/etc/lingjun-slurm/enroot/credentials
base=$root/run/lingjun-slurm/enroot-config
uid=${SLURM_JOB_UID:-}

[ -f "$master" ] || exit 0
[[ $uid =~ ^[0-9]+$ ]] || exit 0
[ "$uid" -ne 0 ] || exit 0
gid=${SLURM_JOB_GID:-$(id -g "$uid" 2>/dev/null || true)}
[[ $gid =~ ^[0-9]+$ ]] || exit 0
umask 077

skip() {
    logger -t lingjun-slurm-prolog "enroot registry credentials for uid $uid: $*" 2>/dev/null
    exit 0
}

mkdir -p "$base/.staging" || skip "cannot create $base"
if ! { chmod 0755 "$base" && chmod 0700 "$base/.staging"; }; then
    skip "cannot set modes on $base"
fi
dir=$base/$uid
# Only root can create entries in $base; anything there that is not the user's own
# directory is stale and replaced.
if [ -L "$dir" ] || { [ -e "$dir" ] && [ "$(stat -c %u "$dir")" != "$uid" ]; }; then
    rm -rf -- "$dir" || skip "cannot replace $dir"
fi
if [ ! -d "$dir" ]; then
    if ! { mkdir -m 0700 "$dir" && chown "$uid:$gid" "$dir"; }; then
        skip "cannot create $dir"
    fi
fi
tmp=$(mktemp "$base/.staging/credentials.XXXXXX") || skip "cannot create a temporary file"
if ! { cat "$master" >"$tmp" && chown "$uid:$gid" "$tmp" && chmod 0600 "$tmp" && mv -fT "$tmp" "$dir/.credentials"; }; then
    rm -f -- "$tmp"
    skip "cannot install $dir/.credentials"
fi
exit 0
