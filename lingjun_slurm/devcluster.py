"""A real single-host Slurm cluster on 127.0.0.1, for tests and for trying pipelines locally.

A private munged, optionally MariaDB + slurmdbd (so sacct works), one slurmctld and one slurmd
per node (node1..nodeN, each on its own port) run from one state directory, each in the
foreground of its own session, so their PIDs are known exactly; they are stopped by those PIDs
(checked against /proc start times), never by name. Needs root (SlurmUser=root) and Debian's
slurmctld slurmd slurm-client munge (+ slurmdbd mariadb-server). Stdlib only; docs/dev-cluster.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import LingjunError

DEFAULT_ROOT = Path("/tmp/lingjun-devcluster")
MARKER = ".lingjun-devcluster"  # only a directory holding this (or an empty one) is ever wiped
DB_PASSWORD = "lingjun-dev"  # a throw-away MariaDB listening on 127.0.0.1 only
ACTIVE = ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


class DevClusterError(LingjunError):
    """The dev cluster could not be started, stopped or queried."""


@dataclass
class DevClusterConfig:
    """Shape of the cluster. Ports, all on 127.0.0.1: slurmctld base_port, slurmdbd base_port+2,
    MariaDB base_port+3, slurmd of node i base_port+200+i-1."""

    root: Path = DEFAULT_ROOT
    nodes: int = 4
    cpus_per_node: int = 2
    gpus_per_node: int = 2
    accounting: bool = False
    cluster_name: str = "lingjun-dev"
    base_port: int = 6817
    memory_mb_per_node: int = 16000  # RealMemory: checked against --mem, never enforced
    # Nodes after node1..nodeN that are only in partition extra_partition, together with nodeN:
    # kept out of cpu/gpu so a test may drain one without disturbing other tests' jobs.
    extra_nodes: int = 0
    extra_partition: str = "health"
    # Seconds slurmctld waits for an unresponsive slurmd before it marks the node DOWN and fails its
    # jobs (SlurmdTimeout, slurm.conf; Slurm's default 300): the fault bench loses nodes on purpose.
    slurmd_timeout: int = 300

    def __post_init__(self) -> None:
        self.root = Path(self.root).absolute()
        if not 2 <= self.nodes <= 8:
            raise DevClusterError(f"nodes must be 2..8, got {self.nodes}")
        if not 0 <= self.extra_nodes <= 8 - self.nodes:
            raise DevClusterError(f"extra_nodes must be 0..{8 - self.nodes} (8 nodes at most), got {self.extra_nodes}")
        if not self.extra_partition.isalnum() or self.extra_partition in ("cpu", "gpu"):
            raise DevClusterError(f"extra_partition must be a name other than cpu/gpu, got {self.extra_partition!r}")
        if not 1 <= self.cpus_per_node <= 64 or not 0 <= self.gpus_per_node <= 16:
            raise DevClusterError("cpus_per_node must be 1..64 and gpus_per_node 0..16")
        if not 5 <= self.slurmd_timeout <= 65533:
            raise DevClusterError(f"slurmd_timeout must be 5..65533 s, got {self.slurmd_timeout}")
        if not 1024 <= self.base_port <= 65235:
            raise DevClusterError(f"base_port must be 1024..65235, got {self.base_port}")

    def slurmd_port(self, i: int) -> int:
        """Port of node i (1-based)."""
        return self.base_port + 200 + i - 1

    @property
    def total_nodes(self) -> int:
        return self.nodes + self.extra_nodes

    @property
    def node_names(self) -> list[str]:
        """Every node: node1..nodeN, then the extra nodes."""
        return [f"node{i}" for i in range(1, self.total_nodes + 1)]

    def ports(self) -> dict[int, str]:
        """Every port the cluster listens on -> who."""
        ports = {self.base_port: "slurmctld"}
        ports.update({self.slurmd_port(i): f"slurmd node{i}" for i in range(1, self.total_nodes + 1)})
        if self.accounting:
            ports.update({self.base_port + 2: "slurmdbd", self.base_port + 3: "mariadbd"})
        return ports


@dataclass
class _Daemon:
    pid: int
    start: str  # start time from /proc/PID/stat: a reused PID is never taken for ours
    log: str


def _proc_stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...), None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2:].split()


def _start_time(pid: int) -> str | None:
    fields = _proc_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else fields[19]


def _alive(d: _Daemon) -> bool:
    return _start_time(d.pid) == d.start


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return f"--- last lines of {path} ---\n" + "\n".join(text)


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class DevCluster:
    """Start, stop and inspect the dev cluster whose state lives in config.root."""

    def __init__(self, config: DevClusterConfig) -> None:
        self.config = config
        self.root = config.root
        self.slurm_conf = self.root / "slurm.conf"
        self.log_dir = self.root / "log"
        self.state_file = self.root / "state.json"
        self.munge_socket = self.root / "munge" / "munge.sock"
        self._procs: list[subprocess.Popen[bytes]] = []

    @classmethod
    def from_root(cls, root: Path) -> DevCluster:
        """The cluster recorded in root/state.json, in the shape it was started with (the
        default shape if none was): what `down` and `status` use."""
        config = DevClusterConfig(root=root)
        try:
            saved = json.loads(config.root.joinpath("state.json").read_text())["config"]
            config = DevClusterConfig(**dict(saved, root=Path(saved["root"])))
        except (OSError, ValueError, KeyError, TypeError, DevClusterError):
            pass
        return cls(config)

    @property
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, sacct, scontrol) needs in its environment."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def env_file(self) -> Path:
        """root/env.sh: `source` it to point Slurm's commands at this cluster."""
        path = self.root / "env.sh"
        path.write_text(f"export SLURM_CONF={self.slurm_conf}\n")
        return path

    def up(self, timeout: float = 60) -> None:
        """Start from an empty state directory and wait until every node is idle and a probe job
        ran. A no-op when every daemon is up already (same shape); a partly up or stale cluster
        is stopped first. On failure everything started is stopped again; the logs stay."""
        daemons = self._load_state()
        if daemons and all(map(_alive, daemons.values())) and self._saved_config() == self._config_dict():
            return
        if daemons:
            self.down()
        if os.geteuid() != 0:
            raise DevClusterError("the dev cluster needs root (its daemons run with SlurmUser=root)")
        self._check_binaries()
        busy = self.ports_in_use()
        if busy:
            who = ", ".join(f"{p} ({self.config.ports()[p]})" for p in busy)
            raise DevClusterError(f"ports in use on 127.0.0.1: {who}; another dev cluster? "
                                  "choose another base port (--base-port)")
        self._wipe_root()
        deadline = time.monotonic() + timeout
        try:
            self._write_files()
            self._start_all(deadline)
        except BaseException:
            self.down()
            raise

    def down(self) -> None:
        """Cancel every job, then SIGTERM the recorded daemons (slurmctld and all slurmd at once,
        then slurmdbd, then MariaDB and munged), SIGKILL stragglers. Idempotent."""
        live = {name: d for name, d in self._load_state().items() if _alive(d)}
        if "slurmctld" in live:
            self._cancel_jobs()
        phases = [[n for n in live if n.startswith("slurmd-") or n == "slurmctld"], ["slurmdbd"],
                  [n for n in live if n in ("mariadbd", "munged")]]
        for phase in phases:
            group = [live[n] for n in phase if n in live]
            for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
                for d in group:
                    self._signal(d, sig)
                end = time.monotonic() + wait
                while any(map(_alive, group)) and time.monotonic() < end:
                    time.sleep(0.05)
        self._kill_orphan_steps()
        for proc in self._procs:  # reap the children this object started
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()

    def status(self) -> dict[str, Any]:
        """{"up", "root", "slurm_conf", "daemons": {name: {pid, alive, log}}, "nodes": [{name,
        state, partitions}] (from sinfo, when up), "accounting"}."""
        daemons = self._load_state()
        alive = {name: _alive(d) for name, d in daemons.items()}
        up = bool(daemons) and all(alive.values())
        return {
            "up": up, "root": str(self.root), "slurm_conf": str(self.slurm_conf),
            "daemons": {name: {"pid": d.pid, "alive": alive[name], "log": d.log} for name, d in daemons.items()},
            "nodes": self._sinfo_nodes() if up else [],
            "accounting": bool(self._saved_config().get("accounting", self.config.accounting)),
        }

    def ports_in_use(self) -> list[int]:
        """The ports this cluster needs that something else holds on 127.0.0.1."""
        busy = []
        for port in self.config.ports():
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    busy.append(port)
        return busy

    # ------------------------------------------------------------------ state file
    def _read_state(self, key: str) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_file.read_text()).get(key, {}))
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _load_state(self) -> dict[str, _Daemon]:
        try:
            return {name: _Daemon(**d) for name, d in self._read_state("daemons").items()}
        except TypeError:  # not written by this version: nothing we can safely signal
            return {}

    def _saved_config(self) -> dict[str, Any]:
        return self._read_state("config")

    def _config_dict(self) -> dict[str, Any]:
        return dict(asdict(self.config), root=str(self.config.root))

    def _save_state(self, daemons: dict[str, _Daemon]) -> None:
        state = {"config": self._config_dict(), "daemons": {name: asdict(d) for name, d in daemons.items()}}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    # ------------------------------------------------------------------ files
    def _check_binaries(self) -> None:
        needed = ["munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scancel", "scontrol"]
        if self.config.accounting:
            needed += ["slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db"]
        missing = [b for b in needed if not _which(b)]
        if missing:
            extra = " slurmdbd mariadb-server" if self.config.accounting else ""
            raise DevClusterError(f"missing programs: {', '.join(missing)}; install the Debian packages "
                                  f"slurmctld slurmd slurm-client munge{extra}")

    def _wipe_root(self) -> None:
        root = self.root
        if root.exists() and any(root.iterdir()) and not (root / MARKER).exists():
            raise DevClusterError(f"{root} is not empty and not a dev cluster directory; refusing to wipe it")
        for ancestor in root.parents:
            if ancestor.exists() and not ancestor.stat().st_mode & stat.S_IXOTH:
                raise DevClusterError(f"{ancestor} is not world-traversable (o+x), so munged's socket under {root} "
                                      "would be inaccessible: choose a root under /tmp")
        if root.exists():
            shutil.rmtree(root)
        for sub in ("", "log", "run", "munge", "dev", "spool/ctld", *(f"spool/{n}" for n in self.config.node_names)):
            (root / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(root / sub, 0o755)
        (root / MARKER).write_text("state directory of `lingjun-slurm dev-cluster`; wiped by every `up`\n")

    def _write_files(self) -> None:
        c, root = self.config, self.root
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        for i in range(c.gpus_per_node):  # gres needs character devices: these are /dev/null's
            os.mknod(root / "dev" / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        self.slurm_conf.write_text(self._slurm_conf())
        gres = "AutoDetect=off\n"
        if c.gpus_per_node:
            files = "gpu0" if c.gpus_per_node == 1 else f"gpu[0-{c.gpus_per_node - 1}]"
            gres += f"NodeName=node[1-{c.total_nodes}] Name=gpu File={root}/dev/{files}\n"
        (root / "gres.conf").write_text(gres)
        if c.accounting:
            dbd = root / "slurmdbd.conf"  # slurmdbd finds it beside $SLURM_CONF
            dbd.write_text("\n".join([
                "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}",
                f"DbdHost={socket.gethostname().split('.')[0]}", "DbdAddr=127.0.0.1", f"DbdPort={c.base_port + 2}",
                "SlurmUser=root", f"PidFile={root}/run/slurmdbd.pid", f"LogFile={self.log_dir}/slurmdbd.log",
                "DebugLevel=info", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
                f"StoragePort={c.base_port + 3}", "StorageUser=slurm", f"StoragePass={DB_PASSWORD}",
                "StorageLoc=slurm_acct_db"]) + "\n")
            os.chmod(dbd, 0o600)
        self.env_file()

    def _slurm_conf(self) -> str:
        c, root, host, last = self.config, self.root, socket.gethostname().split(".")[0], self.config.total_nodes
        lines = [
            "# Written by `lingjun-slurm dev-cluster up`; rewritten by every `up`.",
            f"ClusterName={c.cluster_name}", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={c.base_port}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={root}/spool/ctld", f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/run/slurmctld.pid", f"SlurmdPidFile={root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log", f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info", "MailProg=/bin/true",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill", "SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2",
            "ReturnToService=2", f"SlurmdTimeout={c.slurmd_timeout}", "KillWait=5", "MinJobAge=300", "MaxJobCount=20000", "JobRequeue=1",
            "EnforcePartLimits=ALL", "InactiveLimit=0", "Waittime=0",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={root}/jobcomp.log", "JobAcctGatherType=jobacct_gather/none",
            "GresTypes=gpu",
        ]
        if c.accounting:
            lines += ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
                      f"AccountingStoragePort={c.base_port + 2}", "AccountingStorageTRES=gres/gpu",
                      f"AccountingStoragePass={self.munge_socket}"]  # slurmdbd's munge socket
        gres = f" Gres=gpu:{c.gpus_per_node}" if c.gpus_per_node else ""
        lines += [
            f"NodeName=node[1-{last}] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{c.slurmd_port(1)}-"
            f"{c.slurmd_port(last)}] CPUs={c.cpus_per_node} RealMemory={c.memory_mb_per_node}{gres} State=UNKNOWN",
            f"PartitionName=cpu Nodes=node[1-{c.nodes}] Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=gpu Nodes=node[1-{c.nodes}] MaxTime=INFINITE State=UP",
        ]
        if c.extra_nodes:
            lines.append(f"PartitionName={c.extra_partition} Nodes=node[{c.nodes}-{last}] MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ start-up
    def _start_all(self, deadline: float) -> None:
        c, root, logs = self.config, self.root, self.log_dir
        daemons: dict[str, _Daemon] = {}

        def start(name: str, argv: list[str], ready: Callable[[], bool], log: str = "") -> None:
            daemons[name] = self._spawn(name, argv, logs / (log or f"{name}.log"))
            self._save_state(daemons)
            self._wait(name, ready, deadline, {name: daemons[name]})

        start("munged", ["munged", "--foreground", f"--socket={self.munge_socket}", "--num-threads=4",
                         f"--key-file={root}/munge/munge.key", f"--pid-file={root}/run/munged.pid",
                         f"--seed-file={root}/munge/munge.seed"], self.munge_socket.exists)
        if c.accounting:
            db = self._init_mariadb(deadline)
            start("mariadbd", ["mariadbd", "--no-defaults", "--user=mysql", f"--datadir={db}/data",
                               f"--socket={db}/mysqld.sock", f"--pid-file={db}/mariadbd.pid",
                               f"--port={c.base_port + 3}", "--bind-address=127.0.0.1", "--skip-name-resolve",
                               "--skip-log-bin",
                               f"--log-error={logs}/mariadbd.log", f"--init-file={db}/init.sql",
                               "--innodb-buffer-pool-size=512M", "--innodb-lock-wait-timeout=900"],
                  lambda: _port_open(c.base_port + 3))
            start("slurmdbd", ["slurmdbd", "-D"], lambda: _port_open(c.base_port + 2))
            self._client(["sacctmgr", "-i", "add", "cluster", c.cluster_name], logs / "slurmdbd.log")
        start("slurmctld", ["slurmctld", "-D", "-f", str(self.slurm_conf)], lambda: _port_open(c.base_port))
        for node in c.node_names:
            argv = ["slurmd", "-D", "-N", node, "-f", str(self.slurm_conf)]
            daemons[f"slurmd-{node}"] = self._spawn(f"slurmd-{node}", argv, logs / f"slurmd-{node}.log")
        self._save_state(daemons)
        self._wait("all nodes idle", lambda: [n["state"] for n in self._sinfo_nodes()] == ["idle"] * c.total_nodes,
                   deadline, daemons)
        # One job over every node: the first scheduling pass (~2-3 s) is then behind us, and srun works.
        job = self._client(["sbatch", "--parsable", "-J", "devcluster-probe", "-p", "cpu", f"-N{c.nodes}",
                            "--ntasks-per-node=1", "-t", "1", "-o", "/dev/null", "--wrap", "srun true"],
                           logs / "slurmctld.log").strip().split(";")[0]
        state = ""

        def probe_done() -> bool:
            nonlocal state
            out = self._client(["scontrol", "show", "job", "-o", job], logs / "slurmctld.log")
            state = next((f[9:] for f in out.split() if f.startswith("JobState=")), "")
            return state not in ACTIVE

        self._wait(f"probe job {job}", probe_done, deadline, daemons)
        if state != "COMPLETED":
            raise DevClusterError(f"probe job {job} ended {state}, not COMPLETED\n{_tail(logs / 'slurmctld.log')}\n"
                                  f"{_tail(logs / 'slurmd-node1.log')}")
        if c.accounting:  # the first job's full record reaches slurmdbd seconds late; later ones at once
            sacct = ["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobName,State"]
            self._wait(f"probe job {job} in sacct", lambda: self._client(sacct, logs / "slurmdbd.log").strip()
                       == "devcluster-probe|COMPLETED", deadline, daemons)

    def _init_mariadb(self, deadline: float) -> Path:
        """A fresh MariaDB data directory (owned by mysql) and the SQL that creates the slurm user."""
        db, log = self.root / "mysql", self.log_dir / "mariadb-install.log"
        db.mkdir()
        shutil.chown(db, "mysql", "mysql")
        (db / "init.sql").write_text(f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';\n"
                                     "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n")
        argv = ["mariadb-install-db", "--no-defaults", "--user=mysql", f"--datadir={db}/data", "--skip-test-db",
                "--skip-name-resolve", "--auth-root-authentication-method=socket"]
        try:
            with open(log, "wb") as out:
                rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    timeout=max(5.0, deadline - time.monotonic())).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevClusterError(f"mariadb-install-db failed: {exc}\n{_tail(log)}") from None
        if rc != 0:
            raise DevClusterError(f"mariadb-install-db failed (rc {rc})\n{_tail(log)}")
        (self.log_dir / "mariadbd.log").touch()  # mariadbd writes it as mysql
        shutil.chown(self.log_dir / "mariadbd.log", "mysql", "mysql")
        return db

    def _spawn(self, name: str, argv: list[str], log: Path) -> _Daemon:
        """Start a daemon in the foreground of a new session; its stdout/stderr go to log/NAME.out
        (munged's, which is its only log in the foreground, to log/munged.log)."""
        with open(log if name == "munged" else self.log_dir / f"{name}.out", "ab") as out:
            try:
                proc = subprocess.Popen([_which(argv[0]) or argv[0], *argv[1:]], stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **self.env),
                                        cwd=self.root, start_new_session=True)
            except OSError as exc:
                raise DevClusterError(f"cannot start {name}: {exc}") from None
        self._procs.append(proc)
        start = None
        for _ in range(200):
            start = _start_time(proc.pid)
            if start is not None or proc.poll() is not None:
                break
            time.sleep(0.01)
        return _Daemon(pid=proc.pid, start=start or "gone", log=str(log))

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float, watch: dict[str, _Daemon]) -> None:
        """Poll ready() until true; fail with a log tail if a watched daemon dies or time runs out."""
        while True:
            dead = next((name for name, d in watch.items() if not _alive(d)), None)
            if dead:
                raise DevClusterError(f"{dead} exited during start-up (log: {watch[dead].log})\n"
                                      f"{_tail(Path(watch[dead].log))}\n{_tail(self.log_dir / f'{dead}.out', 10)}")
            if ready():
                return
            if time.monotonic() > deadline:
                log = next(iter(watch.values())).log if len(watch) == 1 else str(self.log_dir / "slurmctld.log")
                raise DevClusterError(f"timed out waiting for {what} (log: {log})\n{_tail(Path(log))}")
            time.sleep(0.05)

    def _client(self, argv: list[str], log: Path, timeout: float = 30.0) -> str:
        """Run a Slurm client command against this cluster; its stdout, or DevClusterError."""
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **self.env),
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DevClusterError(f"{' '.join(argv[:3])} failed: {exc}\n{_tail(log)}") from None
        if proc.returncode != 0:
            raise DevClusterError(f"{' '.join(argv[:3])} failed (rc {proc.returncode}): "
                                  f"{proc.stderr.strip() or proc.stdout.strip()}\n{_tail(log)}")
        return proc.stdout

    def _sinfo_nodes(self) -> list[dict[str, Any]]:
        try:
            out = self._client(["sinfo", "-h", "-N", "-o", "%N|%T|%P"], self.log_dir / "slurmctld.log", timeout=10)
        except DevClusterError:
            return []
        nodes: dict[str, dict[str, Any]] = {}
        for line in out.splitlines():
            name, _, rest = line.strip().partition("|")
            state, _, part = rest.partition("|")
            node = nodes.setdefault(name, {"name": name, "state": state, "partitions": []})
            node["partitions"].append(part.rstrip("*"))
        return sorted(nodes.values(), key=lambda n: (len(n["name"]), n["name"]))

    # ------------------------------------------------------------------ shutdown
    def _signal(self, d: _Daemon, sig: signal.Signals) -> None:
        if _alive(d):
            try:
                os.kill(d.pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:
                raise DevClusterError(f"not allowed to signal PID {d.pid} ({d.log}): run as root") from None

    def _cancel_jobs(self) -> None:
        """scancel every job and wait (up to 15 s) until none runs, so no job outlives the cluster."""
        log = self.log_dir / "slurmctld.log"
        try:
            ids = self._client(["squeue", "-h", "-o", "%A"], log, timeout=10).split()
            if ids:
                self._client(["scancel", *ids], log, timeout=10)
            end = time.monotonic() + 15
            while ids and time.monotonic() < end:
                ids = self._client(["squeue", "-h", "-t", "CONFIGURING,RUNNING,COMPLETING", "-o", "%A"], log).split()
                time.sleep(0.2 if ids else 0)
        except DevClusterError:
            pass  # slurmctld is going away anyway; the steps are swept below

    def _kill_orphan_steps(self) -> None:
        """SIGKILL slurmstepd processes this cluster's slurmd left behind, and their children.
        Only those carrying this cluster's SLURM_CONF in their environment."""
        marker = f"SLURM_CONF={self.slurm_conf}".encode()
        parent: dict[int, int] = {}
        steps: list[int] = []
        for entry in Path("/proc").iterdir():
            fields = _proc_stat(entry.name) if entry.name.isdigit() else None
            if fields is None:
                continue
            parent[int(entry.name)] = int(fields[1])
            try:
                if (entry / "comm").read_text().strip() == "slurmstepd" and \
                        marker in (entry / "environ").read_bytes().split(b"\0"):
                    steps.append(int(entry.name))
            except OSError:
                continue
        victims = set(steps)
        for pid in parent:  # every process below a stray slurmstepd
            p = pid
            while p > 1 and p not in victims:
                p = parent.get(p, 0)
            if p > 1:
                victims.add(pid)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


__all__ = ["DEFAULT_ROOT", "DevCluster", "DevClusterConfig", "DevClusterError"]
