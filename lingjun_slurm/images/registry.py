"""Image references and manifest digests, resolved the way enroot 4.x does it.

STANDARD LIBRARY ONLY: this module runs on cluster hosts that do not have the
project's dependencies installed.

Every rule here is cited to NVIDIA/enroot tag v4.1.2 (``bd51f53b``); the files
are ``src/docker.sh``, ``src/common.sh`` and ``enroot.in`` and the line
numbers belong to that tag.  ``docker::_parse_uri`` (docker.sh:198-304) is the
same from v4.0.0 to v4.1.2.  ``docker::digest`` (docker.sh:390-437) is
identical in v4.0.0 and v4.1.2.

* :func:`parse_image_ref` (reference.py, re-exported) follows ``docker::_parse_uri`` regex for regex.
* :func:`read_credentials` reads ``$ENROOT_CONFIG_PATH/.credentials``
  (docker.sh:18) and never evaluates ``$...`` passwords.
* :func:`resolve_digest` returns what ``enroot digest [-a ARCH] URI`` prints:
  the digest of the *per-platform* image manifest, not the index digest that
  ``docker pull`` shows for multi-arch tags.

Deliberate differences from enroot are marked "DIFFERS" in the docstrings.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import json
import os
import platform
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Mapping

# The reference parser lives in reference.py (no HTTP imports, for the spec's lint); re-exported here.
from .reference import DOCKER_HUB, ImageRef, parse_image_ref

__all__ = [
    "ACCEPT_MANIFEST",
    "ACCEPT_MANIFEST_LIST",
    "DOCKER_HUB",
    "ImageRef",
    "RegistryError",
    "allow_http",
    "credentials_path",
    "debian_arch",
    "parse_image_ref",
    "read_credentials",
    "resolve_digest",
]

# docker.sh:406-407 (and 134-135): the two Accept headers enroot sends.
ACCEPT_MANIFEST_LIST = ("application/vnd.docker.distribution.manifest.list.v2+json, "
                        "application/vnd.oci.image.index.v1+json")
ACCEPT_MANIFEST = ("application/vnd.docker.distribution.manifest.v2+json, "
                   "application/vnd.oci.image.manifest.v1+json")

_USER_AGENT = "lingjun-slurm-registry/1 (enroot-compatible)"


class RegistryError(Exception):
    """Talking to a registry failed.

    The message names the registry, the repository and the HTTP status. It
    never contains a password, a token or an ``Authorization`` value.
    """


# --------------------------------------------------------------------------
# Environment (enroot.in)
# --------------------------------------------------------------------------

_FALSE = re.compile(r"(?:no?|N[oO]?|[fF](?:alse)?|FALSE)")


def _enroot_flag(environ: Mapping[str, str], name: str) -> bool:
    """Whether an ``ENROOT_*`` switch is on, decided the way enroot decides.

    ``config::fini`` unsets any ``ENROOT_*`` whose value matches
    ``^(no?|N[oO]?|[fF](alse)?|FALSE)$`` (enroot.in:63-69).  docker.sh then
    tests ``-n`` (docker.sh:20).  So ``0`` counts as *on*, as it does in
    enroot.
    """
    value = environ.get(name, "")
    return bool(value) and not _FALSE.fullmatch(value)


def allow_http(environ: Mapping[str, str] = os.environ) -> bool:
    """True when ENROOT_ALLOW_HTTP is on.  enroot then uses ``http://`` for the registry, and https is still allowed (docker.sh:20-26)."""
    return _enroot_flag(environ, "ENROOT_ALLOW_HTTP")


def credentials_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Return ``$ENROOT_CONFIG_PATH/.credentials`` (docker.sh:18).

    ENROOT_CONFIG_PATH defaults to ``$XDG_CONFIG_HOME/enroot``, and
    XDG_CONFIG_HOME to ``$HOME/.config`` (enroot.in:74, 81).  Settings in
    enroot.conf are not read here.
    """
    config = environ.get("ENROOT_CONFIG_PATH")
    if not config:
        xdg = environ.get("XDG_CONFIG_HOME")
        if not xdg:
            home = environ.get("HOME") or os.path.expanduser("~")
            xdg = os.path.join(home, ".config")
        config = os.path.join(xdg, "enroot")
    return Path(config) / ".credentials"


_DEBARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le"}


def debian_arch(arch: str | None = None) -> str:
    """Map an architecture name to the Debian-style one used in manifest lists.

    With no argument this uses ``uname -m`` (runtime.sh:436-439).  The mapping
    is ``common::debarch`` (common.sh:253-266): x86_64 becomes amd64, aarch64
    becomes arm64, ppc64le stays ppc64le, and anything else is "Unsupported
    architecture".  DIFFERS: names that are already Debian-style (amd64,
    arm64) are accepted as they are.  ``enroot digest -a amd64`` refuses them.
    """
    arch = arch or platform.machine()
    if arch in _DEBARCH:
        return _DEBARCH[arch]
    if arch in _DEBARCH.values():
        return arch
    raise ValueError(f"Unsupported architecture: {arch} (enroot knows x86_64, aarch64, ppc64le)")


# --------------------------------------------------------------------------
# Credentials ($ENROOT_CONFIG_PATH/.credentials, netrc format)
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Entry:
    machine: str
    login: str | None
    password: str | None = dataclasses.field(repr=False)
    shell: bool  # the password is "$..." and enroot would run it through a shell


def _netrc_entries(text: str) -> list[_Entry]:
    """Tokenise a netrc file the way curl does: whitespace-separated tokens, entries over any number of lines.

    Rules:

    * A ``#`` that starts a token comments out the rest of the line.
    * ``"..."`` quotes a token.
    * ``macdef`` skips to the next blank line.
    * ``default`` entries are ignored, because enroot only uses ``machine``
      lines (docker.sh:58, 300).
    * A password that starts with ``$`` is marked ``shell`` and the rest of
      its line is skipped.  ``common::evalnetrc`` would have run that text as
      ``echo <rest of line>`` (common.sh:175-188).
    """
    entries: list[_Entry] = []
    current: dict | None = None

    def flush():
        if current is not None and current.get("machine") is not None:
            entries.append(_Entry(current["machine"], current.get("login"), current.get("password"),
                                  current.get("shell", False)))

    lines = text.splitlines()
    tokens: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines):
        i, n = 0, len(line)
        while i < n:
            if line[i].isspace():
                i += 1
                continue
            if line[i] == "#":
                break
            if line[i] == '"':
                j, buf = i + 1, []
                while j < n and line[j] != '"':
                    if line[j] == "\\" and j + 1 < n:
                        j += 1
                    buf.append(line[j])
                    j += 1
                tokens.append((lineno, "".join(buf)))
                i = j + 1
                continue
            j = i
            while j < n and not line[j].isspace():
                j += 1
            tokens.append((lineno, line[i:j]))
            i = j

    k = 0
    skip_line = -1
    skip_macdef = False
    while k < len(tokens):
        lineno, tok = tokens[k]
        if lineno == skip_line:
            k += 1
            continue
        if skip_macdef:
            # A macro runs until the first empty line after it.
            if any(not lines[x].strip() for x in range(tokens[k - 1][0] + 1, lineno)):
                skip_macdef = False
            else:
                k += 1
                continue
        if tok == "machine" and k + 1 < len(tokens):
            flush()
            current = {"machine": tokens[k + 1][1]}
            k += 2
        elif tok == "default":
            flush()
            current = {"machine": None}
            k += 1
        elif tok in ("login", "password", "account") and k + 1 < len(tokens):
            value_line, value = tokens[k + 1]
            if current is not None:
                if tok == "password" and value.startswith("$"):
                    current["password"] = None
                    current["shell"] = True
                    skip_line = value_line
                elif tok != "account":
                    current[tok] = value
            k += 2
        elif tok == "macdef":
            flush()
            current = None
            skip_macdef = True
            skip_line = lineno
            k += 1
        else:
            k += 1
    flush()
    return entries


def _host_of(registry: str) -> str:
    """Return the registry with its port removed: ``${registry%:*}`` (docker.sh:58, 300)."""
    return registry.rsplit(":", 1)[0] if ":" in registry else registry


def _load_entries(environ: Mapping[str, str]) -> list[_Entry]:
    try:
        return _netrc_entries(credentials_path(environ).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return []  # enroot greps with -s and ignores a missing or unreadable file (docker.sh:58)


def _find_entry(entries: list[_Entry], host: str, user: str | None) -> _Entry | None:
    host = host.lower()
    matches = [e for e in entries if e.machine.lower() == host]
    if user is not None:
        matches = [e for e in matches if e.login == user]
    return matches[0] if matches else None


def read_credentials(registry: str, environ: Mapping[str, str] = os.environ, *,
                     user: str | None = None) -> tuple[str, str] | None:
    """Return ``(login, password)`` for ``registry`` from ``$ENROOT_CONFIG_PATH/.credentials``, or None.

    The file is in netrc format: ``machine HOST login USER password PW``, on
    one line or spread over several.  ``HOST`` is compared with the registry
    minus its port, ``${registry%:*}`` (docker.sh:58, 300), so
    ``localhost:5000`` uses ``machine localhost``.  Host names are compared
    without regard to case.  When ``user`` is given, only an entry with that
    login counts.  Otherwise the first entry for the host counts, which is how
    enroot infers the user (docker.sh:298-301).

    If that entry's password starts with ``$``, enroot would run the rest of
    the line through a shell (``common::evalnetrc``, common.sh:175-188;
    import.md shows ``$(gcloud auth print-access-token)``).  We **never** run
    shell code from a credentials file, so None is returned for it.  Such
    registries are for ``enroot digest`` (enroot >= 4.0).

    DIFFERS: enroot's own grep only sees the single-line
    ``machine H login U`` form (docker.sh:58, 300).  A multi-line entry is
    read here but may not be used by enroot itself.

    No secret is ever logged or put into an exception.
    """
    entry = _find_entry(_load_entries(environ), _host_of(registry), user)
    if entry is None or entry.shell or entry.login is None or entry.password is None:
        return None
    return entry.login, entry.password


# --------------------------------------------------------------------------
# HTTP (registry API v2, as enroot's curl calls use it)
# --------------------------------------------------------------------------

_STATUS_TEXT = {s.value: s.phrase for s in http.HTTPStatus}


@dataclasses.dataclass
class _Response:
    status: int
    reason: str
    headers: object  # an email.message.Message (case-insensitive .get)
    body: bytes
    url: str


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follow redirects as ``curl -L --proto =https`` (or ``=http,https``) does (docker.sh:20-26).

    A redirect to a different host does not carry the Authorization header
    (curl >= 7.58 behaves the same way).
    """

    def __init__(self, schemes: tuple[str, ...]):
        super().__init__()
        self._schemes = schemes

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        parts = urllib.parse.urlsplit(new.full_url)
        if parts.scheme not in self._schemes:
            raise urllib.error.URLError(f"redirect to a {parts.scheme}:// URL refused "
                                        f"(allowed: {', '.join(self._schemes)})")
        if parts.netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


_R_AUTH_PARAM = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


def _parse_challenge(value: str) -> tuple[str, dict[str, str]]:
    """Parse ``Bearer realm="...",service="...",scope="..."`` into its scheme and parameters.

    enroot does this with awk (docker.sh:43-49).  The realm key is matched
    without regard to case, and commas inside quotes (``scope="repository:a:pull,push"``)
    are kept.
    """
    value = value.strip()
    scheme, _, rest = value.partition(" ")
    params: dict[str, str] = {}
    pos = 0
    rest = rest.strip()
    while pos < len(rest):
        m = _R_AUTH_PARAM.match(rest, pos)
        if not m or m.end() == pos:
            break
        key = m.group(1)
        val = m.group(2) if m.group(2) is not None else (m.group(3) or "")
        val = re.sub(r"\\(.)", r"\1", val)
        params["realm" if key.lower() == "realm" else key] = val
        pos = m.end()
    return scheme, params


class _Client:
    """One resolution: the scheme, the credentials and the Authorization header, with errors made safe."""

    def __init__(self, ref: ImageRef, environ: Mapping[str, str], timeout: float, opener):
        self.ref = ref
        self.environ = environ
        self.timeout = timeout
        self.http = allow_http(environ)
        self.schemes = ("http", "https") if self.http else ("https",)
        self.proto = "http" if self.http else "https"
        self.opener = opener if opener is not None else urllib.request.build_opener(_RedirectHandler(self.schemes))
        self.authorization: str | None = None
        self.secrets: list[str] = []
        self.shell_skipped = False
        self.used_credentials = False

    # ---- messages -------------------------------------------------------
    def _scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, "***")
        return text

    def error(self, what: str, status: int | None = None, reason: str = "", detail: str = "") -> RegistryError:
        msg = f"{self.ref.registry}: repository {self.ref.repository}: {what}"
        if status is not None:
            msg += f": HTTP {status} {reason or _STATUS_TEXT.get(status, '')}".rstrip()
        if detail:
            msg += f" ({detail})"
        return RegistryError(self._scrub(msg))

    def _auth_failed(self, status: int, reason: str, detail: str = "") -> RegistryError:
        hint = f"authentication failed: check $ENROOT_CONFIG_PATH/.credentials ({credentials_path(self.environ)})"
        if self.shell_skipped:
            hint += ("; its password for this registry is a '$' shell expression, which this tool never "
                     "evaluates: use enroot >= 4.0's `enroot digest` instead")
        return self.error(hint, status, reason, detail)

    # ---- requests -------------------------------------------------------
    def request(self, method: str, url: str, *, accept: str | None = None, authorization: str | None = None,
                use_auth: bool = True, ignore: tuple[int, ...] = (), what: str = "request") -> _Response:
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in self.schemes:
            raise self.error(f"{what}: refusing {scheme}:// URL {url} (set ENROOT_ALLOW_HTTP to allow http)")
        req = urllib.request.Request(url, method=method)
        req.add_header("User-Agent", _USER_AGENT)
        if accept:
            req.add_header("Accept", accept)
        auth = authorization if authorization is not None else (self.authorization if use_auth else None)
        if auth:
            req.add_header("Authorization", auth)
        try:
            with self.opener.open(req, timeout=self.timeout) as resp:
                body = resp.read() if method != "HEAD" else b""
                return _Response(resp.status, resp.reason or "", resp.headers, body, resp.geturl())
        except urllib.error.HTTPError as exc:
            try:
                body = exc.read() if method != "HEAD" else b""
            except Exception:  # noqa: BLE001 - a broken error body must not hide the status
                body = b""
            finally:
                exc.close()
            response = _Response(exc.code, exc.reason or "", exc.headers, body, url)
            if exc.code in ignore:
                return response
            detail = self._error_detail(body)
            if exc.code in (401, 403):
                raise self._auth_failed(exc.code, response.reason, detail) from None
            raise self.error(f"{what} {url}", exc.code, response.reason, detail) from None
        except urllib.error.URLError as exc:
            raise self.error(f"{what} {url}: cannot reach the registry: {exc.reason}") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise self.error(f"{what} {url}: {type(exc).__name__}: {exc}") from None

    @staticmethod
    def _error_detail(body: bytes) -> str:
        """Return the first ``errors[]`` code and message of a registry error body, if it has one."""
        try:
            errors = json.loads(body.decode("utf-8")).get("errors") or []
            first = errors[0]
            return f"{first.get('code', '')}: {first.get('message', '')}".strip(": ")[:200]
        except Exception:  # noqa: BLE001 - the body is optional and free-form
            return ""

    # ---- docker::_authenticate (docker.sh:28-92) ------------------------
    def authenticate(self, challenge: str) -> None:
        scheme, params = _parse_challenge(challenge)
        registry_host = _host_of(self.ref.registry)
        entries = _load_entries(self.environ)
        # docker.sh:298-301: with no user in the URI, use the login of the first machine line for the registry.
        user = self.ref.user
        if user is None:
            first = _find_entry(entries, registry_host, None)
            user = first.login if first is not None else None

        def pick(host: str) -> _Entry | None:
            return _find_entry(entries, host, user)

        if scheme.lower() == "bearer":
            realm = params.pop("realm", "")
            if not realm:
                raise self.error(f"Could not parse authentication realm from {challenge.split(' ', 1)[0]} challenge")
            realm_parts = urllib.parse.urlsplit(realm)
            # curl --netrc-file picks the machine of the URL it is fetching, i.e. the realm's host (docker.sh:60-61;
            # this is why NGC needs both nvcr.io and authn.nvidia.com, import.md).  DIFFERS: we then fall back to the
            # registry's entry, which is what `docker login` users expect.
            entry = None
            if user is not None:
                entry = pick(realm_parts.hostname or "") or pick(registry_host)
                self._require_entry(entry, user)
            basic = self._basic(entry)
            query = urllib.parse.urlencode(params)
            url = realm + (("&" if realm_parts.query else "?") + query if query else "")
            resp = self.request("GET", url, authorization=basic or "", use_auth=False, what="token request")
            token = None
            try:
                doc = json.loads(resp.body.decode("utf-8"))
                if isinstance(doc, dict):
                    token = doc.get("token") or doc.get("access_token")  # docker.sh:71
            except (ValueError, UnicodeDecodeError):
                pass
            if not isinstance(token, str) or not token:
                raise self.error(f"token request {realm}: the response has no \"token\" or \"access_token\"",
                                 resp.status, resp.reason)
            self.secrets.append(token)
            self.authorization = f"Bearer {token}"
        elif scheme.lower() == "basic":
            # docker.sh:74-78: the registry itself checks basic credentials.
            entry = pick(registry_host) if user is not None else None
            if user is not None:
                self._require_entry(entry, user)
            self.authorization = self._basic(entry)
        else:
            raise self.error(f"Unsupported authentication method {scheme}")  # docker.sh:80-81

    def _require_entry(self, entry: _Entry | None, user: str) -> None:
        if entry is None:
            # enroot would run `curl -u USER` (docker.sh:63), and curl would ask for a password on the terminal.
            raise self.error(f"user {user!r} has no 'machine {_host_of(self.ref.registry)} login {user} password ...' "
                             f"entry in $ENROOT_CONFIG_PATH/.credentials ({credentials_path(self.environ)}); "
                             "enroot would prompt for the password")

    def _basic(self, entry: _Entry | None) -> str | None:
        if entry is None:
            return None
        if entry.shell:
            self.shell_skipped = True
            return None
        if entry.login is None or entry.password is None:
            return None
        raw = f"{entry.login}:{entry.password}"
        encoded = base64.b64encode(raw.encode("utf-8")).decode("ascii")
        self.secrets.extend([entry.password, raw, encoded])
        self.used_credentials = True
        return f"Basic {encoded}"


_R_RETURNED_DIGEST = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*:[A-Za-z0-9=_-]+")


def resolve_digest(ref: ImageRef, *, arch: str | None = None, environ: Mapping[str, str] = os.environ,
                   timeout: float = 30, opener=None) -> str:
    """Return the digest ``enroot digest [-a ARCH] docker://...`` prints for ``ref`` (docker.sh:390-437).

    1. Send an anonymous ``HEAD /v2/<repo>/manifests/<tag|digest>``.  On
       ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``, GET a token
       from the realm, using basic auth from the credentials file if it has an
       entry, and read the ``token`` or ``access_token`` field (docker.sh:28-92).
    2. GET the same URL with the manifest list/index Accept types.  401 and 404
       are ignored here.  Pick the first ``manifests[]`` entry whose
       ``platform.architecture`` equals the Debian-style ``arch``
       (docker.sh:418-424; arch defaults to ``uname -m``, mapped by
       :func:`debian_arch`).
    3. Send ``HEAD`` for that manifest (or for the tag, if there was no list)
       with the manifest Accept types, and return ``Docker-Content-Digest``
       (docker.sh:427-436).

    DIFFERS:

    * If the header is missing, enroot fails ("Could not retrieve digest").
      We GET the manifest and return ``sha256:`` + the sha256 of the exact
      body bytes, which is the same value by definition of a manifest digest.
    * If the tag is a list with no entry for ``arch``, enroot goes on with the
      tag URL.  We raise RegistryError and list the architectures that exist.

    Requests use https, or plain http when ENROOT_ALLOW_HTTP is on
    (docker.sh:20-26).  ``opener`` is anything with
    ``open(request, timeout=...)``; the default follows redirects like
    ``curl -L``.  Failures raise RegistryError.  A 401/403 says "authentication
    failed: check $ENROOT_CONFIG_PATH/.credentials", and no message ever holds
    a password or token.
    """
    deb_arch = debian_arch(arch)
    client = _Client(ref, environ, timeout, opener)
    # enroot puts the parsed fields into the URL verbatim; we percent-quote them, which changes nothing for
    # valid names and keeps odd ones (a bare IMAGE may hold any character but "/@#:", docker.sh:264) in the path.
    base = f"{client.proto}://{ref.registry}/v2/{urllib.parse.quote(ref.repository, safe='/')}/manifests/"
    url = base + urllib.parse.quote(ref.reference, safe=":")

    # docker::_authenticate: anonymous probe, 401 tolerated (docker.sh:34-40).
    probe = client.request("HEAD", url, accept=f"{ACCEPT_MANIFEST_LIST}, {ACCEPT_MANIFEST}", ignore=(401,),
                           what="manifest probe")
    challenge = probe.headers.get("WWW-Authenticate") if probe.headers is not None else None
    if challenge:
        client.authenticate(challenge)

    # Manifest list / index (docker.sh:417-424).
    listing = client.request("GET", url, accept=ACCEPT_MANIFEST_LIST, ignore=(401, 404), what="manifest list")
    target = url
    if listing.status < 400:
        try:
            doc = json.loads(listing.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            doc = None
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        if isinstance(manifests, list):
            archs = []
            chosen = None
            for item in manifests:
                plat = item.get("platform") if isinstance(item, dict) else None
                a = plat.get("architecture") if isinstance(plat, dict) else None
                archs.append(str(a))
                if chosen is None and a == deb_arch and isinstance(item.get("digest"), str):
                    chosen = item["digest"]
            if chosen is None:
                raise client.error(f"{ref.reference} is a manifest list with no {deb_arch} image "
                                   f"(architectures: {', '.join(archs) or 'none'})")
            if not _R_RETURNED_DIGEST.fullmatch(chosen):
                raise client.error(f"manifest list has a malformed digest for {deb_arch}: {chosen[:100]!r}")
            target = base + chosen

    # HEAD with the manifest types, read Docker-Content-Digest (docker.sh:426-436).
    head = client.request("HEAD", target, accept=ACCEPT_MANIFEST, what="manifest")
    digest = (head.headers.get("Docker-Content-Digest") or "").strip() if head.headers is not None else ""
    if not digest:
        body = client.request("GET", target, accept=ACCEPT_MANIFEST, what="manifest").body
        if not body:
            raise client.error(f"Could not retrieve digest from {target}: no Docker-Content-Digest and an empty body")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
    if not _R_RETURNED_DIGEST.fullmatch(digest):
        raise client.error(f"Docker-Content-Digest from {target} is malformed: {digest[:100]!r}")
    return digest
