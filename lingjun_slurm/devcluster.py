"""A real single-host Slurm cluster on 127.0.0.1, for tests and for trying pipelines locally.

A private munged, optionally MariaDB + slurmdbd (so sacct works), one slurmctld and one slurmd
per node (node1..nodeN, each on its own port) run from one state directory, each in the
foreground of its own session, so their PIDs are known exactly; they are stopped by those PIDs
(checked against /proc start times), never by name. Needs root (SlurmUser=root) and Debian's
slurmctld slurmd slurm-client munge (+ slurmdbd mariadb-server). Stdlib only; docs/dev-cluster.md.

Configured like production by default: the settings of cyclecloud-slurm's
azure-slurm-install/templates/slurm.conf.template and cgroup.conf.template (github
Azure/cyclecloud-slurm @049346f6b1cee4db11fd6a6166a58e32f5d006f5) that can run on one host:
proctrack/cgroup, task/affinity,task/cgroup, ConstrainCores/RAMSpace/Devices, CR_Core_Memory,
DefMemPerCPU, PrologFlags=alloc. docs/dev-cluster.md lists every setting and its source.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .common.errors import LingjunError

DEFAULT_ROOT = Path("/tmp/lingjun-devcluster")
MARKER = ".lingjun-devcluster"  # only a directory holding this (or an empty one) is ever wiped
DB_PASSWORD = "lingjun-dev"  # a throw-away MariaDB listening on 127.0.0.1 only
ACTIVE = ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING")
# Job ids start at base_port * JOB_ID_BLOCK (FirstJobId): Slurm 22.05's cgroup/v1 names a job's
# cgroup CONTROLLER/slurm_<NodeName>/uid_<uid>/job_<id> (src/common/cgroup.c:338 prepend
# "/slurm_%n" with MULTIPLE_SLURMD; src/plugins/cgroup/v1/xcgroup.c:423-497), so two clusters on
# one host, both with node1, would share a job's cgroup if their job ids met. Distinct base ports
# give distinct id blocks (a cluster must submit JOB_ID_BLOCK x port gap jobs to reach the next's).
JOB_ID_BLOCK = 1000
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The v1 controllers Slurm 22.05 uses: freezer (proctrack/cgroup), cpuset (ConstrainCores),
# memory (ConstrainRAMSpace), devices (ConstrainDevices), cpuacct (jobacct_gather/cgroup only);
# src/plugins/cgroup/v1/cgroup_v1.c g_cg_name.
CGROUP_CONTROLLERS = ("freezer", "cpuset", "memory", "devices", "cpuacct")
NEEDED_CONTROLLERS = ("freezer", "cpuset", "memory", "devices")
TASK_BINDINGS = ("cores", "threads", "sockets")  # TaskPluginParam=autobind=..., slurm.conf(5) 22.05
# Fake GPUs: character devices with NVIDIA's major (195, /dev/nvidiaN, Linux devices.txt) and minor
# N, as gres.conf File= on a GPU node. Not /dev/null's 1:3: with ConstrainDevices, Slurm denies
# an unallocated GPU by its major:minor (task/cgroup), which would deny /dev/null in the job.
FAKE_GPU_MAJOR = 195
# One slurmd per node, each on its own port (slurmd_port): 128 nodes use ports base+200..base+327.
MAX_NODES = 128


def cgroup_problem(root: Path = CGROUP_ROOT) -> str | None:
    """Why this host cannot run the cgroup settings, or None: Slurm 22.05's cgroup/v1 needs the
    v1 controllers mounted read-write at /sys/fs/cgroup/<name> (xcgroup.c xcgroup_ns_is_available
    reads <mount>/tasks). cgroup v2 (unified) hosts are not supported by the dev cluster."""
    if (root / "cgroup.controllers").exists():
        return f"{root} is cgroup v2 (unified); the dev cluster's cgroup settings need cgroup v1"
    for name in NEEDED_CONTROLLERS:
        path = root / name
        if not (path / "tasks").exists():
            return f"cgroup v1 controller {name} is not mounted at {path}"
        try:
            readonly = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except OSError as exc:
            return f"cannot stat {path}: {exc}"
        if readonly or not os.access(path, os.W_OK):
            return f"cgroup v1 controller {name} at {path} is read-only"
    return None


def usable_cpus() -> int:
    """CPUs this process may run on (what binding and cpusets can use)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
    # RealMemory; DefMemPerCPU = memory_mb_per_node // cpus_per_node per partition, as
    # cyclecloud-slurm's azure-slurm/slurmcc/cli.py _partitions (def_mem_per_cpu = memory // cpus).
    # With cgroups, a job's memory cgroup is limited to what it was allocated (ConstrainRAMSpace).
    memory_mb_per_node: int = 16000
    # Nodes after node1..nodeN that are only in partition extra_partition, together with nodeN:
    # kept out of cpu/gpu so a test may drain one without disturbing other tests' jobs.
    extra_nodes: int = 0
    extra_partition: str = "health"
    # Seconds slurmctld waits for an unresponsive slurmd before it marks the node DOWN and fails its
    # jobs (SlurmdTimeout, slurm.conf; Slurm's default 300): the fault bench loses nodes on purpose.
    slurmd_timeout: int = 300
    # Production-like process tracking and confinement (cyclecloud-slurm): proctrack/cgroup,
    # TaskPlugin=task/affinity,task/cgroup and cgroup.conf ConstrainCores/RAMSpace/Devices; needs
    # cgroup v1 mounted read-write (cgroup_problem()). False: proctrack/linuxproc and task/affinity
    # alone (tasks are bound, nothing is confined) for hosts without writable cgroups.
    cgroups: bool = True
    # TaskPluginParam=autobind=<this> (cores, threads or sockets) as on sites that pin tasks; None:
    # Slurm's default (auto binding only when the step's CPUs match its tasks exactly).
    task_binding: str | None = None
    # Test-speed timers instead of Slurm's defaults (which cyclecloud-slurm keeps): KillWait=5
    # (30), cred_expire=5 (120: a requeued job waits that long), sched_interval=2 (60),
    # bf_interval=2 (30), batch_sched_delay=0 (3).
    fast_timers: bool = False
    # ThreadsPerCore of the node lines (1 or 2): cyclecloud-slurm writes the VM's vCPUs per physical
    # core there by default (azure-slurm/slurmcc/cli.py, partition.py use_pcpu), so with
    # CR_Core_Memory a 1-CPU task holds a whole core, 2 CPUs, and their memory.
    threads_per_core: int = 1
    # MaxArraySize (slurm.conf): the largest array index is one less. Slurm's default is 1001
    # (src/common/read_config.h DEFAULT_MAX_ARRAY_SIZE, slurm-22-05-8-1), too small for a 1,024-task
    # preprocess array; read_config.c (_validate_and_set_defaults) rejects more than 4000001, and
    # slurm.conf(5) wants MaxJobCount (20000 here) much larger.
    max_array_size: int = 4001
    # Features= of nodes (slurm.conf NodeName lines): node name -> its features, e.g.
    # {"node3": ("ib", "fast")}; a job asks for them with --constraint.
    node_features: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root = Path(self.root).absolute()
        if not 2 <= self.nodes <= MAX_NODES:
            raise DevClusterError(f"nodes must be 2..{MAX_NODES}, got {self.nodes}")
        if not 0 <= self.extra_nodes <= MAX_NODES - self.nodes:
            raise DevClusterError(f"extra_nodes must be 0..{MAX_NODES - self.nodes} ({MAX_NODES} nodes at most), "
                                  f"got {self.extra_nodes}")
        if not self.extra_partition.isalnum() or self.extra_partition in ("cpu", "gpu"):
            raise DevClusterError(f"extra_partition must be a name other than cpu/gpu, got {self.extra_partition!r}")
        if not 1 <= self.cpus_per_node <= 64 or not 0 <= self.gpus_per_node <= 16:
            raise DevClusterError("cpus_per_node must be 1..64 and gpus_per_node 0..16")
        if not 5 <= self.slurmd_timeout <= 65533:
            raise DevClusterError(f"slurmd_timeout must be 5..65533 s, got {self.slurmd_timeout}")
        if not 1024 <= self.base_port <= 65235:
            raise DevClusterError(f"base_port must be 1024..65235, got {self.base_port}")
        if self.task_binding is not None and self.task_binding not in TASK_BINDINGS:
            raise DevClusterError(f"task_binding must be one of {', '.join(TASK_BINDINGS)} or None, "
                                  f"got {self.task_binding!r}")
        if self.threads_per_core not in (1, 2) or self.cpus_per_node % self.threads_per_core:
            raise DevClusterError(f"threads_per_core must be 1 or 2 and divide cpus_per_node, got {self.threads_per_core}")
        if not 0 <= self.max_array_size <= 4000001:
            raise DevClusterError(f"max_array_size must be 0..4000001 (slurm.conf MaxArraySize), "
                                  f"got {self.max_array_size}")
        self.node_features = {str(n): tuple(str(f) for f in fs) for n, fs in dict(self.node_features).items()}
        for name, feats in self.node_features.items():
            if name not in self.node_names:
                raise DevClusterError(f"node_features names {name!r}, not a node of this cluster "
                                      f"(node1..node{self.total_nodes})")
            bad = [f for f in feats if not f or not all(ch.isalnum() or ch in "_-." for ch in f)]
            if bad:
                raise DevClusterError(f"node_features of {name}: {bad[0]!r} is not a feature name "
                                      "(letters, digits, _-.)")
        if not 256 <= self.memory_mb_per_node <= 1 << 24:
            raise DevClusterError(f"memory_mb_per_node must be 256..{1 << 24}, got {self.memory_mb_per_node}")

    @property
    def first_job_id(self) -> int:
        """FirstJobId: a block of job ids of its own per base port (see JOB_ID_BLOCK)."""
        return self.base_port * JOB_ID_BLOCK

    @property
    def def_mem_per_cpu(self) -> int:
        return self.memory_mb_per_node // self.cpus_per_node

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
        self._check_host()
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
        then slurmdbd, then MariaDB and munged), SIGKILL stragglers, then remove the cluster's
        cgroups (_clean_cgroups). Idempotent."""
        live = {name: d for name, d in self._load_state().items() if _alive(d)}
        jobs: set[int] = set()
        if "slurmctld" in live:
            jobs = self._cancel_jobs()
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
        jobs |= self._kill_orphan_steps()
        self._clean_cgroups(jobs)
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
        # Through JSON, as _saved_config reads it back (node_features' tuples become lists).
        return dict(json.loads(json.dumps(asdict(self.config), default=str)), root=str(self.config.root))

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

    def _check_host(self) -> None:
        c = self.config
        if c.cgroups:
            problem = cgroup_problem()
            if problem:
                raise DevClusterError(f"{problem}: the production-like cgroup settings cannot run here; "
                                      "start without them (--no-cgroups, DevClusterConfig(cgroups=False))")
        cpus = usable_cpus()
        if (c.cgroups or c.task_binding) and c.cpus_per_node > cpus:
            # Slurm maps a job's abstract CPUs onto the real ones (xcpuinfo_abs_to_mac): CPUs beyond
            # the real cores cannot be bound or put in a cpuset.
            raise DevClusterError(f"cpus_per_node={c.cpus_per_node} exceeds the {cpus} CPUs of this host: "
                                  "with cgroups or task binding each node must have at most the real CPUs")

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
        for sub in ("", "log", "run", "munge", "dev", "prolog.d", "epilog.d", "spool/ctld",
                    *(f"spool/{n}" for n in self.config.node_names)):
            (root / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(root / sub, 0o755)
        (root / MARKER).write_text("state directory of `lingjun-slurm dev-cluster`; wiped by every `up`\n")

    def _write_files(self) -> None:
        c, root = self.config, self.root
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        for i in range(c.gpus_per_node):  # gres needs character devices: see FAKE_GPU_MAJOR
            os.mknod(root / "dev" / f"gpu{i}", 0o666 | stat.S_IFCHR, os.makedev(FAKE_GPU_MAJOR, i))
        # Prolog/Epilog are globs over prolog.d/epilog.d as in cyclecloud-slurm, where those always
        # hold scripts (install.py installs 90-imex_prolog.sh/90-imex_epilog.sh). Slurm 22.05 fails
        # the job and drains the node when a glob matches nothing ("prolog: Unable to create list
        # of paths"): each gets one script that does nothing.
        for kind in ("prolog", "epilog"):
            script = root / f"{kind}.d" / f"00-dev-cluster-{kind}.sh"
            script.write_text(f"#!/bin/sh\n# {kind} of the dev cluster: nothing to do (docs/dev-cluster.md)\nexit 0\n")
            os.chmod(script, 0o755)
        self.slurm_conf.write_text(self._slurm_conf())
        if c.cgroups:  # beside slurm.conf, where Slurm looks for it (get_extra_conf_path)
            (root / "cgroup.conf").write_text(self._cgroup_conf())
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

    def _cgroup_conf(self) -> str:
        """cyclecloud-slurm azure-slurm-install/templates/cgroup.conf.template @049346f6:
        ConstrainCores, ConstrainRamSpace, ConstrainDevices = yes (ConstrainSwapSpace commented
        out there). CgroupPlugin is pinned to cgroup/v1 (theirs: the default, autodetect, which
        picks v1 on this kind of host too: src/common/cgroup.c autodetect_cgroup_version)."""
        return "\n".join([
            "# Written by `lingjun-slurm dev-cluster up`; docs/dev-cluster.md.",
            "CgroupPlugin=cgroup/v1", "ConstrainCores=yes", "ConstrainRAMSpace=yes", "ConstrainDevices=yes"]) + "\n"

    def _slurm_conf(self) -> str:
        """slurm.conf. Lines marked CC are cyclecloud-slurm's (azure-slurm-install/templates/
        slurm.conf.template @049346f6, line numbers there); docs/dev-cluster.md has the rest."""
        c, root, host, last = self.config, self.root, socket.gethostname().split(".")[0], self.config.total_nodes
        expire = ",cred_expire=5" if c.fast_timers else ""
        sched = ",batch_sched_delay=0,sched_interval=2,bf_interval=2" if c.fast_timers else ""
        if c.cgroups:
            track = ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/affinity,task/cgroup"]  # CC 2, 11
        else:
            track = ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity"]
        if c.task_binding:
            track.append(f"TaskPluginParam=autobind={c.task_binding}")
        lines = [
            "# Written by `lingjun-slurm dev-cluster up`; rewritten by every `up`. docs/dev-cluster.md.",
            f"ClusterName={c.cluster_name}", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={c.base_port}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}{expire}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={root}/spool/ctld", f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/run/slurmctld.pid", f"SlurmdPidFile={root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log", f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info", "MailProg=/bin/true",
            *track, "MpiDefault=none", "SwitchType=switch/none",  # CC 1, 10
            "PropagateResourceLimits=ALL", "DisableRootJobs=NO",  # CC 4, 27
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory",  # CC 13, 15
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill", f"SchedulerParameters=max_switch_wait=24:00:00{sched}",  # CC 12, 52
            "LaunchParameters=use_interactive_step",  # CC 28, templates/slurm.txt default
            f"Prolog={root}/prolog.d/*", f"Epilog={root}/epilog.d/*", "PrologFlags=alloc",  # CC 36-42
            "TreeWidth=16", "PrivateData=cloud", "SlurmctldParameters=idle_on_node_suspend",  # CC 43, 34, 24
            "SlurmctldTimeout=30",  # CC 48; not CC 44 ReconfigFlags=KeepPowerSaveSettings: 22.05 rejects it
            "ReturnToService=2", f"SlurmdTimeout={c.slurmd_timeout}", "MinJobAge=300", "MaxJobCount=20000",
            f"FirstJobId={c.first_job_id}", "JobRequeue=1", "EnforcePartLimits=ALL", "InactiveLimit=0", "Waittime=0",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={root}/jobcomp.log",
            "JobAcctGatherType=jobacct_gather/none", "GresTypes=gpu",  # CC 21, 14
        ]
        if c.fast_timers:
            lines.append("KillWait=5")
        if c.accounting:
            lines += ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1",
                      f"AccountingStoragePort={c.base_port + 2}", "AccountingStorageTRES=gres/gpu",
                      f"AccountingStoragePass={self.munge_socket}"]  # slurmdbd's munge socket
        gres = f" Gres=gpu:{c.gpus_per_node}" if c.gpus_per_node else ""
        mem = f" DefMemPerCPU={c.def_mem_per_cpu}"  # cyclecloud-slurm azure-slurm/slurmcc/cli.py _partitions
        smt = (f" Sockets=1 CoresPerSocket={c.cpus_per_node // c.threads_per_core} ThreadsPerCore={c.threads_per_core}"
               if c.threads_per_core > 1 else "")
        lines.append(f"MaxArraySize={c.max_array_size}")
        # One NodeName line per run of consecutive nodes with the same Features (a node is defined
        # once; its Port range walks with the names: slurm.conf(5) "Port").
        runs: list[tuple[int, int, tuple[str, ...]]] = []
        for i in range(1, last + 1):
            feats = c.node_features.get(f"node{i}", ())
            if runs and runs[-1][2] == feats:
                runs[-1] = (runs[-1][0], i, feats)
            else:
                runs.append((i, i, feats))
        for first, end, feats in runs:
            names = f"node{first}" if first == end else f"node[{first}-{end}]"
            port = str(c.slurmd_port(first)) if first == end else f"[{c.slurmd_port(first)}-{c.slurmd_port(end)}]"
            feature = f" Features={','.join(feats)}" if feats else ""
            lines.append(f"NodeName={names} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={c.cpus_per_node}{smt} RealMemory={c.memory_mb_per_node}{gres}{feature} State=UNKNOWN")
        lines += [
            f"PartitionName=cpu Nodes=node[1-{c.nodes}] Default=YES{mem} MaxTime=INFINITE State=UP",
            f"PartitionName=gpu Nodes=node[1-{c.nodes}]{mem} MaxTime=INFINITE State=UP",
        ]
        if c.extra_nodes:
            lines.append(f"PartitionName={c.extra_partition} Nodes=node[{c.nodes}-{last}]{mem} MaxTime=INFINITE State=UP")
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

    def _cancel_jobs(self) -> set[int]:
        """scancel every job and wait (up to 15 s) until none runs, so no job outlives the cluster.
        The ids of the jobs it found (their cgroups are checked after the daemons stop)."""
        log = self.log_dir / "slurmctld.log"
        found: set[int] = set()
        try:
            ids = self._client(["squeue", "-h", "-o", "%A"], log, timeout=10).split()
            found = {int(i) for i in ids if i.isdigit()}
            if ids:
                self._client(["scancel", *ids], log, timeout=10)
            end = time.monotonic() + 15
            while ids and time.monotonic() < end:
                ids = self._client(["squeue", "-h", "-t", "CONFIGURING,RUNNING,COMPLETING", "-o", "%A"], log).split()
                time.sleep(0.2 if ids else 0)
        except DevClusterError:
            pass  # slurmctld is going away anyway; the steps are swept below
        return found

    def _kill_orphan_steps(self) -> set[int]:
        """SIGKILL slurmstepd processes this cluster's slurmd left behind, and their children.
        Only those carrying this cluster's SLURM_CONF in their environment. The job ids of those
        steps (their title is "slurmstepd: [JOB.STEP]")."""
        marker = f"SLURM_CONF={self.slurm_conf}".encode()
        parent: dict[int, int] = {}
        steps: list[int] = []
        jobs: set[int] = set()
        for entry in Path("/proc").iterdir():
            fields = _proc_stat(entry.name) if entry.name.isdigit() else None
            if fields is None:
                continue
            parent[int(entry.name)] = int(fields[1])
            try:
                if (entry / "comm").read_text().strip() == "slurmstepd" and \
                        marker in (entry / "environ").read_bytes().split(b"\0"):
                    steps.append(int(entry.name))
                    title = (entry / "cmdline").read_bytes().decode(errors="replace")
                    if "[" in title and title.split("[", 1)[1].split(".")[0].isdigit():
                        jobs.add(int(title.split("[", 1)[1].split(".")[0]))
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
        return jobs

    def _finished_jobs(self) -> set[int]:
        """Every job id in jobcomp.log (one line per finished job, accounting or not)."""
        try:
            text = (self.root / "jobcomp.log").read_text(errors="replace")
        except OSError:
            return set()
        return {int(f[6:]) for f in text.split() if f.startswith("JobId=") and f[6:].isdigit()}

    def _clean_cgroups(self, jobs: set[int]) -> None:
        """Remove what Slurm's cgroup/v1 left of this cluster under /sys/fs/cgroup/CONTROLLER/
        slurm_<node>/uid_<uid>/job_<id>: the job cgroups of this cluster's jobs (those it found
        running, those of stray steps, those in jobcomp.log), killing any process still in one.
        slurm_<node> and its uid_* (Slurm never removes slurm_<node>) go too unless another live
        slurmd has the same node name (another dev cluster on this host: they are shared)."""
        if not self.config.cgroups:
            return
        jobs = jobs | self._finished_jobs()
        names = set(self.config.node_names)
        dirs = [CGROUP_ROOT / ctl / f"slurm_{node}" for ctl in CGROUP_CONTROLLERS for node in sorted(names)]
        dirs = [d for d in dirs if d.is_dir()]
        ours = [job for d in dirs for uid in d.glob("uid_*") for job in uid.glob("job_*")
                if job.name[4:].isdigit() and int(job.name[4:]) in jobs]
        end = time.monotonic() + 5
        while True:
            pids = {pid for job in ours for pid in _cgroup_pids(job)}
            if not pids or time.monotonic() > end:
                break
            for job in ours:  # a frozen (suspended) task cannot die
                _write_quietly(job / "freezer.state", "THAWED")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for job in ours:
            _rmdir_tree(job)
        shared = _live_slurmd_node_names() & names
        for d in dirs:
            if d.name[len("slurm_"):] in shared:
                continue
            for uid in d.glob("uid_*"):
                _rmdir_quietly(uid)
            _rmdir_quietly(d)


def _cgroup_pids(cg: Path) -> set[int]:
    """Every process in a v1 cgroup and the cgroups below it."""
    pids: set[int] = set()
    for procs in cg.rglob("cgroup.procs"):
        try:
            pids.update(int(p) for p in procs.read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def _write_quietly(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass


def _rmdir_quietly(path: Path) -> None:
    try:
        path.rmdir()  # a cgroup directory goes with rmdir alone; it fails while busy
    except OSError:
        pass


def _rmdir_tree(cg: Path) -> None:
    """rmdir a cgroup and the cgroups below it, deepest first."""
    for sub in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _rmdir_quietly(sub)
    _rmdir_quietly(cg)


def _live_slurmd_node_names() -> set[str]:
    """Node names (-N NAME) of the slurmd processes alive on this host."""
    names: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "slurmd":
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if _start_time(int(entry.name)) is None:
            continue
        names.update(argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "-N")
    return names


__all__ = ["CGROUP_ROOT", "DEFAULT_ROOT", "FAKE_GPU_MAJOR", "JOB_ID_BLOCK", "DevCluster", "DevClusterConfig",
           "DevClusterError", "cgroup_problem", "usable_cpus"]
