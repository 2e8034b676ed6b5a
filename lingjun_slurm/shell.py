"""Shell words: user values are always quoted; only the tool's own expressions are not."""

from __future__ import annotations

import shlex
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


def quote(word: Word) -> str:
    return word.expr if isinstance(word, Shell) else shlex.quote(str(word))


def join(words: "list[Word] | tuple[Word, ...]") -> str:
    return " ".join(quote(w) for w in words)


def to_json(word: Word) -> "str | dict[str, str]":
    return {"shell": word.expr} if isinstance(word, Shell) else word
