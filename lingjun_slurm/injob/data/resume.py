"""Resume: a shard is done when its `.done` marker (written last, atomically) carries the fingerprint
of the current inputs, tokenizer and flags and every output it lists exists. Anything else (no
marker, another fingerprint, a missing file) means the shard is redone from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from . import DataError
from .encode import EncodeSettings
from .inputs import Piece

MARKER_FORMAT = 1


def shard_prefix(shard_dir: str, shard: int) -> str:
    return os.path.join(shard_dir, f"shard_{shard:05d}")


def dataset_prefix(shard_dir: str, shard: int, key: str) -> str:
    """The naming the megatron-lm tool path renders too: shard_NNNNN_{key}_document."""
    return f"{shard_prefix(shard_dir, shard)}_{key}_document"


def marker_path(shard_dir: str, shard: int) -> str:
    return f"{shard_prefix(shard_dir, shard)}.done"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise DataError(f"cannot read tokenizer file {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()


def tokenizer_identity(settings: EncodeSettings) -> dict[str, Any]:
    """What the ids depend on: the tokenizer kind, its files' content, the flags."""
    spec = settings.tokenizer
    return {
        "type": spec.type,
        "vocab_size": spec.vocab_size,
        "add_special_tokens": spec.add_special_tokens if spec.type == "huggingface" else None,
        "files": {path: sha256_file(path) for path in spec.files()},
        "json_keys": list(settings.keys),
        "append_eod": settings.append_eod,
    }


def fingerprint(shard: int, shards: int, pieces: list[Piece], settings: EncodeSettings) -> dict[str, Any]:
    return {
        "format": MARKER_FORMAT,
        "shard": shard,
        "shards": shards,
        "inputs": [p.describe() for p in pieces],
        "tokenizer": tokenizer_identity(settings),
    }


def read_marker(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_done(shard_dir: str, shard: int, fp: dict[str, Any], keys: tuple[str, ...]) -> bool:
    marker = read_marker(marker_path(shard_dir, shard))
    if not marker or marker.get("fingerprint") != fp:
        return False
    return all(os.path.isfile(dataset_prefix(shard_dir, shard, k) + ext) for k in keys for ext in (".bin", ".idx"))


def write_marker(shard_dir: str, shard: int, fp: dict[str, Any], summary: dict[str, Any]) -> None:
    path = marker_path(shard_dir, shard)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"fingerprint": fp, "summary": summary}, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
