"""Remote runs end to end: the real CLI (a fresh process each time) on "a laptop" submits through the
test sshd on 127.0.0.1 (tests/ssh, key-only) to the test Slurm cluster (tests/cluster).

The "laptop" has no Slurm: its PATH starts with sbatch/squeue/sacct/scontrol/scancel stand-ins that
record any call and fail, so every Slurm command that works ran over SSH. The remote work directory
(/tmp/lingjun-remote-<pid>/...) is not the laptop's cwd or state directory, so files found there were
uploaded. Each command's SSH logins are counted in sshd's log: one per command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
import yaml

from tests.integration.helpers import ENDED, chain_spec, submitted_run_id

pytestmark = pytest.mark.slurm

PY = sys.executable
SLURM_PROGS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "srun", "sinfo")


@dataclass
class Laptop:
    ssh: Any  # tests.ssh.fixtures.SSHServer, in front of the test cluster
    root: Path
    workdir: Path  # on "the cluster" (same filesystem here, a different tree)
    cwd: Path
    env: dict[str, str]
    outputs: list[str] = field(default_factory=list)

    def cli(self, *args: str, check: Optional[int] = 0, env: Optional[dict[str, str]] = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([PY, "-m", "lingjun_slurm.cli", *args], cwd=self.cwd, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)
        self.outputs += [proc.stdout, proc.stderr]
        if check is not None:
            assert proc.returncode == check, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def counted(self, *args: str, log: Optional[Path] = None, **kw: Any) -> tuple[subprocess.CompletedProcess[str], int]:
        """Run the CLI; also return how many SSH logins the server accepted meanwhile."""
        before = self.ssh.accepted(log)
        proc = self.cli(*args, **kw)
        time.sleep(0.2)  # sshd writes its log line asynchronously
        return proc, self.ssh.accepted(log) - before

    def status(self, run_id: str, *extra: str) -> dict[str, dict[str, Any]]:
        doc = json.loads(self.cli("status", run_id, "--json", *extra).stdout)
        return {s["name"]: s for s in doc["runs"][0]["stages"]}

    def wait(self, run_id: str, pred: Callable[[dict[str, dict[str, Any]]], bool],
             timeout: float = 90) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        last: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            last = self.status(run_id)
            if pred(last):
                return last
            time.sleep(0.5)
        raise AssertionError(f"timed out; last status: {json.dumps(last, indent=1)}")

    def local_slurm_calls(self) -> str:
        marker = self.root / "local-slurm-calls"
        return marker.read_text() if marker.exists() else ""

    def secrets(self) -> list[str]:
        """Private key material and the passphrase: none of it may appear anywhere."""
        found = [self.ssh.client_key, self.ssh.wrong_key, self.ssh.encrypted_key]
        lines = [ln for k in found for ln in Path(k).read_text().splitlines() if ln and "-----" not in ln]
        from tests.ssh.fixtures import PASSPHRASE
        return lines + ["PRIVATE KEY", PASSPHRASE]

    def assert_no_secrets(self, *trees: Path) -> None:
        texts = list(self.outputs)
        for tree in (self.root / "state", self.workdir, *trees):
            for path in (tree.rglob("*") if tree.is_dir() else []):
                if path.is_file() and path.suffix not in (".whl",):
                    texts.append(path.read_text(errors="replace"))
        for secret in self.secrets():
            for text in texts:
                assert secret not in text, f"secret material leaked: {secret[:12]}..."


def all_ended(stages: dict[str, dict[str, Any]]) -> bool:
    return all(s["state"] in ENDED for s in stages.values())


@pytest.fixture
def laptop(ssh_slurm: Any, tmp_path: Path) -> Iterator[Laptop]:
    fake_bin = tmp_path / "no-slurm-here"
    fake_bin.mkdir()
    marker = tmp_path / "local-slurm-calls"
    for prog in SLURM_PROGS:
        stub = fake_bin / prog
        stub.write_text(f"#!/bin/sh\necho {prog} \"$@\" >> {marker}\necho 'no Slurm on the laptop' >&2\nexit 99\n")
        stub.chmod(0o755)
    workdir = Path(f"/tmp/lingjun-remote-{os.getpid()}") / tmp_path.name
    cwd = tmp_path / "laptop"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SSH_AUTH_SOCK", "LINGJUN"))}
    env.update(ssh_slurm.env(), LINGJUN_STATE_DIR=str(tmp_path / "state"),
               LINGJUN_CLUSTERS=str(tmp_path / "clusters.yaml"),
               PATH=f"{fake_bin}{os.pathsep}{os.path.dirname(PY)}{os.pathsep}{os.environ.get('PATH', '')}")
    yield Laptop(ssh_slurm, tmp_path, workdir, cwd, env)
    shutil.rmtree(workdir, ignore_errors=True)
    try:
        workdir.parent.rmdir()  # the last test's cleanup removes /tmp/lingjun-remote-<pid>
    except OSError:
        pass


def spec(laptop: Laptop, name: str, commands: list[dict[str, Any]], workdir: Optional[Path] = None) -> Path:
    specs = laptop.root / "specs"
    specs.mkdir(exist_ok=True)
    return chain_spec(specs / f"{name}.yaml", workdir or laptop.workdir, commands, name=name)


def test_submit_status_logs_over_one_connection_each(laptop: Laptop) -> None:
    path = spec(laptop, "remote", [{"name": "a", "command": "echo stage a on $(hostname)"},
                                   {"name": "b", "command": 'echo "b ran in $PWD"'}])
    proc, logins = laptop.counted("submit", str(path), "--host", "lingjun-test")
    run_id = submitted_run_id(proc.stdout)
    assert logins == 1, f"submit opened {logins} SSH connections"
    assert f"on lingjun-test ({2} stages" in proc.stdout
    # The run directory was uploaded to the remote workdir; nothing landed in the laptop's cwd.
    run_dir = laptop.workdir / "runs" / run_id
    for name in ("manifest.json", "spec.yaml", "spec.sha256", "a.sbatch", "b.sbatch", "plan.json", "submit.sh"):
        assert (run_dir / name).is_file(), name
    assert list(laptop.cwd.iterdir()) == []
    assert laptop.local_slurm_calls() == ""  # sbatch ran over SSH, not here
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["transport"] == {"kind": "ssh", "host": "lingjun-test"}
    assert manifest["run_dir"] == str(run_dir) and manifest["cluster"]["name"] == "lingjun-test"
    # ... and the record is kept here too.
    mirror = laptop.root / "state" / "runs" / run_id
    assert json.loads((mirror / "manifest.json").read_text())["stages"][0]["job_ids"] == manifest["stages"][0]["job_ids"]
    assert (mirror / "spec.yaml").read_text() == path.read_text() and (mirror / "b.sbatch").is_file()

    stages = laptop.wait(run_id, all_ended)
    assert [s["state"] for s in stages.values()] == ["COMPLETED", "COMPLETED"], stages
    proc, logins = laptop.counted("status", run_id)
    assert logins == 1 and "COMPLETED" in proc.stdout and "(slurm on lingjun-test)" in proc.stdout
    assert json.loads((mirror / "status.json").read_text())["run"]["stages"][1]["state"] == "COMPLETED"
    proc, logins = laptop.counted("logs", run_id, "b")
    assert logins == 1 and f"b ran in {run_dir}" in proc.stdout
    # The report of a remote run (issue 16 item 4): read over one SSH connection, written here.
    out = laptop.root / "report"
    proc, logins = laptop.counted("report", run_id, "-o", str(out))
    assert logins == 1 and str(out / "index.html") in proc.stdout and (out / "timeline.png").is_file()
    doc = json.loads((out / "report-data.json").read_text())
    assert doc["run"]["host"] == "lingjun-test" and doc["run"]["run_dir"] == str(run_dir)
    assert [(s["name"], s["state"]) for s in doc["stages"]] == [("a", "COMPLETED"), ("b", "COMPLETED")]
    assert all(s["attempts"] and s["attempts"][-1]["exit_code"] == 0 for s in doc["stages"])
    assert doc["checkpoints"]["readable"] is False and doc["metrics"]["train"] == []
    assert list(laptop.cwd.iterdir()) == []
    listed = laptop.cli("list").stdout  # offline: the index
    assert run_id in listed and "lingjun-test" in listed
    # Forgotten here (index entry and local copy), then found again from its directory on the cluster.
    laptop.cli("forget", run_id)
    assert not mirror.exists() and (run_dir / "manifest.json").is_file()
    proc = laptop.cli("status", str(run_dir), "--host", "lingjun-test")
    assert f"added run {run_id}" in proc.stderr and "COMPLETED" in proc.stdout
    assert (mirror / "manifest.json").is_file() and run_id in laptop.cli("list", "--host", "lingjun-test").stdout
    laptop.assert_no_secrets()


def test_follow_cancel_and_resubmit_a_remote_run(laptop: Laptop) -> None:
    go, go_last = laptop.root / "go", laptop.root / "go-last"
    path = spec(laptop, "follow", [
        {"name": "first", "command": "true"},
        {"name": "slow", "command": f"for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.3; done; "
                                    f"for i in $(seq 600); do test -e {go} && echo slow done && exit 0; sleep 0.2; done; "
                                    "exit 9"},
        {"name": "last", "command": f"for i in $(seq 600); do test -e {go_last} && exit 0; sleep 0.2; done; exit 9"},
    ])
    run_id = submitted_run_id(laptop.cli("submit", str(path), "--host", "lingjun-test").stdout)
    laptop.wait(run_id, lambda s: s["slow"]["state"] == "RUNNING")
    before = laptop.ssh.accepted()
    follower = subprocess.Popen([PY, "-m", "lingjun_slurm.cli", "logs", run_id, "slow", "--follow"], cwd=laptop.cwd,
                                env=laptop.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert follower.stdout is not None
    seen = ""
    deadline = time.monotonic() + 60
    while "tick 6" not in seen and time.monotonic() < deadline:
        seen += follower.stdout.readline()
    assert "tick 1" in seen and "tick 6" in seen, seen  # streamed while the job still runs
    go.touch()
    rest, err = follower.communicate(timeout=60)  # ends by itself once the job has ended
    laptop.outputs += [seen + rest, err]
    assert follower.returncode == 0, err
    assert "slow done" in seen + rest
    time.sleep(0.2)
    assert laptop.ssh.accepted() - before == 1, "logs --follow used more than one connection"

    laptop.wait(run_id, lambda s: s["last"]["state"] == "RUNNING")
    proc, logins = laptop.counted("cancel", run_id, "last")
    assert logins == 1 and "cancelled run" in proc.stdout
    stages = laptop.wait(run_id, all_ended)
    assert stages["last"]["state"] == "CANCELLED" and stages["slow"]["state"] == "COMPLETED"
    old = stages["last"]["job_ids"]
    go_last.touch()
    proc, logins = laptop.counted("resubmit", run_id, "--from", "last")
    assert logins == 1 and "resubmitted run" in proc.stdout
    stages = laptop.wait(run_id, all_ended)
    assert stages["last"]["state"] == "COMPLETED" and stages["last"]["job_ids"] != old
    run_dir = laptop.workdir / "runs" / run_id
    remote = json.loads((run_dir / "manifest.json").read_text())
    assert [e["event"] for e in remote["events"]] == ["submit", "cancel", "resubmit"]
    mirror = json.loads((laptop.root / "state" / "runs" / run_id / "manifest.json").read_text())
    assert mirror["events"] == remote["events"] and mirror["stages"] == remote["stages"]
    assert laptop.local_slurm_calls() == ""
    laptop.assert_no_secrets()


def test_proxyjump_through_the_second_sshd(laptop: Laptop) -> None:
    path = spec(laptop, "jump", [{"name": "a", "command": "echo via the jump host"}])
    jump_before = laptop.ssh.accepted(laptop.ssh.jump_log)
    proc, logins = laptop.counted("submit", str(path), "--host", "lingjun-via-jump")
    run_id = submitted_run_id(proc.stdout)
    time.sleep(0.2)
    assert logins == 1 and laptop.ssh.accepted(laptop.ssh.jump_log) - jump_before == 1
    assert "direct-tcpip" in laptop.ssh.jump_log.read_text() or "forward" in laptop.ssh.jump_log.read_text().lower()
    stages = laptop.wait(run_id, all_ended)
    assert stages["a"]["state"] == "COMPLETED"
    assert "via the jump host" in laptop.cli("logs", run_id, "a").stdout
    manifest = json.loads((laptop.workdir / "runs" / run_id / "manifest.json").read_text())
    assert manifest["transport"]["host"] == "lingjun-via-jump"
    laptop.assert_no_secrets()


def test_unknown_host_key_is_refused_then_accepted_and_recorded(laptop: Laptop) -> None:
    known = laptop.root / "known_hosts"
    known.write_text("")
    cfg = laptop.root / "ssh_config_fresh"  # the fixture's config names its own known_hosts: not here
    cfg.write_text(f"Host lingjun-test\n  HostName 127.0.0.1\n  Port {laptop.ssh.port}\n  User root\n"
                   f"  IdentityFile {laptop.ssh.client_key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n")
    env = {"LINGJUN_KNOWN_HOSTS": str(known), "LINGJUN_SSH_CONFIG": str(cfg)}
    path = spec(laptop, "hostkey", [{"name": "a", "command": "true"}])
    proc = laptop.cli("submit", str(path), "--host", "lingjun-test", env=env, check=5)
    assert "--accept-new-host-key" in proc.stderr and "127.0.0.1" in proc.stderr
    assert not (laptop.workdir / "runs").exists()  # nothing was written before the refusal
    proc = laptop.cli("submit", str(path), "--host", "lingjun-test", "--accept-new-host-key", env=env)
    run_id = submitted_run_id(proc.stdout)
    assert f"[127.0.0.1]:{laptop.ssh.port} ssh-ed25519 " in known.read_text()
    # Recorded: later commands need no option.
    laptop.cli("status", run_id, env=env)
    # A different key for the same host is refused even with the option (possible man in the middle).
    jump_key = Path(f"{laptop.ssh.jump_host_key}.pub").read_text().split()[1]
    known.write_text(f"[127.0.0.1]:{laptop.ssh.port} ssh-ed25519 {jump_key}\n")
    proc = laptop.cli("status", run_id, "--accept-new-host-key", env=env, check=5)
    assert str(known) in proc.stderr  # names the file (and line) of the recorded key
    laptop.assert_no_secrets()


def test_wrong_key_exits_4_and_says_so(laptop: Laptop) -> None:
    cfg = laptop.root / "ssh_config_wrong"
    cfg.write_text(f"Host wrongkey\n  HostName 127.0.0.1\n  Port {laptop.ssh.port}\n  User root\n"
                   f"  IdentityFile {laptop.ssh.wrong_key}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {laptop.ssh.known_hosts}\n")
    path = spec(laptop, "wrongkey", [{"name": "a", "command": "true"}])
    proc = laptop.cli("submit", str(path), "--host", "wrongkey", env={"LINGJUN_SSH_CONFIG": str(cfg)}, check=4)
    assert "auth" in proc.stderr.lower() and str(laptop.ssh.wrong_key) in proc.stderr
    assert not (laptop.workdir / "runs").exists()
    laptop.assert_no_secrets()


def test_unreachable_exits_3_and_status_shows_the_local_copy(laptop: Laptop) -> None:
    from tests.ssh.fixtures import free_ports

    closed = free_ports(1, first=18022)[0]
    path = spec(laptop, "unreach", [{"name": "a", "command": "true"}])
    proc = laptop.cli("submit", str(path), "--host", f"root@127.0.0.1:{closed}", check=3)
    assert f"127.0.0.1:{closed}" in proc.stderr
    run_id = submitted_run_id(laptop.cli("submit", str(path), "--host", "lingjun-test").stdout)
    laptop.wait(run_id, all_ended)  # status.json is saved by every status that reached the host
    proc = laptop.cli("status", run_id, "--host", f"root@127.0.0.1:{closed}", check=3)
    assert "STALE" in proc.stdout and "COMPLETED" in proc.stdout and f"127.0.0.1:{closed}" in proc.stderr
    doc = json.loads(laptop.cli("status", run_id, "--json", "--host", f"root@127.0.0.1:{closed}", check=3).stdout)
    assert doc["runs"][0]["stale"] is True and doc["runs"][0]["stages"][0]["state"] == "COMPLETED"
    assert run_id in laptop.cli("list").stdout  # list never connects
    laptop.assert_no_secrets()


def test_cluster_from_clusters_yaml_and_precedence(laptop: Laptop) -> None:
    cluster_wd = laptop.workdir / "cw"
    clusters = Path(laptop.env["LINGJUN_CLUSTERS"])
    clusters.write_text(yaml.safe_dump({"clusters": {"testc": {
        "host": "lingjun-test", "workdir": str(cluster_wd), "partition": "gpu", "network_profile": "tcp"}}}))
    bare = laptop.root / "bare.yaml"  # no workdir, partition or network profile: all from clusters.yaml
    bare.write_text(yaml.safe_dump({
        "version": 1, "run": {"name": "bare"}, "container": {"runtime": "none"},
        "cluster": {"defaults": {"time": "00:05:00"}},
        "stages": {**{s: {"skip": True} for s in ("preprocess", "merge", "train", "checkpoint")},
                   "commands": [{"name": "a", "command": "echo on $SLURM_JOB_PARTITION", "before": "preprocess"}]}}))
    proc = laptop.cli("submit", str(bare), "--cluster", "testc")
    run_id = submitted_run_id(proc.stdout)
    run_dir = cluster_wd / "runs" / run_id
    assert "#SBATCH --partition=gpu" in (run_dir / "a.sbatch").read_text()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["defaults"] == {"cluster": "testc", "applied": {
        "run.workdir": str(cluster_wd), "cluster.defaults.partition": "gpu", "cluster.network.profile": "tcp"}}
    assert laptop.wait(run_id, all_ended)["a"]["state"] == "COMPLETED"
    assert "on gpu" in laptop.cli("logs", run_id, "a").stdout

    # The spec wins over clusters.yaml: its partition, its workdir.
    own = laptop.root / "own.yaml"
    doc = yaml.safe_load(bare.read_text())
    doc["run"]["workdir"] = str(laptop.workdir / "own")
    doc["cluster"]["defaults"]["partition"] = "cpu"
    own.write_text(yaml.safe_dump(doc))
    run2 = submitted_run_id(laptop.cli("submit", str(own), "--cluster", "testc").stdout)
    script = (laptop.workdir / "own" / "runs" / run2 / "a.sbatch").read_text()
    assert "#SBATCH --partition=cpu" in script
    # The command line wins over clusters.yaml: --host replaces the cluster's host (defaults still apply).
    run3 = submitted_run_id(laptop.cli("submit", str(bare), "--cluster", "testc", "--host", "lingjun-via-jump").stdout)
    m3 = json.loads((cluster_wd / "runs" / run3 / "manifest.json").read_text())
    assert m3["transport"]["host"] == "lingjun-via-jump" and m3["defaults"]["applied"]["cluster.defaults.partition"] == "gpu"
    # resubmit re-renders with the defaults recorded at submit, not today's clusters.yaml.
    clusters.write_text(yaml.safe_dump({"clusters": {"testc": {"host": "lingjun-test", "partition": "debug"}}}))
    laptop.wait(run_id, all_ended)
    laptop.wait(run3, all_ended)  # run3 shares run_id's workdir: its lock is held while it is queued
    laptop.cli("resubmit", run_id, "--from", "a")
    assert "#SBATCH --partition=gpu" in (run_dir / "a.sbatch").read_text()
    stages = laptop.wait(run_id, all_ended)
    assert stages["a"]["state"] == "COMPLETED"
    listed = json.loads(laptop.cli("list", "--json", "--cluster", "testc").stdout)["runs"]
    assert {r["run_id"] for r in listed} == {run_id, run2, run3}
    for r in (run2, run3):
        laptop.wait(r, all_ended)
    laptop.assert_no_secrets()


def test_shipped_code_reaches_the_remote_run_directory(laptop: Laptop) -> None:
    from lingjun_slurm.bundle import ship
    from lingjun_slurm.transport import LocalTransport

    path = laptop.root / "ship.yaml"  # a built-in stage, so lingjun_slurm is shipped
    path.write_text(yaml.safe_dump({
        "version": 1, "run": {"name": "ship", "workdir": str(laptop.workdir)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
        "container": {"runtime": "none"},
        "data": {"inputs": [str(laptop.root / "none-*.jsonl")], "tokenizer": {"type": "null", "vocab_size": 512}},
        "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}}}))
    proc, logins = laptop.counted("submit", str(path), "--host", "lingjun-test")
    run_id = submitted_run_id(proc.stdout)
    assert logins == 1
    run_dir = laptop.workdir / "runs" / run_id
    manifest = json.loads((run_dir / "manifest.json").read_text())
    wheel = manifest["shipped"][0]
    assert wheel.startswith("lingjun_slurm-") and (run_dir / "wheels" / wheel).is_file()
    # Unpacked on the host: the same tree a local ship writes.
    reference = laptop.root / "reference"
    ship(LocalTransport(), str(reference), [])
    def tree(site: Path) -> list[str]:
        # a stage that already started imports from the site and leaves __pycache__ behind
        return sorted(p.relative_to(site).as_posix() for p in site.rglob("*")
                      if p.is_file() and "__pycache__" not in p.parts)

    got, want = tree(run_dir / "site"), tree(reference / "site")
    assert got == want and len(got) > 50
    assert (run_dir / "site" / "lingjun_slurm" / "cli/main.py").read_bytes() == (
        reference / "site" / "lingjun_slurm" / "cli/main.py").read_bytes()
    laptop.cli("cancel", run_id)
    laptop.wait(run_id, all_ended)
    laptop.assert_no_secrets()


def test_shipping_over_ssh_is_one_upload_and_one_command(laptop: Laptop, capsys: pytest.CaptureFixture[str]) -> None:
    """bundle.ship over SSH (the default, as submit does) writes the wheel once and unpacks it with
    exactly one remote `python3 -c UNPACK` command; file by file (the fallback, several round trips
    per file: `python bench/ssh.py` measures both) writes the same tree with no command. Counted
    through the transport: its history (commands) and its write_atomic calls (SFTP writes)."""
    from lingjun_slurm.bundle import UNPACK, ship
    from lingjun_slurm.transport import LocalTransport
    from lingjun_slurm.transport.ssh import SSHTransport

    class Counting(SSHTransport):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.writes: list[str] = []

        def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
            self.writes.append(path)
            super().write_atomic(path, data, mode)

    def tree(where: Path) -> list[str]:
        return sorted(p.relative_to(where).as_posix() for p in where.rglob("*") if p.is_file())

    reference = laptop.root / "reference"
    ship(LocalTransport(), str(reference), [])
    want = tree(reference)
    assert len(want) > 50
    with Counting("lingjun-test", ssh_config=laptop.ssh.ssh_config, known_hosts=laptop.ssh.known_hosts) as t:
        one = laptop.workdir / "ship-one"
        wheel = ship(t, str(one), [])[0]
        assert [argv[:3] for argv in t.history] == [("python3", "-c", UNPACK)], t.history
        assert t.history[0][3:] == (f"{one}/wheels/{wheel}", f"{one}/site", str(len(want) - 1))
        assert t.writes == [f"{one}/wheels/{wheel}"]
        assert "one by one" not in capsys.readouterr().err  # no fallback note
        assert tree(one) == want
        assert (one / "site" / "lingjun_slurm" / "cli/main.py").read_bytes() == (
            reference / "site" / "lingjun_slurm" / "cli/main.py").read_bytes()

        t.history.clear()
        t.writes.clear()
        files = laptop.workdir / "ship-files"
        ship(t, str(files), [], unpack_remotely=False)
        assert t.history == [] and len(t.writes) == len(want)  # the wheel, then every file of the site
        assert tree(files) == want


def test_nccl_test_on_a_cluster_from_clusters_yaml(laptop: Laptop) -> None:
    """nccl-test --cluster: profile and partition from clusters.yaml, outputs under its workdir, the chart
    drawn here and uploaded; the nccl-tests binaries are the replaying stand-in of tests/integration."""
    from tests.unit.test_nccltests_report import need_matplotlib

    need_matplotlib()
    standin = str(Path(__file__).resolve().parents[1] / "fixtures" / "nccl" / "standin")
    Path(laptop.env["LINGJUN_CLUSTERS"]).write_text(yaml.safe_dump({"clusters": {"testn": {
        "host": "lingjun-test", "workdir": str(laptop.workdir), "partition": "cpu", "network_profile": "tcp"}}}))
    proc, logins = laptop.counted("nccl-test", "--cluster", "testn", "--nodes", "2", "--gpus-per-node", "0",
                                  "--no-container", "--tests-dir", standin, "--mpi", "pmi2", "--time", "5",
                                  "--ops", "all_reduce", "--poll-interval", "0.5", timeout=180)
    assert logins == 1
    assert "nccl-tests on 2 nodes x 1 task (no GPUs), profile tcp" in proc.stdout and "(COMPLETED)" in proc.stdout
    out = next((laptop.workdir / "nccl-tests").iterdir())
    assert f"chart: lingjun-test:{out}/busbw.png" in proc.stdout
    assert (out / "busbw.png").read_bytes()[:4] == b"\x89PNG" and json.loads((out / "report.json").read_text())["ok"]
    assert "#SBATCH --partition=cpu" in (out / "nccl-test.sbatch").read_text()
    assert list(laptop.cwd.iterdir()) == [] and laptop.local_slurm_calls() == ""
    # --report reads the remote outputs again (no Slurm).
    proc = laptop.cli("nccl-test", "--report", str(out), "--host", "lingjun-test", "--profile", "tcp", "--no-chart")
    assert "all_reduce" in proc.stdout and "busbw" in proc.stdout
    proc = laptop.cli("nccl-test", "--report", "relative/dir", "--host", "lingjun-test", check=2)
    assert "absolute paths on the cluster" in proc.stderr
    laptop.assert_no_secrets()


def test_sbatch_failing_at_stage_two_over_ssh_rolls_back_on_the_cluster(laptop: Laptop) -> None:
    """All-or-nothing over SSH: the held job of stage one is cancelled with scancel on the login node, the
    remote manifest and the local copy both say "failed", and no stage ever ran."""
    ran = laptop.root / "ran"
    path = spec(laptop, "rollback", [
        {"name": "one", "command": f"touch {ran}"},
        {"name": "two", "command": "true", "resources": {"partition": "nosuchpartition"}},
        {"name": "three", "command": f"touch {ran}"},
    ])
    proc, logins = laptop.counted("submit", str(path), "--host", "lingjun-test", check=1)
    assert logins == 1
    assert "failed at stage two" in proc.stderr and "invalid partition" in proc.stderr.lower()
    assert "cancelled the 1 held job(s)" in proc.stderr
    run_dir = next((laptop.workdir / "runs").iterdir())
    remote = json.loads((run_dir / "manifest.json").read_text())
    assert remote["state"] == "failed" and remote["events"][-1]["event"] == "submit-failed"
    mirror = json.loads((laptop.root / "state" / "runs" / run_dir.name / "manifest.json").read_text())
    assert mirror["state"] == "failed" and mirror["events"] == remote["events"]
    stages = laptop.status(run_dir.name)
    assert stages["one"]["state"] == "CANCELLED" and stages["two"]["state"] == "NOT_SUBMITTED"
    time.sleep(3)  # a released job would have been scheduled by now
    assert not ran.exists() and laptop.local_slurm_calls() == ""


def test_a_bad_ship_wheel_leaves_nothing_on_the_cluster_or_here(laptop: Laptop) -> None:
    """run.ship_wheels is read and checked before the run directory is written: exit 2, and neither a
    half-written run directory on the cluster nor an orphaned local copy (that `forget` could not reach)."""
    not_zip = laptop.root / "broken-1.0-py3-none-any.whl"
    not_zip.write_text("not a zip")
    for wheel, words in ((laptop.root / "missing-1.0-py3-none-any.whl", "is not a wheel file"),
                         (not_zip, "not a wheel (a zip file)")):
        path = laptop.root / "badwheel.yaml"  # a built-in stage, so code is shipped
        path.write_text(yaml.safe_dump({
            "version": 1, "run": {"name": "badwheel", "workdir": str(laptop.workdir), "ship_wheels": [str(wheel)]},
            "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
            "container": {"runtime": "none"},
            "data": {"inputs": [str(laptop.root / "none-*.jsonl")], "tokenizer": {"type": "null", "vocab_size": 512}},
            "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}}}))
        proc = laptop.cli("submit", str(path), "--host", "lingjun-test", check=2)
        assert words in proc.stderr and wheel.name in proc.stderr
        assert not (laptop.workdir / "runs").exists() or list((laptop.workdir / "runs").iterdir()) == []
        assert not (laptop.root / "state" / "runs").exists() or list((laptop.root / "state" / "runs").iterdir()) == []
    assert laptop.local_slurm_calls() == ""

