"""What the built-in stages need from the Python that runs them (in a container, or on the host).

Standard library only: this runs before anything heavy is imported, so a wrong image fails
with a sentence instead of an ImportError deep inside megatron.
"""

from __future__ import annotations

import re
from importlib import metadata
from typing import Optional

PLAN_SCHEMA = 1  # kept equal to lingjun_slurm.plan.PLAN_SCHEMA (a test checks it)

# distribution -> minimum version, per stage. megatron-core 0.16.1 is the floor this tool
# supports (lingjun_slurm.megatron.versions); torch 2.4 is what that megatron-core needs.
# preprocess and merge write megatron-core's .bin/.idx format with numpy alone (data/writer.py):
# they need neither torch nor megatron-core (plus the tokenizer's package, TOKENIZER_DISTS).
_CORE = {"torch": "2.4", "megatron-core": "0.16.1", "numpy": "1.24"}
_DATA = {"numpy": "1.24"}
REQUIREMENTS: dict[str, dict[str, str]] = {
    "preprocess": {**_DATA},
    "merge": {**_DATA},
    "train": {**_CORE, "psutil": "5.9"},
    "checkpoint": {**_CORE, "psutil": "5.9"},
}
# gpt2-bpe: tokenizers (the fast path) and regex (Megatron's own pattern engine, data/gpt2_bpe.py).
TOKENIZER_DISTS: dict[str, tuple[str, ...]] = {"huggingface": ("tokenizers",), "gpt2-bpe": ("tokenizers", "regex"),
                                               "sentencepiece": ("sentencepiece",)}


def version_tuple(version: str) -> tuple[int, ...]:
    """Release numbers of a version: "2.13.0+cpu" -> (2, 13, 0), "0.16.1rc1" -> (0, 16, 1), "25.04" -> (25, 4)."""
    out: list[int] = []
    for part in version.split("+")[0].split(".")[:3]:
        match = re.match(r"\d+", part)
        if not match:
            break
        out.append(int(match.group()))
        if match.end() != len(part):  # a pre-release suffix ends the release numbers
            break
    return tuple(out)


def installed(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
    if dist == "megatron-core":
        return _megatron_core_from_source()
    return None


def _megatron_core_from_source() -> Optional[str]:
    """A Megatron-LM checkout on PYTHONPATH has megatron.core without package metadata: read its
    version from megatron/core/package_info.py without importing it (that would import torch)."""
    from importlib.util import find_spec

    try:
        spec = find_spec("megatron.core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    import os

    for where in spec.submodule_search_locations:
        try:
            with open(os.path.join(where, "package_info.py"), encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            continue
        parts = {k: v for k, v in re.findall(r"^(MAJOR|MINOR|PATCH)\s*=\s*(\d+)", text, re.M)}
        if {"MAJOR", "MINOR", "PATCH"} <= parts.keys():
            return f"{parts['MAJOR']}.{parts['MINOR']}.{parts['PATCH']}"
    return None


def problems(stage: str, tokenizer_type: Optional[str] = None, copy_to: Optional[str] = None) -> list[str]:
    """Missing or too-old packages for a stage, as sentences (empty when all fit)."""
    wanted = dict(REQUIREMENTS.get(stage, {}))
    if stage in ("preprocess", "train") and tokenizer_type in TOKENIZER_DISTS:
        for dist in TOKENIZER_DISTS[tokenizer_type]:
            wanted[dist] = "2022.1" if dist == "regex" else "0.1"
    if stage == "checkpoint" and copy_to and "://" in copy_to:
        wanted["fsspec"] = "2023.1"  # the lingjun-slurm[remote] extra, plus the protocol's package
    out = []
    for dist, floor in wanted.items():
        have = installed(dist)
        if have is None:
            out.append(f"{dist}>={floor} is not installed")
        elif version_tuple(have) < version_tuple(floor):
            out.append(f"{dist} {have} is older than the {floor} this stage needs")
    return out


def check(stage: str, tokenizer_type: Optional[str] = None, copy_to: Optional[str] = None) -> Optional[str]:
    """One message for the user, or None."""
    found = problems(stage, tokenizer_type, copy_to)
    if not found:
        return None
    import sys

    return (f"lingjun-slurm: the {stage} stage cannot run with this Python ({sys.executable}): "
            + "; ".join(found)
            + ". Use an image that has them (docs/shipping-code.md), or ship wheels built for this image's "
              "Python with the run (run.ship_wheels).")
