"""Issue 26 item 12: the README's main job installs what `report` needs, and the README states the
test time as measured on CI's two cores."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _requirements(extras: list[str]) -> set[str]:
    """Distribution names the package's base dependencies plus `extras` pull in (self-references
    such as lingjun-slurm[megatron] followed)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names: set[str] = set()
    todo, seen = list(extras), set()

    def add(req: str) -> None:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group().lower()  # type: ignore[union-attr]
        if name == project["name"]:
            todo.extend(re.search(r"\[(.*)\]", req).group(1).split(","))  # type: ignore[union-attr]
        else:
            names.add(name)

    for req in project["dependencies"]:
        add(req)
    while todo:
        extra = todo.pop().strip()
        if extra in seen:
            continue
        seen.add(extra)
        for req in project["optional-dependencies"][extra]:
            add(req)
    return names


def _report_imports() -> set[str]:
    """Top-level third-party modules lingjun_slurm/report/ and cli/report.py import."""
    found: set[str] = set()
    for path in [*(REPO / "lingjun_slurm" / "report").glob("*.py"), REPO / "lingjun_slurm" / "cli/report.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    import sys

    return {m for m in found if m not in sys.stdlib_module_names and m not in ("lingjun_slurm", "__future__")}


def test_the_main_job_installs_what_report_imports() -> None:
    readme = (REPO / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "submit examples/tiny-gpt.yaml --executor local" in ln
                and "pip install" in ln)
    extras = re.search(r"pip install -q -e '\.\[([^\]]*)\]'", line)
    assert extras, line
    installed = _requirements(extras.group(1).split(","))
    needed = _report_imports()
    assert "matplotlib" in needed  # what report draws its charts with (report/charts.py)
    assert needed <= installed | {"rich", "yaml", "click", "jinja2", "pydantic"}, needed - installed


def test_the_readme_states_the_test_time_on_cis_two_cores() -> None:
    text = " ".join((REPO / "README.md").read_text().split())
    assert "about 30 minutes of tests, 35 with installs, measured on CI's 2-core Debian 12 machine" in text
