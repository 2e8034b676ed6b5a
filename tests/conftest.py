"""Shared test helpers: rendering scenarios the same way the golden files were made."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest

from lingjun_slurm import __version__
from lingjun_slurm.plan import build_plan
from lingjun_slurm.render import render_plan
from lingjun_slurm.spec import load_spec

from tests import hermetic
from tests.cluster.fixtures import bound_cluster, slurm_cluster  # noqa: F401  (session-scoped real Slurm)
from tests.ssh.fixtures import ssh_server, ssh_slurm  # noqa: F401  (session-scoped real sshd)

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
# Taken from the environment pytest started in, before any test changes it; then the whole
# session moves into a sandbox of its own (HOME, TMPDIR, XDG_*) with a write guard on these paths.
# This runs when pytest loads this conftest: before any fixture, test or tmp_path reads them.
GUARDED = hermetic.guarded_roots(os.environ)
SANDBOX = hermetic.enter_sandbox(GUARDED)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    SANDBOX.leave()


@pytest.fixture(autouse=True)
def hermetic_guard(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own state dir, and fails if a process of this session wrote a user's real
    paths; a change nobody here was seen making is a warning (tests/hermetic.py)."""
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    offset = SANDBOX.log_size()
    before = hermetic.snapshot(GUARDED)
    yield
    refused = SANDBOX.refused_since(offset)
    if refused:
        pytest.fail("this test (or a process it started) wrote real paths outside its temporary directories:\n  "
                    + "\n  ".join(refused), pytrace=False)
    changed = hermetic.changes(before, hermetic.snapshot(GUARDED))
    if changed:
        warnings.warn(hermetic.Unattributed(
            "real paths changed during this test, by no process of this session that the guard sees (another "
            "terminal?):\n  " + "\n  ".join(changed)))


def scenario_files() -> dict[str, Path]:
    """Golden scenarios: tests/golden/scenarios/*.yaml plus the two shipped examples."""
    found = {p.stem: p for p in sorted((GOLDEN / "scenarios").glob("*.yaml"))}
    for name in ("megatron-gpt", "tiny-gpt"):
        found[f"example-{name}"] = REPO / "examples" / f"{name}.yaml"
    return found


def render_scenario(name: str, path: Path) -> dict[str, str]:
    """Render with a fixed provenance line so the output does not depend on where tests run."""
    label = str(path.relative_to(REPO))
    loaded = load_spec(path)
    plan = build_plan(loaded.spec, spec_sha256=loaded.sha256, source=label,
                      reproduce=f"lingjun-slurm render {label} -o out/{name}")
    return render_plan(plan)


def normalize(text: str) -> str:
    """Golden files carry @VERSION@ so a version bump does not churn every file."""
    return text.replace(f"lingjun-slurm {__version__}", "lingjun-slurm @VERSION@").replace(
        f'"tool_version": "{__version__}"', '"tool_version": "@VERSION@"')


@pytest.fixture(scope="session")
def shellcheck() -> str:
    exe = shutil.which("shellcheck")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is required in CI (apt-get install shellcheck)")
        pytest.skip("shellcheck is not installed")
    return exe
