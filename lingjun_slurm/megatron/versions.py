"""Megatron-LM versions: parsing, the supported floor, and which flags a version has.

Megatron-LM tags its releases core_vX.Y.Z (megatron-core X.Y.Z); older images carry
calendar tags such as 23.06 (PAI's megatron-training:23.06 images). The supported floor
is the megatron-core 0.16 era; flags and their first/last versions live in
presets/megatron_flags.yaml, so adding a version is a data change.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..presets import load

FLOOR = (0, 16)
FLOOR_TEXT = "core_v0.16.x (megatron-core 0.16)"
# The first minor release past the newest one checked (main at package version 0.20.0): a version from
# CEILING on is refused until tools/megatron_reference.py has been run on it (docs/megatron-versions.md).
CEILING = (0, 21)
NEWEST_TEXT = "0.20.0 (Megatron-LM main at d98e8a64ddf3, 2026-08-22)"

# Conventions that changed between releases, from the pinned reference data (tests/fixtures/megatron/):
# core_v0.17.0 dropped --legacy-tokenizer (megatron/training/tokenizer is gone): GPT2BPETokenizer builds
# HF's AutoTokenizer.from_pretrained("gpt2", vocab_file=..., merges_file=...), which needs the Hub.
NO_LEGACY_TOKENIZER = (0, 17, 0)
# core_v0.17.0: HuggingFaceTokenizer includes the post-processor's special tokens by default
# (--tokenizer-hf-include-special-tokens deprecated, removed in 0.18; --tokenizer-hf-no-include-special-tokens).
HF_SPECIAL_TOKENS_DEFAULT = (0, 17, 0)
# core_v0.18.0: NullTokenizer(--vocab-size N) has N ids with eod N-1; before, N+1 ids with eod N.
NULL_VOCAB_HOLDS_EOD = (0, 18, 0)

# Checkpoints: what a megatron-core older than the writer cannot read (docs/megatron-versions.md,
# "A checkpoint of a newer megatron-core"; lingjun_slurm/injob/checkpoint/verify.py version_mismatch).
# megatron-core records no version of its own in a checkpoint (metadata.json is CheckpointingConfig:
# sharded_backend, sharded_backend_version and, up to 0.18, common_backend[_version];
# dist_checkpointing/core.py at core_v0.16.1 and core_v0.19.0), so the version is read from evidence.
#
# core_v0.19.0 (Megatron-LM commit 40b1fd37c1 "deprecate common strategy", 2026-07-08): no common.pt;
# the common state (args, iteration, ...) is the ShardedObject "common_state" inside the .distcp shards
# and metadata.json has no common_backend (dist_checkpointing/serialization.py save :439-445,
# load_common_state_dict :206-237, which still reads a legacy common.pt). megatron-core 0.16.1's
# load_common_state_dict reads common.pt only (strategies/common.py load_common :74-97).
COMMON_STATE_IN_SHARDS = (0, 19, 0)
# Classes Megatron-LM pickles into a checkpoint's common state (its args), by the first release that
# has them: an older megatron-core cannot unpickle that state (pickle's find_class: AttributeError,
# or torch.load(weights_only=True)'s "Unsupported global"). Found with pickletools in the common state
# of the checkpoints of tests/fixtures/megatron/checkpoints (core_v0.16.1 .. main d98e8a6), each
# class looked up at every tag: the others (megatron.core.enums.ModelType,
# megatron.core.transformer.enums.AttnBackend, megatron.core.rerun_state_machine.RerunMode/RerunState)
# are in core_v0.16.0 already. A class that is not listed here is named as "newer than" the running one.
CLASSES_SINCE: dict[str, Version] = {
    # core_v0.18.0 megatron/core/transformer/enums.py:101 (absent at core_v0.17.1); in args from 0.18
    "megatron.core.transformer.enums.InferenceCudaGraphScope": (0, 18, 0),
}


def version_text(version: tuple[int, ...]) -> str:
    """(0, 19, 0) -> '0.19'; (0, 18, 2) -> '0.18.2'."""
    parts = list(version)
    while len(parts) > 2 and parts[-1] == 0:
        parts.pop()
    return ".".join(map(str, parts))

_CORE_RE = re.compile(r"^(?:core_[vr])?v?(\d+)\.(\d+)(?:\.(\d+))?(?:rc\d+)?$")
_CALENDAR_RE = re.compile(r"^(\d{2})\.(\d{2})(?:[.-].*)?$")

Version = tuple[int, int, int]


def parse_version(raw: str | float | int) -> Version:
    """'0.16.1' / 'core_v0.16.1' / 'core_r0.16.0' -> (0, 16, 1); ValueError otherwise.

    Calendar versions (e.g. '23.06') and anything below the floor get an error naming it.
    """
    text = str(raw).strip()
    cal = _CALENDAR_RE.match(text)
    if cal and int(cal.group(1)) >= 19:
        raise ValueError(
            f"Megatron-LM {text} is a calendar release that predates the supported floor {FLOOR_TEXT}; "
            "use an image with megatron-core >= 0.16 and give its version, e.g. '0.16.1'"
        )
    match = _CORE_RE.match(text)
    if not match:
        raise ValueError(f"expected a Megatron-LM version like '0.16.1' or 'core_v0.16.1', got {text!r}")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
    if version[:2] < FLOOR:
        raise ValueError(
            f"Megatron-LM {text} is older than the supported floor {FLOOR_TEXT}; "
            "use an image with megatron-core >= 0.16"
        )
    if version[:2] >= CEILING:
        raise ValueError(
            f"Megatron-LM {text} is newer than the newest version checked, {NEWEST_TEXT}; supported: 0.16 .. "
            f"0.{CEILING[1] - 1}.x (docs/megatron-versions.md says how a version is added)"
        )
    return version


def null_vocab_arg(vocab_size: int, version: Version) -> int:
    """--vocab-size for the null tokenizer so that every version has vocab_size + 1 ids with eod vocab_size.

    That is the spec's meaning (ids 0..vocab_size-1 plus eod), core_v0.16's NullTokenizer and the builtin
    preprocessor's; from 0.18 NullTokenizer counts the eod inside --vocab-size.
    """
    return vocab_size + 1 if version >= NULL_VOCAB_HOLDS_EOD else vocab_size


def tokenizer_problem(tok_type: str, version: Version) -> str | None:
    """Why that Megatron-LM version cannot build this tokenizer type offline, or None."""
    if tok_type == "gpt2-bpe" and version >= NO_LEGACY_TOKENIZER:
        return (f"Megatron-LM {'.'.join(map(str, version))} has no --legacy-tokenizer (gone since 0.17): its "
                "GPT2BPETokenizer loads 'gpt2' from the Hugging Face Hub even with vocab_file/merge_file, which "
                "fails on an offline cluster; save the BPE as a tokenizer.json directory and use type: "
                "huggingface, or declare megatron_lm.version 0.16.x")
    return None


@lru_cache(maxsize=None)
def _table() -> dict[str, dict[str, tuple[Version | None, Version | None]]]:
    out: dict[str, dict[str, tuple[Version | None, Version | None]]] = {}
    for script, flags in load("megatron_flags.yaml").items():
        out[script] = {}
        for flag, rng in flags.items():
            since = parse_version(rng["since"]) if rng.get("since") else None
            until = _parse_any(rng["removed"]) if rng.get("removed") else None
            out[script][flag] = (since, until)
    return out


def _parse_any(text: str) -> Version:
    match = _CORE_RE.match(str(text))
    if not match:
        raise ValueError(f"bad version in megatron_flags.yaml: {text!r}")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def has_flag(script: str, flag: str, version: Version) -> bool:
    """True if that script of that Megatron-LM version accepts the flag.

    A flag missing from the table is a programming error: every flag this tool emits is
    listed there, with the version range it exists in.
    """
    try:
        since, removed = _table()[script][flag]
    except KeyError:
        raise KeyError(f"{script} flag {flag} is not in megatron_flags.yaml") from None
    if since is not None and version < since:
        return False
    return not (removed is not None and version >= removed)


def known_flags(script: str) -> list[str]:
    return sorted(_table()[script])
