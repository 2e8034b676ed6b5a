"""--host / --cluster / --accept-new-host-key for the commands that talk to a cluster, and the
connections a command holds: one per host, opened on first use, closed when it ends.

A run that exists already is reached the way its index entry records (transport "ssh",
host as written at submit). `--host`/`--cluster` there narrow the search for RUN to that
host's runs and, for a remote run, replace the recorded address for this command only; a
remote run directory that the index does not know (`status /shared/runs/x --host H`) is
read over SSH and added to the index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

import click

from ..common.errors import UsageError

if TYPE_CHECKING:
    from ..destination import Destination
    from ..runs.index import IndexEntry
    from ..runs.manifest import Manifest
    from ..transport.base import Transport

F = TypeVar("F", bound=Callable[..., Any])

EXIT_CODES = ("Exit codes: 0 success, 1 a run-time failure (Slurm, a job, a dropped connection), 2 invalid "
              "input or usage, 3 host unreachable, 4 SSH authentication failed, 5 SSH host key unknown, "
              "changed or revoked, 130 interrupted by Ctrl-C.")


def remote_options(fn: F) -> F:
    """The three options, as keyword arguments host, cluster, accept_new_host_key."""
    fn = click.option("--accept-new-host-key", is_flag=True,
                      help="Accept an unknown SSH host key and record it in known_hosts (a changed key is "
                           "always refused).")(fn)
    fn = click.option("--cluster", metavar="NAME",
                      help="A cluster from clusters.yaml (~/.config/lingjun-slurm/clusters.yaml): host, user, "
                           "port, workdir and defaults.")(fn)
    fn = click.option("--host", metavar="[USER@]HOST[:PORT]",
                      help="Run on this host over SSH (also an ~/.ssh/config alias; ProxyJump is honoured).")(fn)
    return fn


def destination(host: Optional[str], cluster: Optional[str], accept_new_host_key: bool) -> "Destination":
    from ..destination import destination as resolve

    return resolve(host, cluster, accept_new_host_key)


class Connections:
    """One transport per (kind, host) for the whole command; every one is closed at the end."""

    def __init__(self, dest: "Destination") -> None:
        self.dest = dest
        self._open: dict[tuple[str, str], "Transport"] = {}

    def get(self, kind: str, host: str = "") -> "Transport":
        from ..transport import open_transport

        key = (kind, "" if kind == "local" else host)
        if key not in self._open:
            options = self.dest.transport_options() if kind != "local" else {}
            self._open[key] = open_transport(kind, host, **options)
        return self._open[key]

    def remote(self) -> "Transport":
        """The transport to the command's --host/--cluster target."""
        return self.get("ssh", self.dest.target)

    def for_entry(self, entry: "IndexEntry") -> "Transport":
        kind, host = self.route(entry)
        return self.get(kind, host)

    def route(self, entry: "IndexEntry") -> tuple[str, str]:
        """(kind, host) to reach a run: its record, with --host/--cluster replacing a remote address."""
        if not entry.remote:
            if self.dest.remote:
                raise UsageError(f"run {entry.run_id} was submitted on this machine (no SSH): drop --host/--cluster")
            return "local", ""
        return entry.transport, self.dest.target or entry.host

    def close(self) -> None:
        for t in self._open.values():
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing must not hide the command's own outcome
                pass
        self._open.clear()

    def __enter__(self) -> "Connections":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve(ref: str, conns: Connections) -> "IndexEntry":
    """RUN -> index entry; with --host/--cluster, a remote run directory the index lacks is adopted."""
    from ..common.errors import RunNotFound
    from ..runs.index import RunIndex

    dest = conns.dest
    index = RunIndex()
    try:
        return index.resolve(ref, target=dest.target, cluster=dest.cluster)
    except RunNotFound:
        if not (dest.remote and ref.startswith("/")):
            raise
    return adopt(ref, conns)


def adopt(run_dir: str, conns: Connections) -> "IndexEntry":
    """Read a run directory's manifest over SSH and add the run to this machine's index."""
    from ..runs.index import RunIndex, entry_for
    from ..runs.manifest import load_manifest

    t = conns.remote()
    m = load_manifest(t, run_dir.rstrip("/"))  # also writes the local mirror
    entry = entry_for(m.run_id, m.name, m.created_at, m.executor, t.kind, t.host, m.run_dir, m.spec.source,
                      cluster=conns.dest.cluster)
    RunIndex().add(entry)
    click.echo(f"added run {m.run_id} ({t.host}:{m.run_dir}) to the index", err=True)
    return entry


def open_run(ref: str, conns: Connections) -> tuple["IndexEntry", "Transport", "Manifest"]:
    """RUN -> (index entry, its transport (kept open by conns), manifest)."""
    from ..runs.manifest import load_manifest

    entry = resolve(ref, conns)
    t = conns.for_entry(entry)
    return entry, t, load_manifest(t, entry.run_dir)
