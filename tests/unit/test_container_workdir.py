"""Containerized stages run in the directory the batch script runs in (issue 25, finding 1).

pyxis starts a task in the directory of the container's init process unless --container-workdir
is given (NVIDIA/pyxis v0.24.0 pyxis_slurmstepd.c:945-970 container_get_cwd reads /proc/PID/cwd;
1653-1664 chdir to --container-workdir, else to that directory; v0.20.0: 725-740, 1303-1315), and
enroot's /etc/rc has cd'd the init process into the image's WorkingDir, or '/' (NVIDIA/enroot
v4.1.2 src/docker.sh:358-370). On real enroot 4.1.2 + pyxis 0.24, examples/command-chain.yaml with
an image lost `data/` in the container's root and its second stage failed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lingjun_slurm.container import HOST_CWD_FLAG, pyxis_flags
from lingjun_slurm.doctor import ImageChoice, prepare
from lingjun_slurm.plan import build_plan
from lingjun_slurm.render import render_plan
from lingjun_slurm.common.shell import Shell, join
from lingjun_slurm.spec.load import load_spec
from lingjun_slurm.spec.models import ContainerSpec
from tests.conftest import REPO, scenario_files
from tests.unit.test_hostile import fake_image_record

CHAIN = REPO / "examples" / "command-chain.yaml"
IMAGE = "127.0.0.1:5817/ns/img:tag"  # the Docker-style reference of the outside check (enroot 4.x)


def chain_spec(tmp_path: Path, container_workdir: str | None = None) -> Path:
    """examples/command-chain.yaml in a container, its workdir under tmp_path."""
    text = CHAIN.read_text().replace("/tmp/lingjun-slurm/command-chain", str(tmp_path / "wd"))
    block = f'  runtime: pyxis\n  image: "{IMAGE}"\n'
    if container_workdir:
        block += f"  workdir: {container_workdir}\n"
    assert "  runtime: none\n" in text
    path = tmp_path / "chain.yaml"
    path.write_text(text.replace("  runtime: none\n", block))
    return path


def workdir_words(words) -> list[str]:
    return [str(w) for w in words if str(w).startswith("--container-workdir")]


def container_specs() -> list[tuple[str, Path]]:
    """Every golden scenario and example whose stages run in a container."""
    found = []
    for name, path in sorted(scenario_files().items()):
        if load_spec(path).spec.container.runtime == "pyxis":
            found.append((name, path))
    return found


@pytest.mark.parametrize("name,path", container_specs(), ids=[n for n, _ in container_specs()])
def test_every_containerized_srun_sets_the_container_workdir(name: str, path: Path) -> None:
    loaded = load_spec(path)
    spec = loaded.spec
    plan = build_plan(spec, spec_sha256=loaded.sha256, source=name)
    files = render_plan(plan)
    word = f"--container-workdir={spec.container.workdir}" if spec.container.workdir else HOST_CWD_FLAG
    want = str(word)
    checked = 0
    for stage in plan.stages:
        if not stage.container:
            continue
        assert workdir_words(stage.launcher) == [want], (name, stage.name)
        faults = (stage.vars or {}).get("faults") or {}
        if faults.get("preflight_launcher"):
            assert workdir_words(faults["preflight_launcher"]) == [want], (name, stage.name, "pre-flight")
        # and in the script: after the prelude's cd into the run directory, on the srun itself
        script = files[stage.script]
        quoted = join([word])
        assert quoted in script, (name, stage.script)
        assert script.index('cd "$RUN_DIR"') < script.index(quoted)
        checked += 1
    assert checked, f"{name}: no containerized stage"


def test_the_spec_s_own_container_workdir_wins_and_is_the_only_one(tmp_path: Path) -> None:
    spec = ContainerSpec(image="nvcr.io#nvidia/pytorch:25.04-py3", workdir="/workspace")
    flags = pyxis_flags(spec, "/shared/run", []).flags
    # pyxis refuses two different --container-workdir values (args.c:464-468): exactly one
    assert workdir_words(flags) == ["--container-workdir=/workspace"]
    flags = pyxis_flags(spec, "/shared/run", [], cwd=Shell('--container-workdir="$X"')).flags
    assert workdir_words(flags) == ["--container-workdir=/workspace"]
    plain = ContainerSpec(image="nvcr.io#nvidia/pytorch:25.04-py3")
    assert workdir_words(pyxis_flags(plain, "/shared/run", []).flags) == ['--container-workdir="$PWD"']
    assert workdir_words(pyxis_flags(plain, "/shared/run", [], cwd="--container-workdir=/x").flags) == [
        "--container-workdir=/x"]

    loaded = load_spec(chain_spec(tmp_path, "/workspace"))
    plan = build_plan(loaded.spec, spec_sha256=loaded.sha256, source="chain")
    for stage in plan.stages:
        if stage.container:
            assert workdir_words(stage.launcher) == ["--container-workdir=/workspace"]


def test_doctor_and_nccl_test_keep_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The doctor job reuses the train step's pre-flight flags; nccl-test builds its own."""
    path = scenario_files()["azure-h100-builtin"]
    loaded = load_spec(path)
    assert not loaded.spec.container.workdir
    job = prepare(loaded, run_id="r-doctor", choice=ImageChoice("/shared/img.sqsh", "spec", "/shared/img.sqsh"),
                  reproduce="")
    assert workdir_words(job.stage.launcher) == [str(HOST_CWD_FLAG)]
    assert str(HOST_CWD_FLAG) in job.files["doctor.sbatch"]

    from tests.golden.test_golden_nccl import CASES, render_case  # the golden nccl-test jobs

    for name in ("nccl-test-azure-h100-container", "nccl-test-tcp-all-gather"):
        script = render_case(CASES[name], tmp_path / name)
        srun = [line for line in script.splitlines() if "--container-" in line]
        assert srun and sum(line.count("--container-workdir") for line in srun) == 1, name
        assert str(HOST_CWD_FLAG) in script, name
    capsys.readouterr()


FAKE_PYXIS_SRUN = r"""#!/usr/bin/env python3
# srun with pyxis's rule for the task's directory (NVIDIA/pyxis v0.24.0 pyxis_slurmstepd.c:1653-1664):
# --container-workdir if given, else the container's init process's directory, which enroot's
# /etc/rc put at the image's WorkingDir or '/' (enroot v4.1.2 src/docker.sh:358-370). The image
# here has no WorkingDir, so '/' of the container: a new directory under $FAKE_CONTAINER_ROOT per
# step (an unnamed container is removed when its step ends). Mounts are not applied: the run's
# workdir is mounted at the same path, so its paths are the host's.
import os, sys, tempfile
args = sys.argv[1:]
workdir = None
container = False
while args and args[0].startswith("-"):
    word = args.pop(0)
    if word.startswith("--container-"):
        container = True
    if word.startswith("--container-workdir="):
        workdir = word.split("=", 1)[1]
if container:
    os.chdir(workdir if workdir is not None else tempfile.mkdtemp(dir=os.environ["FAKE_CONTAINER_ROOT"]))
with open(os.environ["FAKE_SRUN_LOG"], "a") as log:
    log.write(os.getcwd() + "\n")
os.execvp(args[0], args)
"""


def test_command_chain_in_a_container_keeps_its_files(tmp_path: Path) -> None:
    """fetch writes data/zen.txt and count reads it back: both in the run directory, as without
    a container, and nothing lands in the container's own root."""
    loaded = load_spec(chain_spec(tmp_path))
    plan = build_plan(loaded.spec, spec_sha256=loaded.sha256, source="chain")
    run_dir = tmp_path / "wd" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    for name, text in render_plan(plan).items():
        (run_dir / name).write_text(text)
    fake_image_record(run_dir)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(FAKE_PYXIS_SRUN)
    (bindir / "srun").chmod(0o755)
    root = tmp_path / "container-root"
    root.mkdir()
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(run_dir),
           "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "FAKE_CONTAINER_ROOT": str(root), "FAKE_SRUN_LOG": str(tmp_path / "srun.log"),
           "HOME": str(tmp_path)}
    for script in ("fetch.sbatch", "count.sbatch"):
        proc = subprocess.run(["bash", str(run_dir / script)], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, f"{script}:\n{proc.stdout}\n{proc.stderr}"
    assert (run_dir / "data" / "count.txt").read_text().split()[0].isdigit()
    assert not list(root.iterdir()), "a stage ran in the container's own root"
    assert (tmp_path / "srun.log").read_text().split() == [str(run_dir)] * 2
