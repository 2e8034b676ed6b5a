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

import json
import unicodedata
from typing import Any

from . import DataError

EOD_TOKEN = "<|endoftext|>"
CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # 's|'t|'re|'ve|'m|'ll|'d, tried in this order
# The characters the `regex` module's \s matches (the Unicode White_Space property); note that
# str.isspace() also accepts U+001C..U+001F, which \s does not.
WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                       "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


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


def _kind(ch: str) -> str:
    if ch in WHITESPACE:
        return "S"
    cat = unicodedata.category(ch)[0]
    return cat if cat in ("L", "N") else "O"


def pretokenize(text: str) -> list[str]:
    """GPT-2's pattern  's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    as a scanner: at each position the first alternative that matches wins."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "'":
            suffix = next((s for s in CONTRACTIONS if text.startswith(s, i + 1)), None)
            if suffix is not None:
                out.append(text[i:i + 1 + len(suffix)])
                i += 1 + len(suffix)
                continue
        j = i + 1 if ch == " " and i + 1 < n and _kind(text[i + 1]) != "S" else i
        kind = _kind(text[j])
        if kind != "S":  # ' ?\p{L}+', ' ?\p{N}+' or ' ?[^\s\p{L}\p{N}]+'
            end = j + 1
            while end < n and _kind(text[end]) == kind:
                end += 1
            out.append(text[i:end])
            i = end
            continue
        end = i + 1
        while end < n and text[end] in WHITESPACE:
            end += 1
        if end < n and end - i >= 2:  # \s+(?!\S): leave the last blank to the word after it
            end -= 1
        out.append(text[i:end])
        i = end
    return out


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


def fast_tokenizer(encoder: dict[str, int], ranks: dict[tuple[str, ...], int]) -> Any:
    """A `tokenizers.Tokenizer` computing the same ids (only valid when fast_path_problem is None)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    merges = [pair for pair, _ in sorted(ranks.items(), key=lambda kv: kv[1]) if len(pair) == 2]
    tok = Tokenizer(models.BPE(vocab=dict(encoder), merges=merges))  # type: ignore[arg-type]
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return tok
