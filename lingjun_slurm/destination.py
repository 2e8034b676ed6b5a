"""Where a command goes (--host/--cluster): no pydantic until a cluster is named (clusters.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from .common.errors import UsageError

if TYPE_CHECKING:
    from .clusters import ClusterConfig


@dataclass(frozen=True)
class Destination:
    """Where a command goes: this machine (target "") or an SSH target, plus cluster defaults."""

    target: str = ""
    cluster: str = ""
    accept_new_host_key: bool = False
    config: Optional[ClusterConfig] = None
    source: str = field(default="", compare=False)  # where target came from: "--host", "clusters.yaml"

    @property
    def remote(self) -> bool:
        return bool(self.target)

    def transport_options(self) -> dict[str, Any]:
        return {"accept_new_host_key": self.accept_new_host_key}


def destination(host: Optional[str], cluster: Optional[str], accept_new_host_key: bool = False) -> Destination:
    """--host/--cluster/--accept-new-host-key -> Destination (--host wins over the cluster's address)."""
    if cluster is not None and not cluster.strip():
        raise UsageError("--cluster: empty name (see --cluster NAME in clusters.yaml)")
    if cluster:
        from .clusters import get_cluster

        cfg = get_cluster(cluster)
    else:
        cfg = None
    if host is not None:
        check_target(host)
    target = host or (cfg.target() if cfg else "")
    # The cluster's accept_new_host_key is for its own host, not for one --host puts in its place.
    accept = accept_new_host_key or bool(cfg and cfg.accept_new_host_key and not host)
    return Destination(target=target, cluster=cluster or "", accept_new_host_key=accept, config=cfg,
                       source="--host" if host else ("clusters.yaml" if cfg else ""))


def check_target(target: str) -> None:
    """[USER@]HOST[:PORT], ssh://... or an ssh_config alias (the transport's parser: UsageError, exit 2)."""
    from .transport.target import parse_target

    try:
        parse_target(target)
    except UsageError as exc:
        raise UsageError(f"--host: {exc}") from None
