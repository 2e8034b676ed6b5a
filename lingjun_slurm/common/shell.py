"""Shell words: user values are always quoted; only the tool's own expressions are not."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Shell:
    """A shell expression written by the tool itself (e.g. '"$PLAN"'), emitted verbatim.

    Never build one from a user value: user values are plain str and get quoted.
    """

    expr: str

    def __str__(self) -> str:
        return self.expr


Word = Union[str, Shell]


_BARE_RE = re.compile(r"[A-Za-z0-9_@%+:,./-]+")


def quote(word: Word) -> str:
    """Single-quote unless the word is plainly safe (stricter than shlex: '=' and '#' are quoted)."""
    if isinstance(word, Shell):
        return word.expr
    text = str(word)
    if _BARE_RE.fullmatch(text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def join(words: "list[Word] | tuple[Word, ...]") -> str:
    return " ".join(quote(w) for w in words)


def to_json(word: Word) -> "str | dict[str, str]":
    return {"shell": word.expr} if isinstance(word, Shell) else word
