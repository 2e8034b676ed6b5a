"""Generated docs are current, and the README's test command is the one CI runs."""

from __future__ import annotations

from lingjun_slurm import docgen
from tests.conftest import REPO


def test_generated_docs_are_current() -> None:
    for name, text in docgen.outputs().items():
        path = REPO / "docs" / name
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: python -m lingjun_slurm.docgen docs/"


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    command = ci[-1]
    assert command.startswith("python3 -m venv .venv") and "pytest" in command
    assert command in (REPO / "README.md").read_text(), "README.md must show .ci/run's test command verbatim"


def test_every_profile_and_preset_is_documented() -> None:
    from lingjun_slurm import network
    from lingjun_slurm.presets import model_presets

    profiles_doc = (REPO / "docs" / "network-profiles.md").read_text()
    assert all(f"## `{name}`" in profiles_doc for name in network.profiles())
    spec_doc = (REPO / "docs" / "spec-reference.md").read_text()
    assert all(f"| `{name}` |" in spec_doc for name in model_presets())
