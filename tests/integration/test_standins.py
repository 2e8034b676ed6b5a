"""The enroot / pyxis stand-ins (tests/fixtures/standins/): the enroot CLI on its own, the srun wrapper's
option handling, and pyxis's container life cycle on the real test Slurm cluster."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.fixtures import submit, wait_job
from tests.standins import ENROOT, PYXIS_EPILOG, REGISTRY, SRUN, STANDINS, containers, imports, imports_by_node, \
    log_lines, standin_env

IMG1 = "reg.example#team/img:1"
D1 = REGISTRY[IMG1]


def enroot(env: dict[str, str], *args: str, answer: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ENROOT), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          input=answer, stdin=subprocess.DEVNULL if answer is None else None, timeout=30)


@pytest.fixture
def senv(tmp_path: Path) -> dict[str, str]:
    return standin_env(tmp_path)


# ----- enroot ----------------------------------------------------------------------------------

def test_version_and_unknown_command(senv: dict[str, str]) -> None:
    assert enroot(senv, "version").stdout == "4.1.2\n"
    assert enroot({**senv, "STANDIN_ENROOT_VERSION": "3.5.0"}, "version").stdout == "3.5.0\n"
    proc = enroot(senv, "frobnicate")
    assert proc.returncode == 1 and proc.stdout.startswith("Usage: enroot COMMAND")
    assert enroot(senv).returncode == 1


def test_digest_per_arch_and_unknown_image(senv: dict[str, str]) -> None:
    proc = enroot(senv, "digest", f"docker://{IMG1}")
    assert proc.returncode == 0 and proc.stdout == D1["amd64"] + "\n" and proc.stderr == ""  # host: x86_64
    assert enroot(senv, "digest", "-a", "aarch64", f"docker://{IMG1}").stdout == D1["arm64"] + "\n"
    assert enroot(senv, "digest", "--arch=x86_64", f"docker://{IMG1}").stdout == D1["amd64"] + "\n"
    bad = enroot(senv, "digest", "-a", "amd64", f"docker://{IMG1}")  # enroot wants uname names (common::debarch)
    assert bad.returncode == 1 and bad.stderr == "[ERROR] Unsupported architecture: amd64\n"
    unknown = enroot(senv, "digest", "docker://reg.example#team/nope:1")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr.startswith("[ERROR] Could not retrieve digest from https://reg.example/v2/team/nope/")


def test_digest_and_pins_need_enroot_4(senv: dict[str, str], tmp_path: Path) -> None:
    old = {**senv, "STANDIN_ENROOT_VERSION": "3.5.0"}
    proc = enroot(old, "digest", f"docker://{IMG1}")
    assert proc.returncode == 1 and proc.stdout.startswith("Usage: enroot COMMAND") and "digest" not in proc.stdout
    pinned = f"docker://reg.example#team/img@{D1['amd64']}"
    proc = enroot(old, "import", "-o", str(tmp_path / "old.sqsh"), pinned)
    assert proc.returncode == 1 and proc.stderr == f"[ERROR] Invalid image reference: {pinned}\n"
    assert not (tmp_path / "old.sqsh").exists()
    new = enroot(senv, "import", "-o", str(tmp_path / "new.sqsh"), pinned)
    assert new.returncode == 0, new.stderr
    meta = json.loads((tmp_path / "new.sqsh").read_bytes()[4:])
    assert meta["digest"] == D1["amd64"] and meta["uri"] == pinned
    # tag + digest: the tag is ignored, the digest used (docker.sh:208-289)
    both = f"docker://reg.example#team/img:ignored@{D1['arm64']}"
    assert enroot(senv, "import", "-o", str(tmp_path / "both.sqsh"), both).returncode == 0
    assert json.loads((tmp_path / "both.sqsh").read_bytes()[4:])["digest"] == D1["arm64"]


def test_import_refuses_existing_file_before_anything(senv: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "img.sqsh"
    out.write_bytes(b"old")
    proc = enroot(senv, "import", "-o", str(out), f"docker://{IMG1}")
    assert proc.returncode == 1 and proc.stderr == f"[ERROR] File already exists: {out}\n" and proc.stdout == ""
    assert out.read_bytes() == b"old" and imports(senv) == []  # nothing pulled, nothing logged
    ok = enroot(senv, "import", "-o", str(tmp_path / "fresh.sqsh"), f"docker://{IMG1}")
    assert ok.returncode == 0 and ok.stdout == "" and "[INFO] " in ok.stderr
    data = (tmp_path / "fresh.sqsh").read_bytes()
    assert data.startswith(b"hsqs") and json.loads(data[4:]) == {"uri": f"docker://{IMG1}",
                                                                   "digest": D1["amd64"], "arch": "amd64"}
    assert imports(senv) == [f"import docker://{IMG1} {tmp_path / 'fresh.sqsh'} {os.uname().nodename}"]
    unknown = enroot(senv, "import", "-o", str(tmp_path / "u.sqsh"), "docker://reg.example#team/nope:1")
    assert unknown.returncode == 1 and "returned error code: 404" in unknown.stderr
    assert not (tmp_path / "u.sqsh").exists()
    nodir = enroot(senv, "import", "-o", str(tmp_path / "no" / "x.sqsh"), f"docker://{IMG1}")
    assert nodir.returncode == 1 and "[ERROR] No such file or directory" in nodir.stderr


def test_failed_import_leaves_partial_file_that_blocks_reimport(senv: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "img.sqsh"
    proc = enroot({**senv, "STANDIN_IMPORT_FAIL": "1"}, "import", "-o", str(out), f"docker://{IMG1}")
    assert proc.returncode == 1 and out.exists()
    partial = out.read_bytes()
    assert partial.startswith(b"hsqs")
    with pytest.raises(ValueError):
        json.loads(partial[4:])
    again = enroot(senv, "import", "-o", str(out), f"docker://{IMG1}")
    assert again.returncode == 1 and "File already exists" in again.stderr
    bad = enroot(senv, "create", "-n", "c", str(out))  # unsquashfs -s refuses a truncated image
    assert bad.returncode == 1 and bad.stderr == f"[ERROR] Invalid image format: {out}\n"


def test_partial_file_is_visible_during_a_slow_import(senv: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "slow.sqsh"
    proc = subprocess.Popen([str(ENROOT), "import", "-o", str(out), f"docker://{IMG1}"],
                            env={**os.environ, **senv, "STANDIN_IMPORT_DELAY": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 5
        while not (out.exists() and out.stat().st_size) and time.monotonic() < end:
            time.sleep(0.02)
        size_during = out.stat().st_size
        racer = enroot(senv, "import", "-o", str(out), f"docker://{IMG1}")
        assert racer.returncode == 1 and "File already exists" in racer.stderr
    finally:
        assert proc.wait(timeout=10) == 0
    assert 0 < size_during < out.stat().st_size


def test_create_list_remove(senv: dict[str, str], tmp_path: Path) -> None:
    img = tmp_path / "team+img+1.sqsh"
    assert enroot(senv, "import", "-o", str(img), f"docker://{IMG1}").returncode == 0
    assert enroot(senv, "create", str(img)).returncode == 0  # name: basename minus .sqsh
    assert enroot(senv, "create", "-n", "b", str(img)).returncode == 0
    dup = enroot(senv, "create", "-n", "b", str(img))
    data = Path(senv["ENROOT_DATA_PATH"])
    assert dup.returncode == 1 and dup.stderr == f"[ERROR] File already exists: {data / 'b'}\n"
    assert enroot(senv, "create", "-f", "-n", "b", str(img)).returncode == 0
    assert enroot(senv, "list").stdout == "b\nteam+img+1\n"
    fancy = enroot(senv, "list", "-f").stdout.splitlines()
    assert fancy[0].split() == "NAME PID COMM STATE STARTED TIME MNTNS USERNS COMMAND".split()
    assert [line.split() for line in fancy[1:]] == [["b"], ["team+img+1"]]
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (data / "b" / ".pid").write_text(f"{sleeper.pid}\n")
        row = enroot(senv, "list", "-f").stdout.splitlines()[1].split()
        assert row[:3] == ["b", str(sleeper.pid), "sleep"]
    finally:
        sleeper.kill()
        sleeper.wait()
    # no -f and no answer on stdin: enroot's `read` fails under set -e -> exit 1, nothing removed
    assert enroot(senv, "remove", "b").returncode == 1 and (data / "b").is_dir()
    assert enroot(senv, "remove", "b", answer="n\n").returncode == 0 and (data / "b").is_dir()
    # stops at the first missing name, the later ones are kept
    miss = enroot(senv, "remove", "-f", "nope", "b")
    assert miss.returncode == 1 and miss.stderr == f"[ERROR] No such file or directory: {data / 'nope'}\n"
    assert (data / "b").is_dir()
    assert enroot(senv, "remove", "-f", "b", "team+img+1").returncode == 0
    assert enroot(senv, "list").stdout == ""
    assert [line.split()[0] for line in log_lines(senv)] == ["import", "create", "create", "create", "remove", "remove"]


# ----- srun wrapper, without a cluster -----------------------------------------------------------

@pytest.fixture
def fake_srun(tmp_path: Path) -> Path:
    """A "real srun" that prints its argv as JSON."""
    exe = tmp_path / "fake-srun"
    exe.write_text("#!/usr/bin/env python3\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def wrapped(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYXIS_")}
    return subprocess.run([str(SRUN), *argv], env={**clean, **env}, capture_output=True, text=True, timeout=30)


def test_srun_passes_non_container_calls_unchanged(senv: dict[str, str], fake_srun: Path) -> None:
    env = {**senv, "STANDIN_REAL_SRUN": str(fake_srun)}
    for argv in (["-N2", "--ntasks-per-node", "1", "hostname"], ["--export=NONE", "-l", "--", "bash", "-c", "x y"],
                 ["true", "--container-image=not-an-option-of-srun-here"]):
        proc = wrapped(env, *argv)
        assert proc.returncode == 0 and json.loads(proc.stdout) == argv, proc.stderr


def test_srun_strips_pyxis_options(senv: dict[str, str], fake_srun: Path) -> None:
    env = {**senv, "STANDIN_REAL_SRUN": str(fake_srun)}
    proc = wrapped(env, "-N", "2", "--container-image", IMG1, "--container-name=x:no_exec", "--container-writable",
                   "--no-container-mount-home", "--container-mounts=/a:/b:ro+rprivate,/c", "-J", "job",
                   "--container-workdir=/w", "--container-env=A,B", "cmd", "--container-image=arg-of-cmd")
    argv = json.loads(proc.stdout)
    sep = argv.index("--")
    assert argv[:sep] == ["-N", "2", "-J", "job"]
    assert argv[sep + 1] == str(STANDINS / "pyxis-task") and argv[sep + 2] == "--spec" and argv[sep + 4] == "--"
    assert argv[sep + 5:] == ["cmd", "--container-image=arg-of-cmd"]
    spec = json.loads(argv[sep + 3])
    assert (spec["image"], spec["name"], spec["flags"], spec["workdir"]) == (IMG1, "x", "no_exec", "/w")
    assert spec["env"]["STANDIN_ENROOT_ROOT"] == senv["STANDIN_ENROOT_ROOT"]
    # options without an image or a name: stripped, with pyxis's warning, no shim
    proc = wrapped(env, "--container-mounts=/a:/a", "hostname")
    assert json.loads(proc.stdout) == ["--", "hostname"] and "ignoring --container-mounts" in proc.stderr
    # the same option twice with different values is pyxis's error; srun adds its own line and exits
    # 255 (recorded on the real pyxis: tests/fixtures/real_pyxis_enroot/.../p27-name-twice)
    proc = wrapped(env, "--container-image=a", "--container-image=b", "true")
    assert proc.returncode == 255 and proc.stderr == ("srun: error: pyxis: --container-image specified multiple times\n"
                                                      "srun: error: Invalid --container-image argument: b\n")
    # PYXIS_CONTAINER_IMAGE fills the image when the command line has none (args.c:177-251)
    proc = wrapped({**env, "PYXIS_CONTAINER_IMAGE": IMG1}, "true")
    assert json.loads(json.loads(proc.stdout)[3])["image"] == IMG1


# ----- on the real test Slurm cluster -------------------------------------------------------------

def run_job(slurm_cluster: Any, senv: dict[str, str], tmp_path: Path, script: str, nodes: int = 2,
            per_node: int = 2) -> str:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\nset -e\n" + script)
    env = {**slurm_cluster.env, **senv}
    job = submit(env, f"-N{nodes}", f"--ntasks-per-node={per_node}", "-o", str(tmp_path / "out.txt"),
                 "-D", str(tmp_path), str(path))
    state = wait_job(env, job, timeout=60)
    out = (tmp_path / "out.txt").read_text()
    assert state == "COMPLETED", out
    return job


@pytest.mark.slurm
def test_named_container_imported_once_per_node_then_reused(slurm_cluster: Any, senv: dict[str, str],
                                                            tmp_path: Path) -> None:
    run_job(slurm_cluster, senv, tmp_path, f"""
srun --container-image={IMG1} --container-name=x hostname
cp "$STANDIN_LOG" after1.log
srun --container-image=reg.example#team/img:2 --container-name=x bash -c 'echo "$SLURMD_NODENAME $PWD"'
srun -l hostname
""")
    after1 = [line for line in (tmp_path / "after1.log").read_text().splitlines() if line.startswith("import ")]
    assert sorted(line.split()[-1] for line in after1) == ["node1", "node2"]  # once per node, 2 tasks each
    assert all(line.split()[1] == f"docker://{IMG1}" for line in after1)
    assert imports(senv) == after1  # the second srun reused pyxis_x: no import, though the image changed
    assert imports_by_node(senv) == {"node1": 1, "node2": 1}
    assert containers(senv) == {"node1": ["pyxis_x"], "node2": ["pyxis_x"]}  # global scope: kept
    root = Path(senv["STANDIN_ENROOT_ROOT"])
    assert not list(root.glob("*/runtime/*/*.squashfs"))  # the import's squashfs was unlinked
    assert not list(root.glob("*/steps/*"))
    out = (tmp_path / "out.txt").read_text()
    # no --container-workdir: tasks start in the container's cwd, the image's WorkingDir or / (this
    # image has none), not in the job's directory (pyxis_slurmstepd.c:1652-1664; recorded:
    # tests/fixtures/real_pyxis_enroot/pyxis-0.24.0_enroot-4.1.2/p01, p05)
    assert out.count("node1 /\n") == 2 and out.count("node2 /\n") == 2 and str(tmp_path) not in out
    # slurm_spank_log: "imported" per node always, "importing" only for 1-task steps (pyxis_slurmstepd.c:741-757)
    assert out.count(f"pyxis: imported docker image: {IMG1}") == 2 and "importing docker image" not in out
    meta = json.loads((root / "node1" / "data" / "pyxis_x" / ".standin-image.json").read_text())
    assert meta["digest"] == D1["amd64"]


@pytest.mark.slurm
def test_unnamed_container_removed_at_step_end(slurm_cluster: Any, senv: dict[str, str], tmp_path: Path) -> None:
    job = run_job(slurm_cluster, senv, tmp_path, f"""
srun --container-image={IMG1} --container-workdir=/ bash -c 'ls "$STANDIN_ENROOT_ROOT/$SLURMD_NODENAME/data"; pwd'
""")
    out = (tmp_path / "out.txt").read_text().split()
    assert out.count(f"pyxis_{job}.0") == 4 and out.count("/") == 4  # present while it ran
    assert imports_by_node(senv) == {"node1": 1, "node2": 1}
    assert containers(senv) == {"node1": [], "node2": []}
    assert sorted(line for line in log_lines(senv) if line.startswith("remove ")) == \
        [f"remove pyxis_{job}.0 node1", f"remove pyxis_{job}.0 node2"]


@pytest.mark.slurm
def test_job_scope_and_epilog(slurm_cluster: Any, senv: dict[str, str], tmp_path: Path) -> None:
    senv = {**senv, "STANDIN_PYXIS_SCOPE": "job"}
    job = run_job(slurm_cluster, senv, tmp_path, f"srun --container-image={IMG1} --container-name=x true\n",
                  nodes=1, per_node=1)
    (node,) = containers(senv)
    assert containers(senv) == {node: [f"pyxis_{job}_x"]}
    subprocess.run([str(PYXIS_EPILOG), job, node], env={**os.environ, **senv}, check=True, timeout=30)
    assert containers(senv) == {node: []}


@pytest.mark.slurm
def test_failed_import_fails_the_step(slurm_cluster: Any, senv: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\nsrun --container-image=reg.example#team/nope:1 --container-name=y true\n"
                    "echo rc=$?\n")
    env = {**slurm_cluster.env, **senv}
    job = submit(env, "-N1", "-o", str(tmp_path / "out.txt"), str(path))
    wait_job(env, job, timeout=60)
    out = (tmp_path / "out.txt").read_text()
    assert "rc=1" in out and "pyxis: failed to import docker image: reg.example#team/nope:1" in out
    assert "returned error code: 404" in out
    assert list(containers(senv).values()) == [[]]
