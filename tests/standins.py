"""Helpers for the enroot/pyxis stand-ins in tests/fixtures/standins/ (see its README.md).

    env = standin_env(tmp_path)            # PATH with the stand-ins first, a registry, a log, node roots
    subprocess.run(["sbatch", ...], env={**os.environ, **slurm_cluster.env, **env})
    imports(env)                           # ["import docker://... /path node1", ...]
    containers(env)                        # {"node1": ["pyxis_x"], "node2": ["pyxis_x"]}
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping

STANDINS = Path(__file__).resolve().parent / "fixtures" / "standins"
ENROOT = STANDINS / "enroot"
SRUN = STANDINS / "srun"
PYXIS_EPILOG = STANDINS / "pyxis-epilog"

# The stand-in registry: "<registry>#<image>:<tag>" -> {debian arch: manifest digest}; an entry may also
# hold "config": {"WorkingDir": DIR, "Env": ["K=V"]} (the image config pyxis applies: tasks start in
# WorkingDir, or / without one; Env overrides the job's) and "auth": false (fixtures/standins/README.md).
REGISTRY: dict[str, dict[str, str]] = {
    "reg.example#team/img:1": {"amd64": "sha256:" + "1a" * 32, "arm64": "sha256:" + "1b" * 32},
    "reg.example#team/img:2": {"amd64": "sha256:" + "2a" * 32, "arm64": "sha256:" + "2b" * 32},
    "registry-1.docker.io#library/ubuntu:22.04": {"amd64": "sha256:" + "3a" * 32, "arm64": "sha256:" + "3b" * 32},
}


def standin_env(tmp_path: Path, registry: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """Environment additions that put the stand-ins in charge; merge over os.environ (and a cluster's env).

    STANDIN_ENROOT_ROOT/<node>/data is each node's container store (what pyxis's enroot uses);
    ENROOT_DATA_PATH is a separate store for direct `enroot` calls from the test itself."""
    base = tmp_path / "standin"
    (base / "nodes").mkdir(parents=True, exist_ok=True)
    (base / "data").mkdir(exist_ok=True)
    reg = base / "registry.json"
    reg.write_text(json.dumps(REGISTRY if registry is None else registry, indent=1, sort_keys=True))
    log = base / "enroot.log"
    log.touch()
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    # The stand-ins' `#!/usr/bin/env python3` then finds this interpreter (as with the venv activated),
    # not a slow pyenv shim.
    env = {
        "PATH": os.pathsep.join([str(STANDINS), os.path.dirname(sys.executable), path]),
        "STANDIN_LOG": str(log),
        "STANDIN_REGISTRY": str(reg),
        "STANDIN_ENROOT_ROOT": str(base / "nodes"),
        "ENROOT_DATA_PATH": str(base / "data"),
    }
    real = shutil.which("srun", path=path)
    if real:
        env["STANDIN_REAL_SRUN"] = real
    return env


def log_lines(env: Mapping[str, str]) -> list[str]:
    """Every line of $STANDIN_LOG: "import URI FILE NODE", "create NAME IMAGE NODE", "remove NAME NODE",
    "digest URI ARCH NODE"."""
    path = Path(env["STANDIN_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def imports(env: Mapping[str, str]) -> list[str]:
    """The "import URI FILE NODE" lines of the log, one per import the stand-in started."""
    return [line for line in log_lines(env) if line.startswith("import ")]


def imports_by_node(env: Mapping[str, str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in imports(env):
        node = line.rsplit(" ", 1)[-1]
        counts[node] = counts.get(node, 0) + 1
    return counts


def containers(env: Mapping[str, str]) -> dict[str, list[str]]:
    """node -> sorted container names it still holds (every node that pyxis-task ever touched)."""
    root = Path(env["STANDIN_ENROOT_ROOT"])
    found: dict[str, list[str]] = {}
    if not root.is_dir():
        return found
    for node in sorted(p for p in root.iterdir() if p.is_dir()):
        data = node / "data"
        found[node.name] = sorted(e.name for e in data.iterdir() if e.is_dir()) if data.is_dir() else []
    return found
