"""The four tokenizer kinds, each giving Megatron-LM's ids, EOD id and vocab size (-> .bin dtype).

| spec type      | Megatron --tokenizer-type   | ids                                  | eod                 | vocab size            |
|----------------|-----------------------------|--------------------------------------|---------------------|-----------------------|
| null           | NullTokenizer               | int(x) for x in text.split(' ')      | vocab_size          | vocab_size + 1        |
| huggingface    | HuggingFaceTokenizer        | tokenizer.json encode (+ specials)   | id of eos_token     | vocab incl. added     |
| gpt2-bpe       | GPT2BPETokenizer            | Megatron's GPT-2 BPE (gpt2_bpe.py)   | <|endoftext|>       | len(vocab.json)       |
| sentencepiece  | GPTSentencePieceTokenizer   | SentencePieceProcessor.encode        | eos_id()            | piece count           |

No downloads: every file is local. See docs/preprocessing.md for the Megatron sources.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from . import DataError
from . import gpt2_bpe


class TextError(Exception):
    """A text that cannot be tokenized; `index` is its position in the batch."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.message = message


def optimal_dtype_name(vocab_size: int) -> str:
    """megatron.core.datasets.indexed_dataset.DType.optimal_dtype: uint16 below 65500, else int32."""
    return "uint16" if vocab_size < 65500 else "int32"


@dataclass(frozen=True)
class TokenizerSpec:
    """What settings.data.tokenizer says, plus the HF special-tokens switch (see docs)."""

    type: str
    path: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = None
    add_special_tokens: bool = True

    @classmethod
    def from_settings(cls, tok: dict[str, Any] | None) -> "TokenizerSpec":
        if not tok or not tok.get("type"):
            raise DataError("data.tokenizer is not set: the built-in preprocess stage needs a tokenizer")
        spec = cls(type=tok["type"], path=tok.get("path"), vocab_file=tok.get("vocab_file"),
                   merge_file=tok.get("merge_file"), vocab_size=tok.get("vocab_size"),
                   add_special_tokens=tok.get("add_special_tokens") is not False)  # null/absent: the default, True
        needs = {"null": ["vocab_size"], "huggingface": ["path"], "sentencepiece": ["path"],
                 "gpt2-bpe": ["vocab_file", "merge_file"]}
        if spec.type not in needs:
            raise DataError(f"data.tokenizer.type {spec.type!r} is not one of {sorted(needs)}")
        for name in needs[spec.type]:
            if getattr(spec, name) is None:
                raise DataError(f"data.tokenizer.{name} is required for the {spec.type} tokenizer")
        return spec

    def files(self) -> list[str]:
        """The files whose content defines the ids (hashed into the resume fingerprint)."""
        if self.type == "gpt2-bpe":
            return [str(self.vocab_file), str(self.merge_file)]
        if self.type == "sentencepiece":
            return [str(self.path)]
        if self.type == "huggingface":
            tok_json = hf_tokenizer_json(str(self.path))
            folder = os.path.dirname(tok_json)
            extra = [os.path.join(folder, n) for n in ("tokenizer_config.json", "special_tokens_map.json")]
            return [tok_json, *[p for p in extra if os.path.isfile(p)]]
        return []


def hf_tokenizer_json(path: str) -> str:
    return os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path


@dataclass
class Tokenizer:
    """ids for a batch of texts; `eod` None when the tokenizer has none (fine without append_eod)."""

    spec: TokenizerSpec
    vocab_size: int
    eod: int | None
    backend: Any = field(repr=False, default=None)
    describe: str = ""
    threads: int = -1  # sentencepiece's threads per batch call (-1: its default, every CPU)

    @property
    def dtype_name(self) -> str:
        return optimal_dtype_name(self.vocab_size)

    @property
    def parallel_batches(self) -> bool:
        """Whether encode_batch runs in native code outside the GIL, so that batches on threads side
        by side overlap (data/encode.py): `tokenizers` (huggingface/tokenizers
        bindings/python/src/tokenizer.rs, encode_batch_fast under `py.detach`) and sentencepiece
        (its batch encode releases the GIL: two threads encode two batches in 0.55 of the time of
        one after another, docs/preprocessing.md "Speed"). The null tokenizer and the GPT-2 slow
        path are Python."""
        if self.spec.type in ("huggingface", "sentencepiece"):
            return True
        return isinstance(self.backend, gpt2_bpe.FastBPE)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        kind = self.spec.type
        try:
            if kind == "null":
                return [self._null(i, t) for i, t in enumerate(texts)]
            if kind == "sentencepiece":
                if self.threads > 0:
                    try:
                        return self.backend.encode(texts, out_type=int, num_threads=self.threads)
                    except TypeError:  # a sentencepiece without num_threads
                        pass
                return self.backend.encode(texts, out_type=int)
            if isinstance(self.backend, gpt2_bpe.SlowBPE):
                return [self.backend.encode(t) for t in texts]
            if isinstance(self.backend, gpt2_bpe.FastBPE):
                return self.backend.encode_batch(texts)
            # tokenizers (HF, GPT-2 fast path): encode_batch_fast skips offset tracking (same ids)
            batch = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
            specials = self.spec.add_special_tokens if kind == "huggingface" else False
            return [e.ids for e in batch(texts, add_special_tokens=specials)]
        except (UnicodeEncodeError, TypeError, ValueError):
            for i, t in enumerate(texts):  # find the text (lone surrogates are the usual cause)
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as bad:
                    raise TextError(i, f"the text has a lone surrogate ({t[bad.start]!r}); "
                                       "it cannot be encoded as UTF-8 (Megatron-LM fails on it too)") from None
            raise

    def _null(self, index: int, text: str) -> list[int]:
        # NullTokenizer.tokenize: [int(x) for x in text.split(' ')]
        try:
            ids = [int(x) for x in text.split(" ")]
        except ValueError:
            raise TextError(index, f"the null tokenizer needs space-separated integers, got {text[:60]!r}"
                                   " (one space between ids, no empty text)") from None
        limit = 65535 if self.dtype_name == "uint16" else 2**31 - 1
        low = 0 if self.dtype_name == "uint16" else -(2**31)
        if min(ids) < low or max(ids) > limit:
            value = next(v for v in ids if not low <= v <= limit)
            raise TextError(index, f"token id {value} does not fit the {self.dtype_name} dataset "
                                   f"(vocab_size {self.vocab_size - 1})")
        return ids


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken as saved by transformers
        value = value.get("content")
    return value if isinstance(value, str) else None


def hf_eos_token(tok_json: str) -> str | None:
    """eos_token as transformers would set it: tokenizer_config.json / special_tokens_map.json."""
    folder = os.path.dirname(tok_json)
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            token = _token_text(_read_json(path).get("eos_token"))
            if token is not None:
                found[name] = token
    if len(set(found.values())) > 1:
        raise DataError(f"tokenizer_config.json and special_tokens_map.json in {folder} name different "
                        f"eos tokens {sorted(found.values())}; transformers versions disagree on which wins")
    return next(iter(found.values()), None)


def _check_file(path: str | None, what: str, field: str) -> str:
    """`path` when it is a file; else DataError naming the file and the spec field (the REASON
    `status` shows for the stage: stages/preprocess.py)."""
    if not path or not os.path.isfile(path):
        why = "is not a file" if path and os.path.exists(path) else "does not exist"
        raise DataError(f"tokenizer file {path!r} ({what}, data.tokenizer.{field}) {why}")
    return path


def build(spec: TokenizerSpec, need_eod: bool) -> Tokenizer:
    """Load the tokenizer from local files; errors name the file."""
    if spec.type == "null":
        size = int(spec.vocab_size or 0)
        return Tokenizer(spec, size + 1, size, describe=f"null (vocab_size {size}, eod {size})")
    if spec.type == "sentencepiece":
        import sentencepiece

        path = _check_file(spec.path, "sentencepiece model", "path")
        try:
            sp = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as exc:
            raise DataError(f"cannot load the sentencepiece model {path}: {exc}") from None
        eos = sp.eos_id()
        tok = Tokenizer(spec, sp.get_piece_size(), eos if eos >= 0 else None, sp, f"sentencepiece {path}")
    elif spec.type == "huggingface":
        from tokenizers import Tokenizer as HFTokenizer

        path = _check_file(hf_tokenizer_json(str(spec.path)), "huggingface tokenizer.json", "path")
        try:
            hf = HFTokenizer.from_file(path)
        except Exception as exc:  # the Rust loader raises plain Exception
            raise DataError(f"cannot load the huggingface tokenizer {path}: {exc}") from None
        hf.no_truncation()  # transformers' __call__ turns both off unless asked for
        hf.no_padding()
        eos = hf_eos_token(path)
        eod = hf.token_to_id(eos) if eos is not None else None
        if eos is not None and eod is None:
            raise DataError(f"eos_token {eos!r} of {os.path.dirname(path)} is not in {path}")
        tok = Tokenizer(spec, hf.get_vocab_size(with_added_tokens=True), eod, hf, f"huggingface {path}")
    else:
        encoder, ranks = gpt2_bpe.load_files(_check_file(spec.vocab_file, "GPT-2 vocab file", "vocab_file"),
                                             _check_file(spec.merge_file, "GPT-2 merges file", "merge_file"))
        problem = gpt2_bpe.fast_path_problem(encoder, ranks)
        backend = gpt2_bpe.SlowBPE(encoder, ranks) if problem else gpt2_bpe.fast_tokenizer(encoder, ranks)
        how = f"slow path: {problem}" if problem else "tokenizers fast path"
        tok = Tokenizer(spec, len(encoder), encoder.get(gpt2_bpe.EOD_TOKEN), backend,
                        f"gpt2-bpe {spec.vocab_file} ({how})")
    if need_eod and tok.eod is None:
        hint = {"sentencepiece": "the model has no eos piece (eos_id() is -1)",
                "huggingface": "no eos_token in tokenizer_config.json or special_tokens_map.json",
                "gpt2-bpe": f"{gpt2_bpe.EOD_TOKEN!r} is not in the vocab"}[spec.type]
        raise DataError(f"append_eod is set but the tokenizer has no end-of-document token: {hint}")
    return tok
