"""clusters.yaml: named clusters for `--cluster NAME`, and how a command finds its cluster.

    $LINGJUN_CLUSTERS, else $XDG_CONFIG_HOME/lingjun-slurm/clusters.yaml,
    else ~/.config/lingjun-slurm/clusters.yaml

    clusters:
      lingjun:
        host: login.lingjun.example.com    # or an ~/.ssh/config alias
        user: alice                        # optional (else ssh_config's User, else the local user)
        port: 22                           # optional
        workdir: /mnt/shared/alice/runs    # run.workdir when the spec has none
        partition: gpu                     # cluster.defaults.partition when the spec has none
        account: proj42                    # cluster.account when the spec has none
        network_profile: lingjun-gu7xf     # when the spec names neither profile nor instance_type
        accept_new_host_key: false         # as --accept-new-host-key, for this cluster

Precedence is command line > spec > clusters.yaml: a value from clusters.yaml only fills a
field the spec leaves unset, and `--host` replaces the whole address (host, user, port).
The defaults a submission used are recorded in its manifest (`defaults`), so resubmit
re-renders exactly what was submitted even after clusters.yaml changed. The file is
validated like a spec: every problem names the file, line and field (exit 2).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

from pydantic import Field, StringConstraints, ValidationError, field_validator

from .common.errors import EXIT_INVALID, Issue, LingjunError, UsageError
from .spec.base import NAME_RE, SAFE_PATH_RE, SLURM_WORD_RE, Strict  # not spec.models: no spec classes at import

if TYPE_CHECKING:
    from .spec.load import LoadedSpec

CLUSTERS_ENV = "LINGJUN_CLUSTERS"
# A DNS name, an IPv4 address or an ~/.ssh/config alias: it reaches ssh and messages, never a shell.
HOST_RE = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$"
USER_RE = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"

Host = Annotated[str, StringConstraints(pattern=HOST_RE)]
User = Annotated[str, StringConstraints(pattern=USER_RE)]
_HELP = {
    HOST_RE: "a host name, an IPv4 address or an ~/.ssh/config alias (letters, digits, '.', '_', '-')",
    USER_RE: "a user name (letters, digits, '.', '_', '-')",
    NAME_RE: "a name of letters, digits, '.', '_' and '-' (at most 63)",
    SLURM_WORD_RE: "a Slurm name (letters, digits and . _ + -): it goes on an #SBATCH line",
    SAFE_PATH_RE: "an absolute path of letters, digits and . _ + @ = / - only (it goes on #SBATCH lines)",
}


class ClusterConfig(Strict):
    host: Host = Field(description="Login or scheduler node: a host name or an ~/.ssh/config alias.")
    user: Optional[User] = Field(default=None, description="SSH user (default: ssh_config's User, else yours).")
    port: Optional[int] = Field(default=None, ge=1, le=65535, description="SSH port (default: ssh_config, else 22).")
    workdir: Optional[Annotated[str, StringConstraints(pattern=SAFE_PATH_RE)]] = Field(
        default=None, description="Remote work directory on shared storage: run.workdir when the spec has none.")
    partition: Optional[Annotated[str, StringConstraints(pattern=SLURM_WORD_RE)]] = Field(
        default=None, description="Default partition: cluster.defaults.partition when the spec has none.")
    account: Optional[Annotated[str, StringConstraints(pattern=SLURM_WORD_RE)]] = Field(
        default=None, description="Default account: cluster.account when the spec has none.")
    network_profile: Optional[Annotated[str, StringConstraints(pattern=NAME_RE)]] = Field(
        default=None, description="Network profile when the spec names neither a profile nor an instance type.")
    gpu_hour_price: Optional[float] = Field(
        default=None, ge=0, le=1_000_000,
        description="Price of one GPU-hour: monitoring.gpu_hour_price when the spec has none (goodput cost).")
    textfile_dir: Optional[Annotated[str, StringConstraints(pattern=SAFE_PATH_RE)]] = Field(
        default=None, description="node_exporter textfile directory of the jobs' own, on the compute nodes: "
                                  "monitoring.textfile_dir when the spec has none.")
    accept_new_host_key: bool = Field(
        default=False, description="Accept and record an unknown host key (as --accept-new-host-key).")

    @field_validator("port", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # YAML's `port: true` would otherwise be port 1
            raise ValueError(f"expected a port number 1..65535; got {value!r}")
        return value

    @field_validator("host")
    @classmethod
    def _a_target(cls, value: str) -> str:
        """The transport's own parser decides: a host it would refuse later is refused here, with its line."""
        from .transport.target import parse_target

        try:
            parse_target(value)
        except UsageError:
            raise ValueError(f"expected a host name, an IPv4 address or an ~/.ssh/config alias that ends in a "
                             f"letter, digit or '_'; got {value!r}") from None
        return value

    @field_validator("network_profile")
    @classmethod
    def _known_profile(cls, value: Optional[str]) -> Optional[str]:
        if value is not None:
            from . import network

            if value not in network.profiles():
                known = ", ".join(sorted(network.profiles()))
                raise ValueError(f"unknown network profile {value!r}; profiles: {known}")
        return value

    def target(self) -> str:
        """[USER@]HOST[:PORT], the form --host takes."""
        return f"{self.user + '@' if self.user else ''}{self.host}{':' + str(self.port) if self.port else ''}"


class ClustersFile(Strict):
    clusters: dict[Annotated[str, StringConstraints(pattern=NAME_RE)], ClusterConfig] = Field(default_factory=dict)


class ClustersFileError(LingjunError):
    """clusters.yaml is unreadable or invalid; every problem with file, line and field."""

    exit_code = EXIT_INVALID

    def __init__(self, source: str, issues: list[Issue]) -> None:
        self.source = source
        self.issues = issues
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.issues)
        head = f"{self.source}: invalid clusters file ({n} problem{'s' if n != 1 else ''})"
        return "\n".join([head] + ["  " + i.format(self.source) for i in self.issues])


def clusters_path() -> Path:
    if os.environ.get(CLUSTERS_ENV):
        return Path(os.environ[CLUSTERS_ENV])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "lingjun-slurm" / "clusters.yaml"


def _message(err: Any, model: type[Strict]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"unknown field; expected one of: {', '.join(model.model_fields)}"
    if kind == "missing":
        return "required field is missing"
    if kind == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        return f"expected {_HELP.get(pattern, 'a value matching ' + pattern)}; got {err['input']!r}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind.endswith(("_type", "_parsing")) and "input" in err:
        msg += f" (got {err['input']!r})"
    return msg


def parse_clusters(text: str, source: str) -> ClustersFile:
    from .spec.yamlpos import YamlParseError, load_yaml

    try:
        doc = load_yaml(text)
    except YamlParseError as exc:
        raise ClustersFileError(source, [exc.issue]) from None
    if doc.data in ({}, None):
        return ClustersFile()
    if not isinstance(doc.data, dict):
        raise ClustersFileError(source, [Issue((), "expected a mapping with a `clusters:` key", 1)])
    try:
        return ClustersFile.model_validate(doc.data)
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if isinstance(p, (str, int)))
            # The key of a cluster name that breaks NAME_RE comes back as "[key]": keep the name.
            loc = tuple(str(p).removesuffix("[key]") if isinstance(p, str) else p for p in loc)
            model: type[Strict] = ClusterConfig if len(loc) > 2 and loc[0] == "clusters" else ClustersFile
            issues.append(Issue(loc, _message(err, model), doc.line_of(loc)))
        raise ClustersFileError(source, sorted(issues, key=lambda i: (i.line or 0, str(i.loc)))) from None


def load_clusters(path: Optional[Path] = None) -> tuple[Path, ClustersFile]:
    path = path or clusters_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--cluster: no clusters file at {path} (see docs/remote.md; "
                         f"${CLUSTERS_ENV} or $XDG_CONFIG_HOME move it)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ClustersFileError(str(path), [Issue((), f"cannot read the file: {exc}")]) from None
    return path, parse_clusters(text, str(path))


def get_cluster(name: str, path: Optional[Path] = None) -> ClusterConfig:
    where, doc = load_clusters(path)
    if name not in doc.clusters:
        known = ", ".join(sorted(doc.clusters)) or "none"
        raise UsageError(f"--cluster {name!r}: not in {where} (clusters: {known})")
    return doc.clusters[name]


# ---------------------------------------------------------------------------------- spec defaults

# Spec field (dotted) <- clusters.yaml key. Only fields the spec leaves unset are filled.
DEFAULT_FIELDS: tuple[tuple[str, str], ...] = (
    ("run.workdir", "workdir"),
    ("cluster.defaults.partition", "partition"),
    ("cluster.account", "account"),
    ("cluster.network.profile", "network_profile"),
    ("monitoring.gpu_hour_price", "gpu_hour_price"),
    ("monitoring.textfile_dir", "textfile_dir"),
)


def cluster_defaults(cfg: Optional[ClusterConfig]) -> dict[str, Any]:
    """The spec fields a cluster can fill: {"run.workdir": "/shared/x", ...} (unset keys left out)."""
    if cfg is None:
        return {}
    return {path: getattr(cfg, key) for path, key in DEFAULT_FIELDS if getattr(cfg, key) is not None}


def _unset(data: dict[str, Any], path: str) -> bool:
    """Does the spec leave this field to the cluster? (A network with an instance_type is set.)"""
    if path == "cluster.network.profile":
        cluster = data.get("cluster")
        if cluster is None:
            return True
        if not isinstance(cluster, dict):
            return False  # a wrong shape: leave it to validation to report
        net = cluster.get("network")
        if net is None:
            return True
        if not isinstance(net, dict):
            return False
        return not (net.get("profile") or net.get("instance_type"))
    cur: Any = data
    for part in path.split("."):
        if not isinstance(cur, dict):
            return False  # a wrong shape: leave it to validation to report
        if part not in cur or cur[part] is None:
            return True
        cur = cur[part]
    return False


def _put(data: dict[str, Any], path: str, value: str) -> None:
    parts = path.split(".")
    cur = data
    for part in parts[:-1]:
        if cur.get(part) is None:
            cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = value


def parse_spec_with_defaults(text: str, source: str,
                             defaults: dict[str, str]) -> tuple["LoadedSpec", dict[str, str]]:
    """parse_spec, with cluster defaults filling the fields the spec leaves unset.

    Returns (LoadedSpec, applied): applied is the subset of defaults actually used. The
    LoadedSpec keeps the text and SHA-256 of the spec as written.
    """
    import hashlib

    from .common.errors import SpecError
    from .spec.checks import check
    from .spec.load import LoadedSpec, issues_from_validation, parse_spec  # noqa: F811
    from .spec.models import Spec
    from .spec.yamlpos import YamlParseError, load_yaml

    if not defaults:
        return parse_spec(text, source), {}
    try:
        doc = load_yaml(text)
    except YamlParseError as exc:
        raise SpecError(source, [exc.issue]) from None
    if not isinstance(doc.data, dict):
        return parse_spec(text, source), {}  # parse_spec words the error
    applied = {path: value for path, value in defaults.items() if _unset(doc.data, path)}
    for path, value in applied.items():
        _put(doc.data, path, value)
    try:
        spec = Spec.model_validate(doc.data)
    except ValidationError as exc:
        issues = issues_from_validation(exc, doc)
        raise SpecError(source, sorted(issues, key=lambda i: (i.line or 0, str(i.loc)))) from None
    issues = [Issue(i.loc, i.message, doc.line_of(i.loc)) for i in check(spec)]
    if issues:
        raise SpecError(source, sorted(issues, key=lambda i: (i.line or 0, str(i.loc))))
    return LoadedSpec(spec, source, text, hashlib.sha256(text.encode()).hexdigest(), doc), applied


def load_spec_with_defaults(path: str | Path, defaults: dict[str, str]) -> tuple["LoadedSpec", dict[str, str]]:
    from .spec import load_spec
    from .spec.load import read_spec_text

    if not defaults:
        return load_spec(path), {}
    return parse_spec_with_defaults(read_spec_text(path), str(path), defaults)
