"""Issue 26 items 7, 8 and 9: bad paths and times are refused at validation naming file,
line and field; a spec from stdin or a FIFO (1 MiB bound); `checkpoint copy` to a bad target is one
line and never into itself; `submit --executor local --dry-run` says what the local executor runs;
a Ctrl-C while the run directory is written leaves none; the local executor's task bound; Slurm's
client without a cluster configuration gets the hint, exit 2."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from lingjun_slurm.spec.yamlpos import MAX_BYTES

from tests.checkpoint.conftest import ckpt, megatron_checkpoints  # noqa: F401  (real torch_dist checkpoints)
from tests.unit.test_fresh_install import cli as fresh_cli, fresh_env, unconfigured_slurm

PY = sys.executable


def run(*args: str, env: dict[str, str] | None = None, stdin: bytes | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`lingjun-slurm ARGS` in a fresh process; never a traceback or an internal error."""
    proc = subprocess.run([PY, "-m", "lingjun_slurm.cli", *args], input=stdin, capture_output=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    for text in (out.stdout, out.stderr):
        assert "Traceback" not in text and "internal error" not in text, text
    return out


def spec_text(workdir: str, time: str = "00:05:00", tasks: int = 1, nodes: int = 1) -> str:
    doc = {
        "version": 1,
        "run": {"name": "d", "workdir": workdir},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": time}},
        "container": {"runtime": "none"},
        "stages": {**{s: {"skip": True} for s in ("preprocess", "merge", "train", "checkpoint")},
                   "commands": [{"name": "one", "before": "preprocess", "command": "echo one > one.txt"},
                                {"name": "two", "after": "one", "command": "echo two",
                                 "resources": {"nodes": nodes, "tasks_per_node": tasks}}]},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write_spec(tmp_path: Path, workdir: str, **kw: object) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(spec_text(workdir, **kw))  # type: ignore[arg-type]
    return path


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), start=1) if needle in ln)


# --- item 7: bad workdirs ---------------------------------------------------------------------

def _bad_workdirs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (workdir, what the message must say)."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nothing-here")
    runs_file = tmp_path / "w-runs"
    runs_file.mkdir()
    (runs_file / "runs").write_text("x")
    logs_file = tmp_path / "w-logs"
    logs_file.mkdir()
    (logs_file / "logs").write_text("x")
    return {
        "file": (str(afile), f"{afile} is a file, not a directory"),
        "under a file": (f"{afile}/sub", f"{afile} is a file, so the workdir {afile}/sub cannot be a directory"),
        "dangling symlink": (str(dangling), "which does not exist (dangling)"),
        "root": ("/", "is the root directory /"),
        "proc": ("/proc/lingjun", "is under /proc, a kernel pseudo-filesystem"),
        "runs is a file": (str(runs_file), f"{runs_file}/runs is a file, not a directory"),
        "logs is a file": (str(logs_file), f"{logs_file}/logs is a file, not a directory"),
    }


@pytest.mark.parametrize("case", ["file", "under a file", "dangling symlink", "root", "proc", "runs is a file",
                                  "logs is a file"])
def test_a_bad_workdir_is_refused_naming_file_line_and_field(tmp_path: Path, case: str) -> None:
    workdir, said = _bad_workdirs(tmp_path)[case]
    spec = write_spec(tmp_path, workdir)
    where = f"{spec}:{line_of(spec, 'workdir:')}: run.workdir: "
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state")}
    for argv in (["validate", str(spec)], ["render", str(spec), "-o", str(tmp_path / "out")],
                 ["submit", str(spec), "--executor", "local"], ["submit", str(spec), "--executor", "local",
                                                                "--dry-run"]):
        proc = run(*argv, env=env)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert where in proc.stderr and said in proc.stderr, (argv, proc.stderr)
    assert not (tmp_path / "out").exists()


def test_a_fresh_workdir_is_fine(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, str(tmp_path / "not-yet" / "work"))
    assert run("validate", str(spec)).returncode == 0


# --- item 7: time limits -------------------------------------------------------------------------

@pytest.mark.parametrize("bad,unit,means", [("25:99:99", "minutes 99", "1-02:40:39"), ("1:60", "seconds 60", "00:02:00"),
                                            ("1-24", "hours 24", "2-00:00:00"), ("2-03:60:00", "minutes 60", "")])
def test_a_time_field_slurm_would_carry_is_refused(tmp_path: Path, bad: str, unit: str, means: str) -> None:
    spec = write_spec(tmp_path, str(tmp_path / "w"), time=bad)
    proc = run("validate", str(spec))
    assert proc.returncode == 2
    assert f"{spec}:{line_of(spec, 'time:')}: cluster.defaults.time: time limit {bad!r}: {unit} is not below" \
        in proc.stderr, proc.stderr
    assert means in proc.stderr


def test_slurm_itself_carries_what_is_refused() -> None:
    """Slurm 22.05's own time_str2mins (libslurmfull.so of Debian's slurm-client, through ctypes, as
    tests/unit/test_hostile_specs.py reads it): it accepts "25:99:99" and runs 26:40:39, minutes
    rounded up, the time the refusal names; the in-range spellings read as the tool reads them."""
    from lingjun_slurm.spec import models
    from tests.unit.test_hostile_specs import _libslurm

    lib = _libslurm()
    assert lib.time_str2mins(b"25:99:99") == -(-(25 * 3600 + 99 * 60 + 99) // 60) == 1601
    assert lib.time_str2mins(b"1-24") == 48 * 60 and lib.time_str2mins(b"1:60") == 2
    for text in ("90", "90:30", "48:00:00", "1-23:59:59", "2-00", "0:59"):
        assert lib.time_str2mins(text.encode()) == -(-models.check_time(text) // 60), text


@pytest.mark.parametrize("good", ["90", "90:30", "48:00:00", "1-23:59:59", "2-00", "0:59"])
def test_time_limits_with_fields_in_range_still_validate(tmp_path: Path, good: str) -> None:
    assert run("validate", str(write_spec(tmp_path, str(tmp_path / "w"), time=good))).returncode == 0


# --- item 7: a spec from stdin and from a FIFO -----------------------------------------------------

def test_a_spec_from_stdin(tmp_path: Path) -> None:
    text = spec_text(str(tmp_path / "w"))
    proc = run("validate", "-", stdin=text.encode())
    assert proc.returncode == 0 and proc.stdout.startswith("<stdin>: valid; stages: one -> two"), proc
    proc = run("render", "-", "-o", str(tmp_path / "out"), stdin=text.encode())
    assert proc.returncode == 0 and (tmp_path / "out" / "one.sbatch").is_file()
    bad = text.replace("profile: tcp", "profile: nope")
    proc = run("validate", "-", stdin=bad.encode())
    assert proc.returncode == 2 and f"<stdin>:{bad.splitlines().index('    profile: nope') + 1}: " \
                                   "cluster.network.profile: unknown network profile 'nope'" in proc.stderr


def test_submit_from_stdin_stores_the_bytes_read(tmp_path: Path) -> None:
    text = "# from a pipe\n" + spec_text(str(tmp_path / "w"))
    proc = run("submit", "-", "--executor", "local", stdin=text.encode(),
               env={"LINGJUN_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "w" / "runs").iterdir()
    assert (run_dir / "spec.yaml").read_text() == text


def test_stdin_is_bounded_by_the_1_mib_limit(tmp_path: Path) -> None:
    proc = subprocess.run(f"yes '# padding' | {PY} -m lingjun_slurm.cli.main validate -", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == f"  <stdin>: <root>: more than {MAX_BYTES} bytes (1 MiB): a spec is a few KB"


def test_a_spec_from_process_substitution_and_a_named_fifo(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, str(tmp_path / "w"))
    proc = subprocess.run(["bash", "-c", f'{PY} -m lingjun_slurm.cli.main validate <(cat "$1")', "-", str(spec)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and ": valid; stages: one -> two" in proc.stdout, proc.stderr
    proc = subprocess.run(["bash", "-c", f'{PY} -m lingjun_slurm.cli.main plan <(cat "$1")', "-", str(spec)],
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "is a FIFO" not in proc.stderr, proc.stderr
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)

    def writer() -> None:
        with open(fifo, "w") as f:  # opens once the reader has: as `cat spec > fifo` would
            f.write(spec.read_text())

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    proc = run("validate", str(fifo))
    thread.join(5)
    assert proc.returncode == 0 and proc.stdout.startswith(f"{fifo}: valid"), proc.stderr
    # an endless writer is cut at the bound, not waited for
    proc = subprocess.run(["bash", "-c", f"{PY} -m lingjun_slurm.cli.main validate <(yes '# x')"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "more than 1048576 bytes (1 MiB)" in proc.stderr


def test_devices_and_directories_are_still_refused(tmp_path: Path) -> None:
    proc = run("validate", "/dev/zero")
    assert proc.returncode == 2 and "is a character device, not a spec file" in proc.stderr
    proc = run("validate", "-", stdin=None)  # stdin of a test run: /dev/null (a character device) or a pipe
    assert proc.returncode == 2


# --- item 7: checkpoint copy ------------------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_checkpoint_copy_to_an_unsupported_or_unreachable_target_is_one_line(ckpt: Path, tmp_path: Path) -> None:  # noqa: F811
    proc = run("checkpoint", "copy", str(ckpt), "nope://bucket/x")
    assert proc.returncode == 2 and proc.stderr == "copy target nope://bucket/x: Protocol not known: nope\n"
    pytest.importorskip("paramiko")
    url = f"sftp://127.0.0.1:{_closed_port()}/backup"
    proc = run("checkpoint", "copy", str(ckpt), url)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"copy target {url}: cannot connect: "), proc.stderr
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = run("checkpoint", "copy", str(ckpt), f"{afile}/backup")
    assert proc.returncode == 1 and proc.stderr == f"copy target {afile}/backup: cannot write to it: Not a directory: " \
                                                   f"{afile}/backup\n"


def test_checkpoint_copy_into_itself_is_refused(ckpt: Path) -> None:  # noqa: F811
    before = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*"))
    for target in (str(ckpt), f"file://{ckpt}/", str(ckpt / "backup"), str(ckpt / "iter_0000030"),
                   f"file://{ckpt}/iter_0000030/more"):
        proc = run("checkpoint", "copy", str(ckpt), target)
        assert proc.returncode == 2, (target, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(f"copy target {target} ") and (
            "is the checkpoint directory itself" in proc.stderr or "is inside the checkpoint directory" in proc.stderr)
    assert sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*")) == before


# --- item 8: the local executor's dry run and task bound --------------------------------------------

def test_local_dry_run_says_what_the_local_executor_runs(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, str(tmp_path / "w"), tasks=2)
    proc = run("submit", str(spec), "--executor", "local", "--dry-run",
               env={"LINGJUN_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    assert "sbatch --" not in proc.stdout and "scontrol" not in proc.stdout, proc.stdout
    lines = proc.stdout.splitlines()
    assert "with the local executor on this machine" in lines[0]
    run_dir = lines[0].split("run directory ")[1].split("/ (")[0]
    assert f"  1. one              bash {run_dir}/one.sbatch   # first; 1 task" in lines
    assert f"  2. two              bash {run_dir}/two.sbatch   # after one; 2 tasks " \
           "(python3 -m lingjun_slurm.executors.launch)" in lines
    assert any(ln.startswith("  environment: yours without SLURM_*, plus PATH=") and "LINGJUN_EXECUTOR=local" in ln
               for ln in lines)
    assert not (tmp_path / "w").exists()


def test_the_dry_run_names_every_variable_the_runner_sets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.executors import local

    spec = write_spec(tmp_path, str(tmp_path / "w"), tasks=2)
    proc = run("submit", str(spec), "--executor", "local", "--detach",
               env={"LINGJUN_STATE_DIR": str(tmp_path / "state")})
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "w" / "runs").iterdir()
    runner = local.LocalRunner(str(run_dir), lock=False)
    monkeypatch.setattr(os, "environ", {})
    rec = runner.manifest.stages[1]
    assert set(runner._env(rec, runner.state.tasks[1])) <= set(local.JOB_ENV)


def test_local_executor_refuses_more_tasks_than_the_machine_runs(tmp_path: Path) -> None:
    from lingjun_slurm.executors.local import max_tasks

    nodes = 125
    spec = write_spec(tmp_path, str(tmp_path / "w"), nodes=nodes, tasks=1024)
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state")}
    proc = run("submit", str(spec), "--executor", "local", env=env)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"{spec}:{line_of(spec, 'tasks_per_node:')}: stages.commands[1].resources."
                                  f"tasks_per_node: stage two runs 125 x 1024 = 128000 tasks"), proc.stderr
    assert f"at most {max_tasks()} here" in proc.stderr and "--force" in proc.stderr
    assert not (tmp_path / "w").exists()
    proc = run("submit", str(spec), "--executor", "local", "--dry-run", env=env)
    assert proc.returncode == 0 and proc.stderr.startswith("warning: ") and "128000 tasks" in proc.stderr
    ok = write_spec(tmp_path, str(tmp_path / "w2"), tasks=max_tasks())
    assert run("submit", str(ok), "--executor", "local", "--dry-run", env=env).stderr == ""


# --- item 8: a Ctrl-C while the run directory is written ---------------------------------------------

def test_an_interrupted_write_leaves_no_run_directory(tmp_path: Path) -> None:
    from lingjun_slurm.spec import load_spec
    from lingjun_slurm.submit import prepare, write_run_dir
    from lingjun_slurm.transport import LocalTransport

    class CtrlCOnThirdFile(LocalTransport):
        writes = 0

        def write_atomic(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
            self.writes += 1
            if self.writes == 3:
                raise KeyboardInterrupt
            super().write_atomic(path, data, mode)

    prep = prepare(load_spec(write_spec(tmp_path, str(tmp_path / "w"))), run_id="d-1", executor="local")
    with pytest.raises(KeyboardInterrupt):
        write_run_dir(CtrlCOnThirdFile(), prep, new=True)
    assert os.listdir(tmp_path / "w" / "runs") == []  # neither the run directory nor its temporary one
    write_run_dir(LocalTransport(), prep, new=True)  # the same run id is free: nothing half-written took it
    assert sorted(os.listdir(tmp_path / "w" / "runs")) == ["d-1"]
    assert (tmp_path / "w" / "runs" / "d-1" / "spec.yaml").is_file()
    from lingjun_slurm.common.errors import UsageError
    with pytest.raises(UsageError, match="already exists"):
        write_run_dir(LocalTransport(), prep, new=True)


# --- item 9: Slurm's client without a cluster --------------------------------------------------------

def train_spec(tmp_path: Path) -> Path:
    """examples/tiny-gpt.yaml (doctor needs a train stage) with its workdir in tmp_path."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-gpt.yaml").read_text())
    doc["run"]["workdir"] = str(tmp_path / "w")
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_submit_and_doctor_with_slurm_conf_naming_no_file_get_the_hint(tmp_path: Path) -> None:
    from lingjun_slurm.slurm.client import UNCONFIGURED_HINT

    sbatch = shutil.which("sbatch")
    if sbatch is None:
        pytest.skip("needs Slurm's commands installed (sbatch)")
    spec = write_spec(tmp_path, str(tmp_path / "w"))
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "SLURM_CONF": str(tmp_path / "nowhere" / "slurm.conf")}
    for argv in (["submit", str(spec)], ["doctor", str(train_spec(tmp_path))]):
        proc = run(*argv, env=env, timeout=30)  # no 60 s of Slurm's retries
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr == f"SLURM_CONF={tmp_path}/nowhere/slurm.conf: no such file\n{UNCONFIGURED_HINT}\n"
    assert not (tmp_path / "w").exists()


@unconfigured_slurm
def test_submit_and_doctor_with_slurm_installed_but_not_configured(tmp_path: Path) -> None:
    """The README's apt line: slurm-client, no slurm.conf, no DNS SRV record: the default executor
    (auto: sbatch is on PATH) is Slurm, whose own words (res_nsearch, DNS SRV lookup) stay hidden."""
    from lingjun_slurm.slurm.client import UNCONFIGURED_HINT

    spec = write_spec(tmp_path, str(tmp_path / "w"))
    for argv in (["submit", str(spec)], ["doctor", str(train_spec(tmp_path))]):
        proc = fresh_cli(tmp_path, fresh_env(tmp_path, slurm=True), *argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stderr == f"scontrol: fatal: Could not establish a configuration source\n{UNCONFIGURED_HINT}\n"
        assert "DNS SRV" not in proc.stderr and "res_nsearch" not in proc.stderr
    assert "--executor local" in UNCONFIGURED_HINT
    assert not (tmp_path / "w").exists()


def test_the_run_directory_is_renamed_on_the_remote_side_over_sftp(ssh_server: object, tmp_path: Path) -> None:
    """--host: the same write_run_dir through the real sshd on 127.0.0.1 (tests/ssh/fixtures.py):
    the temporary directory and the rename are on the host; a Ctrl-C leaves nothing there."""
    from lingjun_slurm.spec import load_spec
    from lingjun_slurm.submit import prepare, write_run_dir

    prep = prepare(load_spec(write_spec(tmp_path, str(tmp_path / "w"))), run_id="d-remote", executor="slurm")
    t = ssh_server.transport()  # type: ignore[attr-defined]
    try:
        real_write = t.write_atomic
        calls: list[str] = []

        def ctrl_c_on_third(path: str, data: bytes | str, mode: int = 0o644) -> None:
            calls.append(path)
            if len(calls) == 3:
                raise KeyboardInterrupt
            real_write(path, data, mode)

        t.write_atomic = ctrl_c_on_third
        with pytest.raises(KeyboardInterrupt):
            write_run_dir(t, prep, new=True)
        assert "/.d-remote.tmp-" in calls[0]  # written beside the run directory, not into it
        assert os.listdir(tmp_path / "w" / "runs") == []
        t.write_atomic = real_write
        write_run_dir(t, prep, new=True)
        assert os.listdir(tmp_path / "w" / "runs") == ["d-remote"]
        assert (tmp_path / "w" / "runs" / "d-remote" / "plan.json").is_file()
    finally:
        t.close()
