"""lingjun_slurm.images.registry against a real local stand-in for a registry (Docker Registry HTTP API v2).

The stand-in follows distribution/distribution's docs (docs/spec/api.md, docs/spec/auth/token.md):
* an anonymous request gets 401 with ``WWW-Authenticate: Bearer realm=...,service=...,scope=...``;
* the realm (served by the same server) hands out tokens, using basic auth when it is sent;
* manifests are served by tag or digest, with ``Docker-Content-Digest``;
* an unknown tag gives 404 MANIFEST_UNKNOWN.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lingjun_slurm.images import registry as reg
from lingjun_slurm.images.registry import ImageRef, RegistryError, parse_image_ref, read_credentials, resolve_digest

LIST_V2 = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

PASSWORD = "s3cret-Pa55word"
SHELL_CMD = "$(touch /tmp/lingjun-registry-test-must-not-exist; echo pw)"


def _manifest(arch: str) -> bytes:
    # Odd indentation on purpose: a client that re-serialises the JSON would compute a different digest.
    doc = {"schemaVersion": 2, "mediaType": MANIFEST_V2,
           "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": 7,
                      "digest": "sha256:" + hashlib.sha256(arch.encode()).hexdigest()},
           "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": 3,
                       "digest": "sha256:" + hashlib.sha256(b"layer-" + arch.encode()).hexdigest()}]}
    return json.dumps(doc, indent=3).encode() + b"\n"


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Registry:
    """The stand-in's content and settings, plus a record of the requests it saw."""

    def __init__(self, *, auth: bool = True, send_digest: bool = True, token_field: str = "token"):
        self.auth = auth
        self.send_digest = send_digest
        self.token_field = token_field
        self.users = {"alice": PASSWORD}
        self.private = {"private/app"}
        self.tokens: dict[str, tuple[str | None, str]] = {}  # token -> (user, scope)
        self.requests: list[dict] = []
        self.blobs: dict[str, tuple[str, bytes]] = {}  # digest -> (media type, body)
        self.tags: dict[tuple[str, str], str] = {}  # (repo, tag) -> digest
        self.amd64, self.arm64 = _manifest("amd64"), _manifest("arm64")
        for repo in ("library/ubuntu", "private/app"):
            index = json.dumps({"schemaVersion": 2, "mediaType": LIST_V2, "manifests": [
                {"mediaType": MANIFEST_V2, "size": len(self.amd64), "digest": _digest(self.amd64),
                 "platform": {"architecture": "amd64", "os": "linux"}},
                {"mediaType": MANIFEST_V2, "size": len(self.arm64), "digest": _digest(self.arm64),
                 "platform": {"architecture": "arm64", "os": "linux", "variant": "v8"}},
            ]}, indent=1).encode()
            self.add(repo, "22.04", LIST_V2, index)
            self.add(repo, None, MANIFEST_V2, self.amd64)
            self.add(repo, None, MANIFEST_V2, self.arm64)
        self.single = _manifest("amd64-single")
        self.add("nvidia/pytorch", "24.05-py3", OCI_MANIFEST, self.single)
        self.index_digest = self.tags[("library/ubuntu", "22.04")]

    def add(self, repo, tag, media_type, body):
        d = _digest(body)
        self.blobs[d] = (media_type, body)
        if tag:
            self.tags[(repo, tag)] = d
        self.tags.setdefault((repo, d), d)


def _handler(state: Registry):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep pytest output clean
            pass

        def _send(self, code, headers=(), body=b"", head=False):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _error(self, code, err, message, headers=(), head=False):
            body = json.dumps({"errors": [{"code": err, "message": message}]}).encode()
            self._send(code, [("Content-Type", "application/json"), *headers], body, head)

        def _record(self):
            state.requests.append({"method": self.command, "path": self.path,
                                   "authorization": self.headers.get("Authorization"),
                                   "accept": self.headers.get("Accept")})

        def do_HEAD(self):
            self._record()
            self._manifest(head=True)

        def do_GET(self):
            self._record()
            if self.path.startswith("/token"):
                return self._token()
            self._manifest(head=False)

        def _token(self):
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            user = None
            auth = self.headers.get("Authorization")
            if auth:
                scheme, _, value = auth.partition(" ")
                login, _, pw = base64.b64decode(value).decode().partition(":")
                if scheme != "Basic" or state.users.get(login) != pw:
                    return self._error(401, "UNAUTHORIZED", "invalid username or password",
                                       [("WWW-Authenticate", 'Basic realm="token"')])
                user = login
            token = secrets.token_hex(16)
            state.tokens[token] = (user, query.get("scope", [""])[0])
            body = json.dumps({state.token_field: token, "expires_in": 300}).encode()
            self._send(200, [("Content-Type", "application/json")], body)

        def _manifest(self, head):
            parts = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).split("/manifests/")
            if len(parts) != 2 or not parts[0].startswith("/v2/"):
                return self._error(404, "NOT_FOUND", "no route", head=head)
            repo, reference = parts[0][len("/v2/"):], parts[1]
            if state.auth:
                scope = f"repository:{repo}:pull"
                host = self.headers.get("Host")
                challenge = f'Bearer realm="http://{host}/token",service="stand-in",scope="{scope}"'
                auth = self.headers.get("Authorization") or ""
                granted = state.tokens.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
                if granted is None or granted[1] != scope or (repo in state.private and granted[0] is None):
                    return self._error(401, "UNAUTHORIZED", "authentication required",
                                       [("WWW-Authenticate", challenge)], head)
            digest = state.tags.get((repo, reference))
            if digest is None:
                return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown", head=head)
            media_type, body = state.blobs[digest]
            accept = self.headers.get("Accept") or ""
            if media_type in (LIST_V2, OCI_INDEX) and LIST_V2 not in accept and OCI_INDEX not in accept:
                # A strict registry: no list types accepted, so the list cannot be served.
                return self._error(404, "MANIFEST_UNKNOWN", "manifest unknown (media type)", head=head)
            headers = [("Content-Type", media_type)]
            if state.send_digest:
                headers.append(("Docker-Content-Digest", digest))
            self._send(200, headers, body, head)

    return Handler


@pytest.fixture
def serve(tmp_path, monkeypatch):
    """Start a stand-in registry; returns (state, "127.0.0.1:PORT", environ)."""
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    servers = []

    def start(**kwargs):
        state = Registry(**kwargs)
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append(server)
        config = tmp_path / "enroot-config"
        config.mkdir(exist_ok=True)
        env = {"ENROOT_ALLOW_HTTP": "1", "ENROOT_CONFIG_PATH": str(config), "HOME": str(tmp_path)}
        return state, f"127.0.0.1:{server.server_address[1]}", env

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _creds(env, text):
    path = os.path.join(env["ENROOT_CONFIG_PATH"], ".credentials")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _all_messages(exc: BaseException) -> str:
    out = []
    while exc is not None:
        out += [str(exc), repr(exc), *map(str, exc.args)]
        exc = exc.__cause__ or exc.__context__
    return "\n".join(out)


# ---------------------------------------------------------------- parse_image_ref

# (reference, user, registry, repository, tag, digest): what docker::_parse_uri (enroot v4.1.2) makes of it.
# Checked against the real bash function during development.
PARSE_TABLE = [
    ("ubuntu", None, "registry-1.docker.io", "library/ubuntu", "latest", None),
    ("ubuntu:22.04", None, "registry-1.docker.io", "library/ubuntu", "22.04", None),
    ("docker://ubuntu:22.04", None, "registry-1.docker.io", "library/ubuntu", "22.04", None),
    # The trap: docker-style, the first component has a "." so it is the registry.
    ("nvcr.io/nvidia/pytorch:24.05-py3", None, "nvcr.io", "nvidia/pytorch", "24.05-py3", None),
    ("nvcr.io#nvidia/pytorch:24.05-py3", None, "nvcr.io", "nvidia/pytorch", "24.05-py3", None),
    ("user@nvcr.io#nvidia/pytorch:25.04-py3", "user", "nvcr.io", "nvidia/pytorch", "25.04-py3", None),
    ("$oauthtoken@nvcr.io#nvidia/pytorch:25.04-py3", "$oauthtoken", "nvcr.io", "nvidia/pytorch", "25.04-py3", None),
    # No "." or ":" in the first component: a Docker Hub namespace, not a registry.
    ("nvidia/cuda:12.4.1-base-ubuntu22.04", None, "registry-1.docker.io", "nvidia/cuda", "12.4.1-base-ubuntu22.04", None),
    ("localhost/foo", None, "registry-1.docker.io", "localhost/foo", "latest", None),
    ("localhost:5000/foo:bar", None, "localhost:5000", "foo", "bar", None),
    ("localhost:5000#team/foo", None, "localhost:5000", "team/foo", "latest", None),
    ("docker.io/library/ubuntu", None, "docker.io", "library/ubuntu", "latest", None),  # 4.1.2: no aliasing
    ("a/b/c", None, "registry-1.docker.io", "a/b/c", "latest", None),
    ("a.b/c/d:e:f", None, "a.b", "c/d", "e:f", None),
    ("reg.io:5000#a/b:c:d", None, "reg.io:5000", "a/b", "c:d", None),
    ("u@h.io/x/y", "u", "h.io", "x/y", "latest", None),
    ("a@b@nvcr.io#x/y", "a@b", "nvcr.io", "x/y", "latest", None),
    ("u:p@reg.io#img", "u:p", "reg.io", "img", "latest", None),
    ("u@ubuntu:1", "u", "registry-1.docker.io", "library/ubuntu", "1", None),
    ("Ubuntu", None, "registry-1.docker.io", "library/Ubuntu", "latest", None),  # a bare IMAGE is [^/@#:]+
    ("ubuntu@md5:abc", "ubuntu", "registry-1.docker.io", "library/md5", "abc", None),  # not a digest: USER@IMAGE:TAG
    # Digests: with TAG@DIGEST the tag is kept here, but enroot ignores it.
    ("ubuntu@sha256:abcdef0123", None, "registry-1.docker.io", "library/ubuntu", None, "sha256:abcdef0123"),
    ("ubuntu:22.04@sha256:abc", None, "registry-1.docker.io", "library/ubuntu", "22.04", "sha256:abc"),
    ("nvcr.io/nvidia/pytorch@sha256:abc", None, "nvcr.io", "nvidia/pytorch", None, "sha256:abc"),
    ("nvcr.io/nvidia/pytorch:1@sha256:abc", None, "nvcr.io", "nvidia/pytorch", "1", "sha256:abc"),
    ("nvcr.io#nvidia/pytorch@sha256:ABC", None, "nvcr.io", "nvidia/pytorch", None, "sha256:ABC"),
    ("me@nvcr.io#nvidia/pytorch:1@sha256:abc", "me", "nvcr.io", "nvidia/pytorch", "1", "sha256:abc"),
]


@pytest.mark.parametrize("text,user,registry,repository,tag,digest", PARSE_TABLE, ids=[r[0] for r in PARSE_TABLE])
def test_parse_image_ref_table(text, user, registry, repository, tag, digest):
    ref = parse_image_ref(text)
    assert ref == ImageRef(user=user, registry=registry, repository=repository, tag=tag, digest=digest)
    if repository == repository.lower():
        assert parse_image_ref(ref.uri()) == ref  # the enroot URI reads back to the same reference
    else:  # enroot quirk: a bare IMAGE may hold capitals, the REGISTRY#IMAGE form may not (docker.sh:201, 264)
        with pytest.raises(ValueError):
            parse_image_ref(ref.uri())


@pytest.mark.parametrize("text", [
    "", "nvcr.io/NVIDIA/pytorch", "nvcr.io#", "#foo", "nvcr.io/", "ubuntu:", "ubuntu@sha256:",
    "ubuntu:tag with space", "dockerd://ubuntu", "podman://ubuntu:22.04",
    # enroot would hand these registries to curl; we refuse registries that are not host[:port].
    "a^b@h.io/x", "ubuntu:tag/with", "a b.io/x",
])
def test_parse_image_ref_refuses(text):
    with pytest.raises(ValueError, match="image reference|registry"):
        parse_image_ref(text)


def test_uri_forms_and_pinning():
    ref = parse_image_ref("nvcr.io/nvidia/pytorch:24.05-py3")
    assert ref.uri() == "docker://nvcr.io#nvidia/pytorch:24.05-py3"
    pin = "sha256:" + "a" * 64
    assert ref.uri(pin) == f"docker://nvcr.io#nvidia/pytorch:24.05-py3@{pin}"
    assert parse_image_ref(ref.uri(pin)).reference == pin
    assert parse_image_ref("ubuntu").uri() == "docker://registry-1.docker.io#library/ubuntu:latest"
    assert parse_image_ref("u@nvcr.io#a/b@sha256:ab").uri() == "docker://u@nvcr.io#a/b@sha256:ab"
    with pytest.raises(ValueError):
        ref.uri("md5:abc")


# ---------------------------------------------------------------- credentials

def test_credentials_multiline_port_and_shell(tmp_path):
    env = {"ENROOT_CONFIG_PATH": str(tmp_path)}
    _creds(env, "# comment line\n"
                "machine nvcr.io login $oauthtoken password nvapi-123\n"
                "machine authn.nvidia.com login $oauthtoken password nvapi-456\n"
                "machine\n  localhost\n  login\n bob\n  password \"pw with space\"\n"
                "machine gar.example.com login oauth2accesstoken password $(gcloud auth print-access-token)\n"
                "machine ecr.example.com login AWS password $(aws ecr get-login-password --region eu) "
                "machine not-a-real-entry login x password y\n"
                "machine Multi.Example.org login first password one\n"
                "machine multi.example.org login second password two\n")
    assert read_credentials("nvcr.io", env) == ("$oauthtoken", "nvapi-123")
    assert read_credentials("authn.nvidia.com", env) == ("$oauthtoken", "nvapi-456")
    assert read_credentials("localhost:5000", env) == ("bob", "pw with space")  # ${registry%:*}
    assert read_credentials("localhost", env) == ("bob", "pw with space")
    assert read_credentials("gar.example.com", env) is None   # '$' password: never evaluated
    assert read_credentials("ecr.example.com", env) is None
    assert read_credentials("not-a-real-entry", env) is None  # it was part of the shell command's line
    assert read_credentials("multi.example.org:443", env) == ("first", "one")
    assert read_credentials("multi.example.org", env, user="second") == ("second", "two")
    assert read_credentials("multi.example.org", env, user="nobody") is None
    assert read_credentials("registry-1.docker.io", env) is None
    assert not os.path.exists("/tmp/lingjun-registry-test-must-not-exist")


def test_credentials_default_location(tmp_path):
    (tmp_path / "xdg" / "enroot").mkdir(parents=True)
    (tmp_path / "xdg" / "enroot" / ".credentials").write_text("machine r.io login a password b\n")
    (tmp_path / "home" / ".config" / "enroot").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "enroot" / ".credentials").write_text("machine r.io login c password d\n")
    assert read_credentials("r.io", {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": "/nonexistent"}) == ("a", "b")
    assert read_credentials("r.io", {"HOME": str(tmp_path / "home")}) == ("c", "d")
    assert read_credentials("r.io", {"ENROOT_CONFIG_PATH": str(tmp_path / "none")}) is None


@pytest.mark.parametrize("value,on", [("1", True), ("y", True), ("yes", True), ("true", True), ("0", True),
                                      ("", False), ("n", False), ("no", False), ("No", False), ("false", False),
                                      ("F", False), ("FALSE", False)])
def test_allow_http_follows_enroot(value, on):
    assert reg.allow_http({"ENROOT_ALLOW_HTTP": value}) is on


def test_debian_arch():
    assert reg.debian_arch("x86_64") == "amd64"
    assert reg.debian_arch("aarch64") == "arm64"
    assert reg.debian_arch("ppc64le") == "ppc64le"
    with pytest.raises(ValueError, match="Unsupported architecture"):
        reg.debian_arch("riscv64")


# ---------------------------------------------------------------- resolve_digest

def test_digest_per_architecture(serve):
    state, host, env = serve()
    ref = parse_image_ref(f"{host}#library/ubuntu:22.04")
    amd = resolve_digest(ref, arch="x86_64", environ=env)
    arm = resolve_digest(ref, arch="aarch64", environ=env)
    assert amd == _digest(state.amd64) and arm == _digest(state.arm64) and amd != arm
    assert resolve_digest(ref, arch="arm64", environ=env) == arm
    # The flow enroot uses: anonymous HEAD, token, GET list with list types, HEAD manifest with manifest types.
    seq = [(r["method"], r["path"].split("?")[0]) for r in state.requests[:4]]
    assert seq == [("HEAD", "/v2/library/ubuntu/manifests/22.04"), ("GET", "/token"),
                   ("GET", "/v2/library/ubuntu/manifests/22.04"), ("HEAD", f"/v2/library/ubuntu/manifests/{amd}")]
    assert state.requests[0]["authorization"] is None
    assert LIST_V2 in state.requests[2]["accept"] and OCI_INDEX in state.requests[2]["accept"]
    assert MANIFEST_V2 in state.requests[3]["accept"] and LIST_V2 not in state.requests[3]["accept"]
    assert state.requests[3]["authorization"].startswith("Bearer ")
    token_query = urllib.parse.parse_qs(urllib.parse.urlsplit(state.requests[1]["path"]).query)
    assert token_query == {"service": ["stand-in"], "scope": ["repository:library/ubuntu:pull"]}
    # Pinned to the index digest, the platform digest still comes back.
    pinned = parse_image_ref(f"{host}#library/ubuntu@{state.index_digest}")
    assert resolve_digest(pinned, arch="aarch64", environ=env) == arm


def test_digest_single_manifest_and_access_token(serve):
    state, host, env = serve(token_field="access_token")
    ref = parse_image_ref(f"{host}/nvidia/pytorch:24.05-py3")
    assert resolve_digest(ref, arch="x86_64", environ=env) == _digest(state.single)


def test_digest_without_header_hashes_exact_body(serve):
    state, host, env = serve(send_digest=False)
    ref = parse_image_ref(f"{host}#library/ubuntu:22.04")
    assert resolve_digest(ref, arch="aarch64", environ=env) == _digest(state.arm64)
    assert state.requests[-1]["method"] == "GET"
    assert _digest(json.dumps(json.loads(state.arm64)).encode()) != _digest(state.arm64)  # re-serialising would fail


def test_no_auth_registry_sends_no_authorization(serve):
    state, host, env = serve(auth=False)
    _creds(env, f"machine 127.0.0.1 login alice password {PASSWORD}\n")
    ref = parse_image_ref(f"{host}#library/ubuntu:22.04")
    assert resolve_digest(ref, arch="x86_64", environ=env) == _digest(state.amd64)
    assert all(r["authorization"] is None for r in state.requests)


def test_token_request_carries_basic_auth(serve):
    state, host, env = serve()
    # Multi-line entry, host without the port, user inferred from the file (docker.sh:298-301).
    _creds(env, f"machine 127.0.0.1\n  login alice\n  password {PASSWORD}\n")
    ref = parse_image_ref(f"{host}#private/app:22.04")
    assert resolve_digest(ref, arch="x86_64", environ=env) == _digest(state.amd64)
    token_reqs = [r for r in state.requests if r["path"].startswith("/token")]
    expected = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    assert [r["authorization"] for r in token_reqs] == [expected]
    # The basic credentials go to the realm only, never to the registry endpoints.
    assert all(r["authorization"] != expected for r in state.requests if "/v2/" in r["path"])
    # With the user named in the reference it works the same way.
    ref2 = parse_image_ref(f"alice@{host}#private/app:22.04")
    assert resolve_digest(ref2, arch="aarch64", environ=env) == _digest(state.arm64)


def test_private_repo_anonymous_fails_with_hint(serve):
    state, host, env = serve()
    with pytest.raises(RegistryError) as info:
        resolve_digest(parse_image_ref(f"{host}#private/app:22.04"), arch="x86_64", environ=env)
    msg = str(info.value)
    assert host in msg and "private/app" in msg and "401" in msg
    assert "authentication failed: check $ENROOT_CONFIG_PATH/.credentials" in msg


def test_wrong_password_is_401_and_never_leaks(serve):
    state, host, env = serve()
    wrong = "wrong-" + PASSWORD
    _creds(env, f"machine 127.0.0.1 login alice password {wrong}\n")
    with pytest.raises(RegistryError) as info:
        resolve_digest(parse_image_ref(f"{host}#private/app:22.04"), arch="x86_64", environ=env)
    text = _all_messages(info.value)
    assert "authentication failed" in text and "401" in text and "private/app" in text and host in text
    encoded = base64.b64encode(f"alice:{wrong}".encode()).decode()
    for secret in (wrong, PASSWORD, encoded, *state.tokens):
        assert secret not in text


def test_secrets_never_in_any_error(serve):
    """A token was issued, then the manifest fails: neither password nor token shows up."""
    state, host, env = serve()
    _creds(env, f"machine 127.0.0.1 login alice password {PASSWORD}\n")
    with pytest.raises(RegistryError) as info:
        resolve_digest(parse_image_ref(f"{host}#private/app:no-such-tag"), arch="x86_64", environ=env)
    text = _all_messages(info.value)
    assert "404" in text and "private/app" in text and host in text
    assert state.tokens  # a token really was handed out
    encoded = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    for secret in (PASSWORD, encoded, *state.tokens):
        assert secret not in text


def test_unknown_tag_is_404(serve):
    state, host, env = serve()
    with pytest.raises(RegistryError, match=r"404") as info:
        resolve_digest(parse_image_ref(f"{host}#library/ubuntu:does-not-exist"), arch="x86_64", environ=env)
    assert host in str(info.value) and "library/ubuntu" in str(info.value)


def test_arch_missing_from_list(serve):
    state, host, env = serve()
    with pytest.raises(RegistryError, match=r"no ppc64le image \(architectures: amd64, arm64\)"):
        resolve_digest(parse_image_ref(f"{host}#library/ubuntu:22.04"), arch="ppc64le", environ=env)


def test_shell_password_is_never_run(serve, monkeypatch):
    import subprocess
    state, host, env = serve()
    _creds(env, f"machine 127.0.0.1 login alice password {SHELL_CMD}\n")

    def forbidden(*a, **k):
        raise AssertionError("a shell was started")
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(os, "system", forbidden)
    assert read_credentials(host, env) is None
    with pytest.raises(RegistryError) as info:
        resolve_digest(parse_image_ref(f"{host}#private/app:22.04"), arch="x86_64", environ=env)
    msg = str(info.value)
    assert "enroot digest" in msg and "401" in msg
    assert "gcloud" not in msg and "touch" not in msg
    assert all(r["authorization"] is None or r["authorization"].startswith("Bearer ") for r in state.requests)
    assert not os.path.exists("/tmp/lingjun-registry-test-must-not-exist")
    # A public repo still resolves anonymously.
    assert resolve_digest(parse_image_ref(f"{host}#library/ubuntu:22.04"), arch="x86_64",
                          environ=env) == _digest(state.amd64)


def test_named_user_without_entry_is_refused(serve):
    state, host, env = serve()
    with pytest.raises(RegistryError, match="enroot would prompt"):
        resolve_digest(parse_image_ref(f"carol@{host}#private/app:22.04"), arch="x86_64", environ=env)


class _Recorder:
    def __init__(self):
        self.urls = []

    def open(self, req, timeout=None):
        self.urls.append(req.full_url)
        raise OSError("recorded only")


@pytest.mark.parametrize("value,scheme", [(None, "https"), ("false", "https"), ("no", "https"), ("1", "http")])
def test_https_unless_allow_http(value, scheme):
    env = {} if value is None else {"ENROOT_ALLOW_HTTP": value}
    rec = _Recorder()
    with pytest.raises(RegistryError, match="nvcr.io") as info:
        resolve_digest(parse_image_ref("nvcr.io/nvidia/pytorch:24.05-py3"), arch="x86_64", environ=env, opener=rec)
    assert rec.urls == [f"{scheme}://nvcr.io/v2/nvidia/pytorch/manifests/24.05-py3"]
    assert "nvidia/pytorch" in str(info.value)


def test_http_realm_refused_without_allow_http(serve):
    """The registry answers over http (ENROOT_ALLOW_HTTP on) but the check is per URL: realm must be an allowed scheme."""
    state, host, env = serve()
    client = reg._Client(parse_image_ref(f"{host}#library/ubuntu"), {}, 5, None)
    with pytest.raises(RegistryError, match="refusing http://"):
        client.request("GET", f"http://{host}/token", what="token request")
