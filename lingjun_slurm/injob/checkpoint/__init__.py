"""Megatron torch_dist checkpoints: verify, SHA-256 manifest, retention with pins, copy/upload, list.

Importing this package does not import torch, megatron-core or fsspec; `verify` and
`copy_checkpoint` import them when called. See docs/checkpoints.md.
"""

from __future__ import annotations

from .errors import CheckpointDamaged, CheckpointError, CheckpointUsageError
from .layout import (MANIFEST, PIN, TRACKER, IterationInfo, Tracker, iter_name, parse_iteration, pin,
                     read_tracker, scan, unpin, write_tracker)
from .retention import PrunePlan, plan_prune, prune
from .transfer import CopyResult, copy_checkpoint
from .verify import VerifyReport, verify

__all__ = [
    "CheckpointDamaged", "CheckpointError", "CheckpointUsageError", "CopyResult", "IterationInfo", "MANIFEST",
    "PIN", "PrunePlan", "TRACKER", "Tracker", "VerifyReport", "copy_checkpoint", "iter_name", "parse_iteration",
    "pin", "plan_prune", "prune", "read_tracker", "scan", "unpin", "verify", "write_tracker",
]
