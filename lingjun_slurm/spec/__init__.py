"""The spec: one YAML file describing a training run.

The names below load on first use (PEP 562 module __getattr__), not when the package is
imported: `from .spec.base import NAME_RE` (clusters.py, which `status` imports) then runs
neither load.py's imports (yaml, checks, network profiles) nor models.py's classes (issue 15).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .load import LoadedSpec, load_spec, parse_spec
    from .models import Spec

__all__ = ["LoadedSpec", "Spec", "load_spec", "parse_spec"]
_MODULE_OF = {"LoadedSpec": "load", "load_spec": "load", "parse_spec": "load", "Spec": "models"}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
