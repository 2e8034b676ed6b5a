"""An independent, deliberately plain implementation of Megatron-LM's GPT-2 BPE for the tests,
following megatron/training/tokenizer/gpt2_tokenization.py step by step with Python's `re`: the
pattern's \\p{L}/\\p{N} become explicit character classes built from unicodedata, \\s the White_Space
set that the `regex` module uses."""

from __future__ import annotations

import functools
import json
import re
import sys
import unicodedata

WHITE_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
               0x202F, 0x205F, 0x3000]


def _char_class(codepoints: list[int]) -> str:
    parts, start, prev = [], None, None
    for cp in codepoints + [None]:  # type: ignore[list-item]
        if start is not None and cp == prev + 1:
            prev = cp
            continue
        if start is not None:
            parts.append(re.escape(chr(start)) + ("-" + re.escape(chr(prev)) if prev != start else ""))
        start = prev = cp
    return "".join(parts)


@functools.lru_cache(maxsize=1)
def pattern() -> re.Pattern:
    letters, numbers = [], []
    for cp in range(sys.maxunicode + 1):
        cat = unicodedata.category(chr(cp))
        if cat.startswith("L"):
            letters.append(cp)
        elif cat.startswith("N"):
            numbers.append(cp)
    L, N, S = _char_class(letters), _char_class(numbers), _char_class(WHITE_SPACE)
    return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")


def bytes_to_unicode() -> dict[int, str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, [chr(c) for c in chars]))


class ReferenceGPT2:
    def __init__(self, vocab_file: str, merges_file: str) -> None:
        with open(vocab_file, encoding="utf-8") as fh:
            self.encoder = json.load(fh)
        with open(merges_file, encoding="utf-8") as fh:
            merges = fh.read().split("\n")[1:-1]
        self.ranks = dict(zip([tuple(m.split()) for m in merges], range(len(merges))))
        self.byte_encoder = bytes_to_unicode()

    def bpe(self, token: str) -> list[str]:
        word = tuple(token)
        if len(word) < 2:
            return [token]
        while True:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
        return list(word)

    def encode_word(self, piece: str) -> list[int]:
        """The ids of one pre-tokenized word."""
        mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
        return [self.encoder.get(tok, 0) for tok in self.bpe(mapped)]

    def encode(self, text: str) -> list[int]:
        return [i for piece in pattern().findall(text) for i in self.encode_word(piece)]
