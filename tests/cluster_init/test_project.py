"""The CycleCloud project's shape and hygiene: layout, shellcheck on every shell file, no
Python or jq on nodes, and the documented key table matching the installer's."""

from __future__ import annotations

import configparser
import os
import re
import subprocess

import pytest

from tests.cluster_init.node import PROJECT, REPO

SPECS = ("default", "execute", "scheduler", "login")
OWN = [PROJECT / "specs" / spec / "cluster-init" / sub for spec in SPECS for sub in ("scripts", "tests")] + [
    PROJECT / "specs/default/cluster-init/files"]


def shell_files() -> list:
    """Every shell file under cluster_init/, chosen by shebang or shellcheck directive, not by name."""
    found = []
    for path in sorted((REPO / "cluster_init").rglob("*")):
        if not path.is_file():
            continue
        head = path.read_bytes()[:200].decode("utf-8", "replace")
        first = head.splitlines()[0] if head else ""
        if re.match(r"#!.*\b(bash|sh)\b", first) or head.startswith("# shellcheck shell=") or path.suffix == ".sh":
            found.append(path)
    return found


def test_project_ini():
    ini = configparser.ConfigParser()
    ini.read(PROJECT / "project.ini")
    assert ini["project"]["name"] == "lingjun-slurm" == PROJECT.name
    assert ini["project"]["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", ini["project"]["version"])


@pytest.mark.parametrize("spec", SPECS)
def test_spec_layout(spec):
    base = PROJECT / "specs" / spec / "cluster-init"
    scripts = sorted((base / "scripts").iterdir())
    assert scripts and all(re.fullmatch(r"\d\d-[a-z0-9-]+\.sh", s.name) for s in scripts)
    assert (base / "files").is_dir() and any((base / "files").iterdir()), "files/ must exist (and be tracked)"
    tests = sorted((base / "tests").iterdir())
    assert tests
    for script in scripts + tests:
        assert os.access(script, os.X_OK), f"{script} must be executable"
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n")
        assert "\nset -euo pipefail\n" in text
    for shim in scripts:
        assert len(shim.read_text().splitlines()) <= 20, "the numbered scripts stay thin shims"


def test_installer_is_strict_bash():
    install = PROJECT / "specs/default/cluster-init/files/install.sh"
    assert os.access(install, os.X_OK)
    text = install.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\nset +o xtrace\n" in text


def test_shellcheck_every_shell_file(shellcheck):
    files = shell_files()
    names = {p.name for p in files}
    assert {"install.sh", "common.sh", "enroot-credentials-prolog.sh", "lingjun-health",
            "20-lingjun-slurm-execute.sh", "test_scheduler.sh"} <= names
    result = subprocess.run([shellcheck, "--severity=style", *map(str, files)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_node_scripts_need_no_python_or_jq():
    """Commands only: messages (in double quotes) and comments may mention them."""
    pattern = re.compile(r"(^|[\s;|&(`])(python[0-9.]*|jq)(\s|$)")
    for top in OWN:
        for path in top.rglob("*"):
            if not path.is_file() or path.suffix not in (".sh", ".awk", ""):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = "" if line.lstrip().startswith("#") else re.sub(r'"[^"]*"', '""', line)
                assert not pattern.search(code), f"{path}:{n}: {line}"


def key_table(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(lingjun_slurm\.[a-z0-9_.]+)` \| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def test_admin_guide_documents_every_key_with_its_default():
    keys = {}
    for line in (PROJECT / "specs/default/cluster-init/files/lib/config-keys.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _type, default, _meaning = line.split("\t")
            keys[key] = "" if default == '""' else default
    documented = key_table((REPO / "docs" / "admin-guide.md").read_text())
    assert set(documented) == set(keys)
    for key, default in keys.items():
        shown = documented[key]
        assert shown == (f"`{default}`" if default else "(empty)"), f"{key}: docs say {shown}, installer {default!r}"
