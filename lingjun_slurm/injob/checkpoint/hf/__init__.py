"""Hugging Face checkpoints in and out of Megatron's torch_dist format (issue 29).

families.py: which Hugging Face class a run's model is (Llama or GPT-2), config.json both ways.
mapping.py: the tensor transforms, Megatron <-> Hugging Face, exact.
proof.py: both models on one batch, logits compared layer by layer.
megatron_io.py / hf_io.py / export.py / importer.py: reading and writing the two formats.

Import-light: nothing here imports torch at import time (rendering and submitting import this
package's siblings; the CLI imports these modules lazily).
"""

from __future__ import annotations

from ..errors import CheckpointError


class HFUnsupported(CheckpointError):
    """The model has a setting no Hugging Face class here reproduces exactly (exit 1); the message names it."""
