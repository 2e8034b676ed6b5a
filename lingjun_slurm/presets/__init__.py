"""Data files shipped with the package: model presets, network profiles, Megatron flags."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any


def _read_text(name: str) -> str:
    """A data file's text: read beside this module, the files of an installed or checked-out
    package. importlib.resources, which also reads a package inside a zip file, costs 10-20 ms
    of start-up (its _common module imports tempfile, shutil and zipfile: CPython 3.11
    Lib/importlib/resources/_common.py), so it is only the fallback where the plain file is not
    there."""
    try:
        with open(os.path.join(os.path.dirname(__file__), name), encoding="utf-8") as handle:
            return handle.read()
    except (FileNotFoundError, NotADirectoryError):
        from importlib import resources

        return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def load(name: str) -> Any:
    """Parse one YAML data file from this package (cached; treat the result as read-only).

    With libyaml PyYAML's `yaml.CSafeLoader`, else the pure-Python `yaml.SafeLoader` (PyYAML
    lib/yaml/__init__.py: `from .cyaml import *` defines it only when libyaml imports). Both
    build the data with the same `SafeConstructor` and `Resolver`; only the scanner and parser
    are C (PyYAML 6.0 lib/yaml/cyaml.py:23 `class CSafeLoader(CParser, SafeConstructor,
    Resolver)`), about 9x faster on network_profiles.yaml, which `validate`, `render` and
    `nccl-env` read (issue 15). tests/unit/test_startup_imports.py checks both give the same data
    for every file here. yaml is imported here, not at module import: importing this module
    costs nothing.
    """
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(_read_text(name), Loader=loader)  # noqa: S506 - a safe loader either way


def model_presets() -> dict[str, dict[str, Any]]:
    return load("models.yaml")
