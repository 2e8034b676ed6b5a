"""Megatron-LM's GPT-2 byte-level BPE (megatron/training/tokenizer/gpt2_tokenization.py, GPT2Tokenizer),
re-implemented: the same vocab/merges parsing, pre-tokenization pattern, byte-to-unicode table,
merge order and unknown-token rule (id 0).

Two paths give the same ids:
- fast: `tokenizers`' BPE model + ByteLevel pre-tokenizer (Rust, batch-parallel), used when the
  files satisfy the conditions under which its merge algorithm provably equals Megatron's
  (checked by `fast_path_problem`; see docs/preprocessing.md);
- slow: `SlowBPE` below, a direct Python implementation of Megatron's algorithm, otherwise.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import unicodedata
from typing import Any

from . import DataError

EOD_TOKEN = "<|endoftext|>"
# megatron/training/tokenizer/gpt2_tokenization.py (core_v0.16.1) GPT2Tokenizer.__init__, with
# `import regex as re`: the same pattern through the same engine (the `regex` package), so letters
# and numbers are those of regex's Unicode tables, not of this Python's unicodedata (14.0 in 3.11).
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_table() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to
    themselves, the other 68 bytes to U+0100 upwards in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TABLE = byte_table()
_BYTE_CHARS = [BYTE_TABLE[b] for b in range(256)]


def load_files(vocab_file: str, merge_file: str) -> tuple[dict[str, int], dict[tuple[str, ...], int]]:
    """vocab.json -> encoder; merges.txt -> rank per pair, parsed like Megatron: the text (universal
    newlines) split on '\\n' without its first line (the '#version' header) and its last element
    (after the final newline); each line split on whitespace; a repeated pair keeps its last rank."""
    try:
        with open(vocab_file, encoding="utf-8") as fh:
            encoder = json.load(fh)
        with open(merge_file, encoding="utf-8") as fh:
            lines = fh.read().split("\n")[1:-1]
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read the GPT-2 vocab/merges ({vocab_file}, {merge_file}): {exc}") from None
    if not isinstance(encoder, dict):
        raise DataError(f"{vocab_file}: expected a JSON object token -> id")
    ranks: dict[tuple[str, ...], int] = {}
    for rank, line in enumerate(lines):
        ranks[tuple(line.split())] = rank
    return encoder, ranks


@functools.lru_cache(maxsize=1)
def pattern() -> Any:
    """Megatron's pre-tokenization pattern, compiled by the `regex` package (as Megatron does)."""
    try:
        import regex
    except ImportError:
        raise DataError("the gpt2-bpe tokenizer needs the `regex` package (Megatron-LM's pattern engine for "
                        "its GPT-2 pre-tokenizer): pip install regex") from None
    return regex.compile(PATTERN)


def pretokenize(text: str) -> list[str]:
    """re.findall(self.pat, text), as GPT2Tokenizer.tokenize does."""
    return pattern().findall(text)


_TABLE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _unknown_to_python() -> Any:
    """A boolean table over all code points: True where this Python's unicodedata says unassigned
    (Cn). The fast path's pre-tokenizer (Oniguruma inside `tokenizers`) and the `regex` package
    agree on every code point assigned in Unicode 14 (tests/data/test_gpt2_bpe.py); characters
    assigned later are classified by whichever tables each engine ships, so texts holding any of
    them are split by `regex` here instead."""
    import numpy as np

    table = np.zeros(sys.maxunicode + 1, dtype=bool)
    cat = unicodedata.category
    table[[c for c in range(0x80, sys.maxunicode + 1) if cat(chr(c)) == "Cn"]] = True
    return table


def has_newer_characters(text: str) -> bool:
    """Whether `text` has a code point that is unassigned in this Python's Unicode database."""
    if text.isascii():
        return False
    import numpy as np

    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    with _TABLE_LOCK:  # encode threads (data/encode.py) build the table once, not once each
        table = _unknown_to_python()
    return bool(table[points].any())


class SlowBPE:
    """Megatron's GPT2Tokenizer.encode, in Python (errors='replace' only matters for decoding)."""

    def __init__(self, encoder: dict[str, int], ranks: dict[tuple[str, ...], int]) -> None:
        self.encoder = encoder
        self.ranks = ranks
        self.cache: dict[str, list[str]] = {}

    def _bpe(self, token: str) -> list[str]:
        cached = self.cache.get(token)
        if cached is not None:
            return cached
        word = list(token)
        while len(word) > 1:
            best, best_rank = None, None
            for pair in zip(word, word[1:]):
                rank = self.ranks.get(pair)
                if rank is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = pair, rank
            if best is None:
                break
            first, second = best
            merged: list[str] = []
            i = 0
            while i < len(word):  # every non-overlapping occurrence, left to right
                if i + 1 < len(word) and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        if len(self.cache) > 200_000:  # Megatron's cache is unbounded; the result is the same
            self.cache.clear()
        self.cache[token] = word
        return word

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        get = self.encoder.get
        for piece in pretokenize(text):
            mapped = "".join(_BYTE_CHARS[b] for b in piece.encode("utf-8"))
            ids.extend(get(tok, 0) for tok in self._bpe(mapped))
        return ids


def fast_path_problem(encoder: dict[str, int], ranks: dict[tuple[str, ...], int]) -> str | None:
    """Why `tokenizers`' BPE could differ from Megatron's algorithm on these files (None: it cannot).

    Its heap-based merge equals Megatron's repeated lowest-rank merge when every byte symbol is in
    the vocab (else Megatron emits id 0 where `tokenizers` would drop the symbol), every merge and
    its result are in the vocab, ids are unique, and every merge ranks after the merges that
    produce its two parts (so a merge never becomes available before an earlier-ranked one ends).
    """
    missing = [c for c in _BYTE_CHARS if c not in encoder]
    if missing:
        return f"{len(missing)} byte symbols are not in the vocab"
    if len(set(encoder.values())) != len(encoder):
        return "the vocab has repeated ids"
    produced: dict[str, int] = {}
    for pair, rank in ranks.items():
        if len(pair) == 2:
            produced[pair[0] + pair[1]] = max(rank, produced.get(pair[0] + pair[1], -1))
    for pair, rank in ranks.items():
        if len(pair) != 2:
            continue
        a, b = pair
        if a not in encoder or b not in encoder or a + b not in encoder:
            return f"merge {a!r} {b!r} has a part or a result outside the vocab"
        if produced.get(a, -1) >= rank or produced.get(b, -1) >= rank:
            return f"merge {a!r} {b!r} (rank {rank}) uses a token produced by a later merge"
    return None


class FastBPE:
    """`tokenizers`' BPE + ByteLevel pre-tokenizer (only valid when fast_path_problem is None); a
    text with characters newer than this Python's Unicode database is pre-tokenized by `regex`
    (Megatron's engine) and its words encoded by the same BPE without a regex split."""

    def __init__(self, encoder: dict[str, int], ranks: dict[tuple[str, ...], int]) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers

        merges = [pair for pair, _ in sorted(ranks.items(), key=lambda kv: kv[1]) if len(pair) == 2]
        self.tokenizer = Tokenizer(models.BPE(vocab=dict(encoder), merges=merges))  # type: ignore[arg-type]
        self.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self.words = Tokenizer(models.BPE(vocab=dict(encoder), merges=merges))  # type: ignore[arg-type]
        self.words.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        pattern()  # the regex package is there before the first batch

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        batch = getattr(self.tokenizer, "encode_batch_fast", None) or self.tokenizer.encode_batch
        out = [e.ids for e in batch(texts, add_special_tokens=False)]
        newer = [i for i, t in enumerate(texts) if has_newer_characters(t)]
        if newer:
            words = [pretokenize(texts[i]) for i in newer]
            by_words = getattr(self.words, "encode_batch_fast", None) or self.words.encode_batch
            for i, enc in zip(newer, by_words(words, is_pretokenized=True, add_special_tokens=False)):
                out[i] = enc.ids
        return out


def fast_tokenizer(encoder: dict[str, int], ranks: dict[tuple[str, ...], int]) -> FastBPE:
    """The fast path (only valid when fast_path_problem is None)."""
    return FastBPE(encoder, ranks)
