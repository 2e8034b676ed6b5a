"""README.md's "Layout" section and docs/architecture.md's table name exactly the top-level
entries of lingjun_slurm/: a module or package added, moved or removed without updating them
fails here."""

from __future__ import annotations

import re

from tests.conftest import REPO

PACKAGE = REPO / "lingjun_slurm"


def top_level_entries() -> set[str]:
    out = set()
    for path in PACKAGE.iterdir():
        if path.is_dir() and (path / "__init__.py").is_file():
            out.add(path.name + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            out.add(path.name)
    return out


def readme_layout_entries() -> set[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("    lingjun_slurm/", 1)[1].split("\n    slurm_templates/", 1)[0]
    # entries are indented by six spaces under "    lingjun_slurm/"; continuation lines by more
    return {m.group(1) for m in re.finditer(r"^      ([A-Za-z_][\w.]*/?)\s", block, flags=re.M)}


def architecture_table_entries() -> set[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    names: set[str] = set()
    table = text.split("One line per top-level entry", 1)[1].split("\n\n", 2)[1]  # the paragraph after it
    for row in table.splitlines()[2:]:  # after the header and the |---| line
        names.update(re.findall(r"`([^`]+)`", row.split("|")[1]))
    return names


def test_readme_layout_lists_every_top_level_entry_and_nothing_else() -> None:
    assert readme_layout_entries() == top_level_entries()


def test_architecture_table_lists_every_top_level_entry_and_nothing_else() -> None:
    assert architecture_table_entries() == top_level_entries()


def test_the_readers_see_a_planted_difference() -> None:
    entries = top_level_entries()
    assert {"cli/", "injob/", "nodes/", "common/", "plan.py", "stages/", "data/"} <= entries
    assert "cli_runs.py" not in entries and "exclusion.py" not in entries
    assert len(readme_layout_entries()) > 20 and len(architecture_table_entries()) > 20
