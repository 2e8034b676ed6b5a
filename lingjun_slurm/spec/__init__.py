"""The spec: one YAML file describing a training run."""

from .load import LoadedSpec, load_spec, parse_spec
from .models import Spec

__all__ = ["LoadedSpec", "Spec", "load_spec", "parse_spec"]
