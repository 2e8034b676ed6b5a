"""Data files shipped with the package: model presets, network profiles, Megatron flags."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml


@lru_cache(maxsize=None)
def load(name: str) -> Any:
    """Parse one YAML data file from this package (cached; treat the result as read-only)."""
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def model_presets() -> dict[str, dict[str, Any]]:
    return load("models.yaml")
