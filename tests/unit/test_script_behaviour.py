"""Rendered scripts behave as documented when run with Slurm's commands stubbed.

The stubs model the Slurm client tools' documented behaviour: `sbatch --parsable` prints
"jobid[;cluster]", `scancel --signal=TERM JOBID` signals the job's steps (not the batch
shell), `scontrol show node` prints NodeAddr=. The real-cluster versions of these checks
run against Debian's slurmctld/slurmd with the submit work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lingjun_slurm.cli.main import main
from tests.conftest import REPO
from tests.unit.test_hostile import fake_image_record

TINY = REPO / "examples" / "tiny-gpt.yaml"


def stub(bindir: Path, name: str, body: str) -> None:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def workdir(tmp_path: Path) -> Path:
    """The run's workdir: tiny-gpt's, moved under the test's own temporary directory."""
    return tmp_path / "work"


def render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """tiny-gpt rendered with every path under tmp_path (never the real /tmp/lingjun-slurm)."""
    out = tmp_path / "out"
    spec = tmp_path / "tiny-gpt.yaml"
    spec.write_text(TINY.read_text().replace("/tmp/lingjun-slurm/tiny-gpt", str(workdir(tmp_path))))
    with pytest.raises(SystemExit) as info:
        main(["render", str(spec), "-o", str(out)])
        raise SystemExit(0)
    capsys.readouterr()
    assert not info.value.code
    return out


def env_for(tmp_path: Path, out: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "LOG": str(tmp_path / "log"),
            "LINGJUN_RUN_DIR": str(out), "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node1"}


def test_submit_rolls_back_when_an_sbatch_fails(tmp_path: Path, capsys) -> None:
    out = render(tmp_path, capsys)
    bindir = tmp_path / "bin"
    stub(bindir, "sbatch", 'n=$(( $(cat "$LOG.n" 2>/dev/null || echo 100) + 1 )); echo "$n" > "$LOG.n"\n'
                           'echo "sbatch $*" >> "$LOG"\n'
                           '[ "$n" -eq 103 ] && { echo "sbatch: error: invalid partition specified" >&2; exit 1; }\n'
                           'echo "$n;cluster"\n')
    stub(bindir, "scancel", 'echo "scancel $*" >> "$LOG"\n')
    stub(bindir, "scontrol", 'echo "scontrol $*" >> "$LOG"\n')
    proc = subprocess.run(["bash", str(out / "submit.sh")], env=env_for(tmp_path, out), capture_output=True,
                          text=True)
    log = (tmp_path / "log").read_text().splitlines()
    assert proc.returncode != 0
    assert "invalid partition" in proc.stderr
    assert "scancel 101 102" in log, log
    assert not any(line.startswith("scontrol release") for line in log)
    assert sum(line.startswith("sbatch") for line in log) == 3  # nothing after the failure


def test_submit_releases_the_whole_chain(tmp_path: Path, capsys) -> None:
    out = render(tmp_path, capsys)
    bindir = tmp_path / "bin"
    stub(bindir, "sbatch", 'n=$(( $(cat "$LOG.n" 2>/dev/null || echo 100) + 1 )); echo "$n" > "$LOG.n"\n'
                           'echo "sbatch $*" >> "$LOG"\necho "$n;cluster"\n')
    stub(bindir, "scontrol", 'echo "scontrol $*" >> "$LOG"\n')
    proc = subprocess.run(["bash", str(out / "submit.sh")], env=env_for(tmp_path, out), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert all("--parsable --hold" in line for line in log if line.startswith("sbatch"))
    assert "sbatch --parsable --hold --dependency=afterok:102 merge.sbatch" in log
    assert log[-1] == "scontrol release 101,102,103,104,105"


def test_time_limit_signal_saves_and_requeues(tmp_path: Path, capsys) -> None:
    """USR1 to the batch shell -> SIGTERM to the steps via scancel -> wait -> scontrol requeue."""
    out = render(tmp_path, capsys)
    bindir = tmp_path / "bin"
    # The trap is set before the pid is published: the test signals only once the pid exists.
    stub(bindir, "srun", 'trap \'echo "srun task got TERM, saving" >> "$LOG"; exit 0\' TERM\necho $$ > "$LOG.srun"\n'
                         'for _ in $(seq 300); do sleep 0.1; done\nexit 3\n')
    stub(bindir, "scancel", 'echo "scancel $*" >> "$LOG"\n'
                            '[ "$1" = "--signal=TERM" ] && kill -TERM "$(cat "$LOG.srun")"\n')
    stub(bindir, "scontrol", 'echo "scontrol $*" >> "$LOG"\ncase "$1 $2" in\n  "show hostnames") echo node1 ;;\n'
                             '  "show node") echo "NodeName=node1 NodeAddr=127.0.0.1" ;;\nesac\n')
    proc = subprocess.Popen(["bash", str(out / "train.sbatch")], env=env_for(tmp_path, out),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for _ in range(100):
        if (tmp_path / "log.srun").exists():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    stdout, _ = proc.communicate(timeout=30)
    log = (tmp_path / "log").read_text().splitlines()
    assert proc.returncode == 0, stdout
    assert "scancel --signal=TERM 5" in log and "srun task got TERM, saving" in log
    assert "scontrol requeue 5" in log
    assert "MASTER_ADDR=127.0.0.1" in stdout and "requeueing (restart 1 of 3)" in stdout


def test_no_requeue_when_training_is_complete(tmp_path: Path, capsys) -> None:
    out = render(tmp_path, capsys)
    ckpt = workdir(tmp_path) / "checkpoints"
    bindir = tmp_path / "bin"
    stub(bindir, "srun", 'exit 0\n')
    stub(bindir, "scontrol", 'echo "scontrol $*" >> "$LOG"\n')
    ckpt.mkdir(parents=True, exist_ok=True)
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    tracker.write_text("300\n")
    proc = subprocess.run(["bash", str(out / "train.sbatch")], env=env_for(tmp_path, out), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "requeue" not in (tmp_path / "log").read_text()


def test_run_id_with_newline_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["render", str(TINY), "--stage", "train", "--run-id", "evil\n"])
    assert info.value.code == 2


@pytest.mark.parametrize("before,after,step_rc,requeued", [
    (None, None, 1, False),   # failed at once (bad config): retrying would fail the same way
    (None, "10", 1, True),    # failed after saving iteration 10: progress, so retry from there
    ("10", "10", 137, True),  # a task was killed (SIGKILL: node trouble, OOM killer): retry
    ("10", "10", 2, False),   # failed again without progress: stop
    ("10", "20", 0, True),    # clean exit before the end (e.g. --exit-duration-in-mins): continue
])
def test_requeue_after_failures_only_with_progress_or_a_signal(tmp_path: Path, capsys, before, after, step_rc,
                                                               requeued) -> None:
    out = render(tmp_path, capsys)
    ckpt = workdir(tmp_path) / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    tracker = ckpt / "latest_checkpointed_iteration.txt"
    if before:
        tracker.write_text(before + "\n")
    bindir = tmp_path / "bin"
    write = f'echo {after} > {tracker}\n' if after else ""
    stub(bindir, "srun", f"{write}exit {step_rc}\n")
    stub(bindir, "scontrol", 'echo "scontrol $*" >> "$LOG"\ncase "$1 $2" in\n  "show hostnames") echo node1 ;;\n'
                             '  "show node") echo "NodeName=node1 NodeAddr=127.0.0.1" ;;\nesac\n')
    proc = subprocess.run(["bash", str(out / "train.sbatch")], env=env_for(tmp_path, out), capture_output=True,
                          text=True)
    log = (tmp_path / "log").read_text()
    assert ("scontrol requeue 5" in log) == requeued, proc.stdout + proc.stderr
    assert proc.returncode == (0 if requeued else step_rc)


def pyxis_spec(tmp_path: Path, checkpoint_dir: str, mounts: list[str]) -> Path:
    """tiny-gpt in a pyxis container with the given mounts and checkpoint dir (paths under tmp_path)."""
    text = TINY.read_text().replace("/tmp/lingjun-slurm/tiny-gpt", str(workdir(tmp_path)))
    text = text.replace("container:\n  runtime: none\n",
                        "container:\n  image: nvcr.io#nvidia/pytorch:25.04-py3\n  mounts:\n"
                        + "".join(f"    - {m}\n" for m in mounts))
    text = text.replace("checkpoint:\n  save_interval: 100\n", f"checkpoint:\n  dir: {checkpoint_dir}\n  save_interval: 100\n")
    path = tmp_path / "pyxis.yaml"
    path.write_text(text)
    return path


def test_a_finished_run_behind_a_mount_is_not_requeued(tmp_path: Path, capsys) -> None:
    """Issue 12 item 3: checkpoint.dir is a container path (/ckpt/x behind /lustre/ckpt:/ckpt). The batch
    shell reads the tracker on the host, at /lustre/ckpt/x; reading /ckpt/x saw iteration 0 and requeued a
    finished run max_restarts times, then failed."""
    lustre = tmp_path / "lustre" / "ckpt"
    (lustre / "x").mkdir(parents=True)
    (lustre / "x" / "latest_checkpointed_iteration.txt").write_text("300\n")
    spec = pyxis_spec(tmp_path, "/ckpt/x", [f"{lustre}:/ckpt"])
    out = tmp_path / "out"
    assert main_rc(["render", str(spec), "-o", str(out)], capsys) == 0
    fake_image_record(out)
    script = (out / "train.sbatch").read_text()
    assert f"tracker={lustre}/x/latest_checkpointed_iteration.txt" in script
    assert f"--container-mounts={lustre}:/ckpt" in script
    bindir = tmp_path / "bin"
    stub(bindir, "srun", 'exit 0\n')
    stub(bindir, "scontrol", 'echo "scontrol $*" >> "$LOG"\ncase "$1 $2" in\n  "show hostnames") echo node1 ;;\n'
                             '  "show node") echo "NodeName=node1 NodeAddr=127.0.0.1" ;;\nesac\n')
    proc = subprocess.run(["bash", str(out / "train.sbatch")], env=env_for(tmp_path, out), capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "requeue" not in (tmp_path / "log").read_text()


def main_rc(argv: list[str], capsys) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
        raise SystemExit(0)
    capsys.readouterr()
    return int(info.value.code or 0)


@pytest.mark.parametrize("job_id", ["5", "12767", "22767", "9999999"])
def test_master_port_stays_below_the_ephemeral_range(tmp_path: Path, capsys, job_id: str) -> None:
    """Issue 12 item 4: 20000 + id % 20000 reached 39999, inside Linux's 32768-60999 ephemeral range."""
    out = render(tmp_path, capsys)
    (workdir(tmp_path) / "checkpoints").mkdir(parents=True)
    (workdir(tmp_path) / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("300\n")
    bindir = tmp_path / "bin"
    stub(bindir, "srun", 'exit 0\n')
    stub(bindir, "scontrol", 'case "$1 $2" in\n  "show hostnames") echo node1 ;;\n'
                             '  "show node") echo "NodeName=node1 NodeAddr=127.0.0.1" ;;\nesac\n')
    proc = subprocess.run(["bash", str(out / "train.sbatch")], env={**env_for(tmp_path, out), "SLURM_JOB_ID": job_id},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    port = int(proc.stdout.split("MASTER_PORT=")[1].split()[0])
    assert 10000 <= port < 30000 and port == 10000 + int(job_id) % 20000
