"""OpenSSH known_hosts files: read with file and line numbers, match, append.

Our own reader (not paramiko.HostKeys) because messages must name the file and line of a
conflicting key, and because OpenSSH's files carry things paramiko ignores: `@revoked` and
`@cert-authority` markers, wildcard and negated host patterns. Keys are compared as their raw
public blobs, so no key type needs to be understood to be matched.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import hmac
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from ..common.errors import TransportError


@dataclass(frozen=True)
class KnownHost:
    path: Path
    lineno: int
    marker: Optional[str]  # "@revoked", "@cert-authority" or None
    patterns: str
    keytype: str
    blob: bytes

    @property
    def where(self) -> str:
        return f"{self.path}:{self.lineno}"


def host_key_name(hostname: str, port: int) -> str:
    """The name OpenSSH records: `host` for port 22, `[host]:port` otherwise, lowercased as ssh(1)
    lowercases the host name (and HostKeyAlias) before looking it up or hashing it."""
    hostname = hostname.lower()
    return hostname if port == 22 else f"[{hostname}]:{port}"


def blob_type(blob: bytes) -> str:
    """The key type named inside a public key blob (ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256...)."""
    try:
        (n,) = struct.unpack(">I", blob[:4])
        return blob[4:4 + n].decode("ascii")
    except (struct.error, UnicodeDecodeError):
        return "?"


def fingerprint(blob: bytes) -> str:
    """SHA256:... as `ssh-keygen -l` prints it."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def load(paths: Iterable[Path]) -> list[KnownHost]:
    """Every parseable entry of the files that exist, in order; unreadable files count as empty."""
    out: list[KnownHost] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            fields = line.split()
            marker = None
            if fields[0].startswith("@"):
                marker, fields = fields[0], fields[1:]
            if len(fields) < 3:
                continue
            try:
                blob = base64.b64decode(fields[2], validate=True)
            except (binascii.Error, ValueError):
                continue
            out.append(KnownHost(Path(path), lineno, marker, fields[0], fields[1], blob))
    return out


def _glob(pattern: str, name: str) -> bool:
    """OpenSSH's match_pattern: only * and ? are special, case-insensitive."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(rx, name.lower()) is not None


def matches(patterns: str, name: str) -> bool:
    """Does a known_hosts host field (hashed, or comma-separated patterns with !negations) match?"""
    if patterns.startswith("|1|"):
        try:
            _, _, salt64, hash64 = patterns.split("|", 3)
            salt, want = base64.b64decode(salt64), base64.b64decode(hash64)
        except (ValueError, binascii.Error):
            return False
        # OpenSSH hashes the lowercased name; a name hashed as written (older versions of this
        # module) is accepted too.
        return any(hmac.compare_digest(hmac.new(salt, n.encode(), hashlib.sha1).digest(), want)
                   for n in dict.fromkeys((name.lower(), name)))
    positive = False
    for pat in patterns.split(","):
        if pat.startswith("!"):
            if _glob(pat[1:], name):
                return False
        elif _glob(pat, name):
            positive = True
    return positive


@dataclass(frozen=True)
class Verdict:
    status: str  # "ok", "unknown", "mismatch", "revoked"; record() also returns "added"
    entry: Optional[KnownHost] = None


def check(entries: list[KnownHost], name: str, blob: bytes) -> Verdict:
    """ok: a line for this name has this key. revoked: a @revoked line has it. mismatch: lines for
    this name exist but none with this key (same type: changed key; other types only: the server
    no longer offers the recorded type, treated the same way). unknown: no line for this name."""
    for e in entries:
        if e.marker == "@revoked" and e.blob == blob:
            return Verdict("revoked", e)
    mine = [e for e in entries if e.marker is None and matches(e.patterns, name)]
    for e in mine:
        if e.blob == blob:
            return Verdict("ok", e)
    if mine:
        same_type = [e for e in mine if blob_type(e.blob) == blob_type(blob)]
        return Verdict("mismatch", (same_type or mine)[0])
    return Verdict("unknown")


def known_types(entries: list[KnownHost], name: str) -> list[str]:
    """Key types recorded for a name, in file order (to ask the server for those first)."""
    seen: list[str] = []
    for e in entries:
        if e.marker is None and matches(e.patterns, name):
            t = blob_type(e.blob)
            if t not in seen:
                seen.append(t)
    return seen


def record(path: Path, files: Iterable[Path], name: str, blob: bytes, hashed: bool = False) -> Verdict:
    """Accept a new key: under an exclusive flock on `path` (the file new keys go to), read `files`
    again and append the key only if the name is still unknown. Returns Verdict("added", entry)
    or, when another process recorded a key for the name meanwhile, the verdict of check() for
    the files as they are now (ok, mismatch or revoked), without writing anything."""
    path = Path(path)
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise TransportError(f"cannot record the host key in {path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock: append anyway, as OpenSSH does
        verdict = check(load(files), name, blob)
        if verdict.status != "unknown":
            return verdict
        line = append(path, name, blob, hashed)
        return Verdict("added", KnownHost(path, 0, None, line.split(" ", 1)[0], blob_type(blob), blob))
    finally:
        os.close(fd)  # releases the flock


def append(path: Path, name: str, blob: bytes, hashed: bool = False) -> str:
    """Record a key as OpenSSH does (plain `[host]:port type base64`, or a hashed name with
    HashKnownHosts yes). A missing file is created 0600 (its directory 0700). Returns the line."""
    if hashed:
        salt = os.urandom(20)
        digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
        shown = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    else:
        shown = name
    line = f"{shown} {blob_type(blob)} {base64.b64encode(blob).decode()}\n"
    path = Path(path)
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if path.is_file():
                size = os.fstat(fd).st_size
                if size:
                    with open(path, "rb") as fh:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            line = "\n" + line
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise TransportError(f"cannot record the host key in {path}: {exc.strerror}") from exc
    return line.strip()
