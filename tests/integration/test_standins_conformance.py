"""The enroot / pyxis stand-ins (tests/fixtures/standins/) held to recordings of the REAL tools.

tests/fixtures/real_pyxis_enroot/ holds commands run on the real enroot 4.1.2 / 3.5.0 and pyxis 0.24.0
(with Slurm 22.05.8) and what they printed, returned and left behind (its SOURCES.md says how). Each
test here runs the very same command line (the `cmd` file) against the stand-ins, on the test Slurm
cluster where srun is involved, and checks the deterministic parts against the recording:

- the exit status (`rc`);
- stdout, with the scratch directory written as $WORK (and, for the image with a WorkingDir, that
  directory written as the image's /opt/app: the stand-in runs commands on the host);
- the error lines of stderr: enroot's `[ERROR] ...`, pyxis's and Slurm's `slurmstepd-NODE: error: ...`
  and `srun: error: ...`, `pyxis: ...` (PIDs and job ids written as N), as a sorted list because
  srun and slurmstepd write concurrently; enroot's [INFO] chatter and mksquashfs's output are not
  compared (they depend on enroot's layer cache);
- `enroot list` of each node afterwards and the files left in the scratch directory.

Recording-only details: the recording host selected a node's enroot.conf with RT_NODE=nodeN (see
SOURCES.md); the stand-in's enroot finds a node's store from SLURMD_NODENAME, so `RT_NODE=` is
replaced by `SLURMD_NODENAME=` before running. The stand-in registry holds the two recorded images
with their recorded digests and image configs (Env, WorkingDir).

Not compared (the stand-in does not model them; tests/fixtures/standins/README.md "Limits"):
`enroot start` (e11, e12), mounts applied inside the container (p12), the container's private
/tmp (p15, p16, p23, p24), a non-root user (nonroot/), pyxis 0.20 (its messages differ).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.standins import STANDINS, standin_env

REC = Path(__file__).resolve().parents[1] / "fixtures" / "real_pyxis_enroot"
REG = "127.0.0.1:18590"  # the recording's registry; the stand-in never connects anywhere
REC_WORK = "/tmp/rt/work"  # $WORK on the recording host
IMAGE_WD = "/opt/app"  # WorkingDir of ns/pyimg:wd
# The recorded images (tests/fixtures/real_pyxis_enroot/SOURCES.md): digests and image configs.
IMAGE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DIGEST_1 = "sha256:ff88e92991f561276d8345ae285d63f21e5fccc7353c9f6dc521a80e318d7fc0"
DIGEST_WD = "sha256:9fc51854f317c7c2dda33f0ef9478c37b97b64dc1a8d95718fce4fcd487ec32a"


def registry(workdir_on_host: str) -> dict[str, Any]:
    one = {"amd64": DIGEST_1, "auth": False,
           "config": {"Env": [IMAGE_PATH, "IMGVAR=from-image", "SHARED=image"]}}
    wd = {"amd64": DIGEST_WD, "auth": False,
          "config": {"Env": [IMAGE_PATH, "IMGVAR=from-image-wd", "SHARED=image"], "WorkingDir": workdir_on_host}}
    return {f"{REG}#ns/pyimg:1": one, f"{REG}#ns/pyimg:wd": wd}


def recorded(group: str, name: str) -> dict[str, Any]:
    d = REC / group / name
    return {"cmd": (d / "cmd").read_text().rstrip("\n"), "stdout": (d / "stdout").read_text(),
            "stderr": (d / "stderr").read_text(), "rc": int((d / "rc").read_text()),
            "after": json.loads((d / "after.json").read_text()) if (d / "after.json").exists() else None}


ERROR_LINE = re.compile(r"^(\[ERROR\] |slurmstepd-\S+: error: |srun: error: |srun: Force Terminated|pyxis: )")


def error_lines(text: str, subst: dict[str, str]) -> list[str]:
    """The deterministic error lines of stderr, normalized and sorted (see the module docstring)."""
    out = []
    for line in text.splitlines():
        for old, new in subst.items():
            line = line.replace(old, new)
        if not ERROR_LINE.match(line):
            continue
        if re.match(r"^slurmstepd-\S+: error: pyxis:     ", line) and "[ERROR]" not in line:
            continue  # the enroot log pyxis prints: [INFO] lines and mksquashfs/unsquashfs output
        out.append(re.sub(r"\b\d{3,}\b", "N", line))
    return sorted(out)


class Bench:
    """Runs recorded commands against the stand-ins in a fresh scratch directory each time."""

    def __init__(self, tmp_path: Path, cluster_env: dict[str, str] | None, version: str = "4.1.2") -> None:
        self.wd = tmp_path / "image-workdir"  # the host directory standing for the image's /opt/app
        self.wd.mkdir()
        self.senv = standin_env(tmp_path, registry(str(self.wd)))
        self.work = tmp_path / "work"
        self.data = Path(self.senv["ENROOT_DATA_PATH"])
        self.nodes = Path(self.senv["STANDIN_ENROOT_ROOT"])
        self.env = {**os.environ, **(cluster_env or {}), **self.senv, "REG": REG, "WORK": str(self.work),
                    "ENROOT_ALLOW_HTTP": "yes", "STANDIN_ENROOT_ALLOW_HTTP": "yes",
                    "STANDIN_ENROOT_VERSION": version, "XDG_DATA_HOME": str(tmp_path / "xdg")}
        self.env.pop("VIRTUAL_ENV", None)

    def run(self, rec: dict[str, Any], fresh: bool = True, direct: bool = False) -> subprocess.CompletedProcess[str]:
        if fresh and self.work.exists():
            subprocess.run(["rm", "-rf", str(self.work)], check=True)
        self.work.mkdir(exist_ok=True)
        env = dict(self.env)
        if not direct:  # enroot called in the command itself acts on a node's store, as on the recording host
            env.pop("ENROOT_DATA_PATH")
        cmd = rec["cmd"].replace("RT_NODE=", "SLURMD_NODENAME=")
        return subprocess.run(["bash", "-c", cmd], cwd=self.work, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=120)

    def subst_real(self) -> dict[str, str]:
        return {REC_WORK: "$WORK", "/tmp/rt/nodes/host/data/user-0": "$DATA",
                "/tmp/rt/nodes/node1/data/user-0": "$NODE1", "/tmp/rt/nodes/node2/data/user-0": "$NODE2"}

    def subst_standin(self) -> dict[str, str]:
        return {str(self.work): "$WORK", str(self.data): "$DATA", str(self.nodes / "node1" / "data"): "$NODE1",
                str(self.nodes / "node2" / "data"): "$NODE2", str(self.wd): IMAGE_WD}

    def node_list(self, node: str) -> str:
        env = {**self.env, "SLURMD_NODENAME": node}
        env.pop("ENROOT_DATA_PATH")
        return subprocess.run([str(STANDINS / "enroot"), "list"], env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=30).stdout

    def check(self, rec: dict[str, Any], proc: subprocess.CompletedProcess[str], nodes: tuple[str, ...] = ()) -> None:
        real_s, ours_s = self.subst_real(), self.subst_standin()

        def norm(text: str, subst: dict[str, str]) -> str:
            for old, new in subst.items():
                text = text.replace(old, new)
            # Slurm's own lines about a cancelled job (k01, k02): which of them reach the job's output,
            # and in what order, is a race between slurmstepd and srun; they are not pyxis's.
            return re.sub(r"(?m)^(srun: Job step aborted: .*|slurmstepd-\S+: error: \*\*\* .* CANCELLED AT .*)\n",
                          "", text)
        assert (proc.returncode, norm(proc.stdout, ours_s)) == (rec["rc"], norm(rec["stdout"], real_s)), proc.stderr
        assert error_lines(proc.stderr, ours_s) == error_lines(rec["stderr"], real_s)
        after = rec["after"]
        if after is not None:
            work = sorted(str(p.relative_to(self.work)) + ("/" if p.is_dir() else "") for p in self.work.rglob("*"))
            assert work == after["work_tree"]
            for node in nodes:
                assert self.node_list(node) == after["enroot_list"][node], node


# ----- enroot's command line ---------------------------------------------------------------------

E4 = ["e01-version", "e02-import-docker-style", "e03-import-exists", "e04-import-enroot-form-default-name",
      "e05-import-404", "e06-digest", "e07-import-pinned-digest", "e08-import-digest-as-tag",
      "e09-create-list-remove", "e10-create-default-name-and-bad", "e13-remove-missing", "e14-unknown-command"]
E3 = E4  # e02 is the Docker-style reference that 3.x refuses, e04 the REGISTRY#IMAGE one
E_CHAINED = {"e03-import-exists"}  # runs in the scratch directory the previous recording left


@pytest.mark.parametrize("name", E4)
def test_enroot_4_1_2(tmp_path: Path, name: str) -> None:
    bench = Bench(tmp_path, None, "4.1.2")
    if name in E_CHAINED:
        bench.run(recorded("enroot-4.1.2", "e02-import-docker-style"), direct=True)
    rec = recorded("enroot-4.1.2", name)
    bench.check(rec, bench.run(rec, fresh=name not in E_CHAINED, direct=True))


@pytest.mark.parametrize("name", E3)
def test_enroot_3_5_0(tmp_path: Path, name: str) -> None:
    bench = Bench(tmp_path, None, "3.5.0")
    if name in E_CHAINED:
        bench.run(recorded("enroot-3.5.0", "e02-import-docker-style"), direct=True)
    rec = recorded("enroot-3.5.0", name)
    bench.check(rec, bench.run(rec, fresh=name not in E_CHAINED, direct=True))


# ----- pyxis 0.24.0 on the test Slurm cluster ----------------------------------------------------

P24 = ["p01-workdir-default-image-without-workingdir", "p02-workdir-default-image-workingdir",
       "p03-workdir-given", "p04-workdir-missing-in-image", "p05-workdir-srun-chdir", "p06-enroot-form-reference",
       "p07-unknown-image", "p08-sqsh-path", "p09-env-image-wins", "p10-env-container-env", "p11-env-path",
       "p13-mount-missing-source", "p14-exit-code", "p22-two-nodes", "p25-no-container-option",
       "p26-bad-mount-syntax", "p27-name-twice", "p28-signal",
       "k01-scancel-unnamed", "k02-scancel-named"]


@pytest.mark.slurm
@pytest.mark.parametrize("name", P24)
def test_pyxis_0_24_on_enroot_4(slurm_cluster: Any, tmp_path: Path, name: str) -> None:
    bench = Bench(tmp_path, slurm_cluster.env, "4.1.2")
    rec = recorded("pyxis-0.24.0_enroot-4.1.2", name)
    bench.check(rec, bench.run(rec), nodes=("node1", "node2"))


NAMED = ["p17-named-no-image", "p18-named-flag-create-exists", "p19-named-flag-exec-not-running",
         "p20-named-absent-no-image", "p21-named-remove-on-host"]


@pytest.mark.slurm
def test_pyxis_named_container_life_cycle(slurm_cluster: Any, tmp_path: Path) -> None:
    """p17-p21 run in order on the container pyxis_n1 that p15 created. p15 itself wrote /tmp/written
    inside the container (a private tmpfs there, the host's /tmp here), so it is not replayed; the
    container is made by the same srun with `true` instead."""
    bench = Bench(tmp_path, slurm_cluster.env, "4.1.2")
    setup = bench.run({"cmd": 'srun -N1 -w node1 --container-image="$REG/ns/pyimg:1" --container-name=n1 true'})
    assert setup.returncode == 0, setup.stderr
    assert bench.node_list("node1") == recorded("pyxis-0.24.0_enroot-4.1.2", "p15-named-create")["after"][
        "enroot_list"]["node1"] == "pyxis_n1\n"
    for name in NAMED:
        rec = recorded("pyxis-0.24.0_enroot-4.1.2", name)
        bench.check(rec, bench.run(rec, fresh=False), nodes=("node1", "node2"))


@pytest.mark.slurm
@pytest.mark.parametrize("name", ["p01-workdir-default-image-without-workingdir", "p06-enroot-form-reference"])
def test_pyxis_0_24_on_enroot_3(slurm_cluster: Any, tmp_path: Path, name: str) -> None:
    """enroot 3.x parses no Docker-style REGISTRY/IMAGE: pyxis's import fails; REGISTRY#IMAGE works."""
    bench = Bench(tmp_path, slurm_cluster.env, "3.5.0")
    rec = recorded("pyxis-0.24.0_enroot-3.5.0", name)
    bench.check(rec, bench.run(rec), nodes=("node1",))
