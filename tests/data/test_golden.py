"""Byte-exact outputs pinned by golden .bin/.idx files, and the ids in them derived independently.

Regenerate after an intended change (then review the diff):

    LINGJUN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/data
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.data.gpt2_reference import ReferenceGPT2
from tests.data.helpers import (GOLDEN, TOKENIZERS, TOKS, UPDATE, corpus_rows, expected_documents, keys_for,
                                make_plan, read_documents, run_all)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every tokenizer run once over the fixture corpus (one shard, one worker)."""
    out = {}
    for name, tok in TOKENIZERS.items():
        target = tmp_path_factory.mktemp(name)
        run_all(make_plan(target, tok, keys_for(name)))
        out[name] = target
    return out


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_outputs_match_golden_files(name: str, outputs: dict[str, Path]) -> None:
    for key in keys_for(name):
        for ext in (".bin", ".idx"):
            got = outputs[name] / f"corpus_{key}_document{ext}"
            golden = GOLDEN / name / got.name
            if UPDATE:
                golden.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(got, golden)
                continue
            assert golden.is_file(), f"no golden {golden}: run LINGJUN_UPDATE_GOLDEN=1 pytest tests/data"
            assert got.read_bytes() == golden.read_bytes(), (
                f"{got.name} ({name}) differs from {golden} (regenerate with LINGJUN_UPDATE_GOLDEN=1 if intended)")


def _check(name: str, outputs: dict[str, Path], tokenize, eod: int, dtype=np.uint16) -> None:
    rows = corpus_rows()
    for key in keys_for(name):
        docs, lens, got_dtype = read_documents(outputs[name] / f"corpus_{key}_document")
        want_docs, want_lens = expected_documents(rows, key, tokenize, eod)
        assert got_dtype == dtype
        assert docs == want_docs, f"{name}/{key}: token ids differ"
        assert lens == want_lens, f"{name}/{key}: sentence lengths differ"


def test_null_ids_are_the_numbers_in_the_text(outputs: dict[str, Path]) -> None:
    # NullTokenizer: ids = the integers of text.split(' '); EOD = vocab_size (512); dtype by 513 -> uint16
    _check("null", outputs, lambda text: [int(x) for x in text.split(" ")], 512)
    docs, _, _ = read_documents(outputs["null"] / "corpus_ids_document")
    assert docs[0] == [0, 512] and docs[-1] == [7, 512]


def test_huggingface_ids_are_tokenizers_encode_plus_eos(outputs: dict[str, Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TOKS / "hf" / "tokenizer.json"))
    eos = json.loads((TOKS / "hf" / "tokenizer_config.json").read_text())["eos_token"]
    bos = tok.token_to_id("<s>")
    _check("hf", outputs, lambda text: tok.encode(text).ids, tok.token_to_id(eos))
    _check("hf-nospecial", outputs, lambda text: tok.encode(text, add_special_tokens=False).ids, tok.token_to_id(eos))
    docs, _, _ = read_documents(outputs["hf"] / "corpus_title_document")
    assert docs[0][0] == bos  # the post-processor's <s>, once per non-empty text


def test_gpt2_ids_follow_megatrons_algorithm(outputs: dict[str, Path]) -> None:
    ref = ReferenceGPT2(str(TOKS / "gpt2" / "vocab.json"), str(TOKS / "gpt2" / "merges.txt"))
    _check("gpt2", outputs, ref.encode, ref.encoder["<|endoftext|>"])


def test_sentencepiece_ids_are_encode_as_ids_plus_eos(outputs: dict[str, Path]) -> None:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(TOKS / "sp" / "tok.model"))
    _check("sp", outputs, sp.encode_as_ids, sp.eos_id())


def test_megatron_cores_own_tokenizers_agree(outputs: dict[str, Path]) -> None:
    """megatron-core's tokenizer library (the one preprocess_data.py builds without --legacy-tokenizer)
    run on the same corpus: NullTokenizer and SentencePieceTokenizer ids, eod and vocab size."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType
        from megatron.core.tokenizers import MegatronTokenizer
    null = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=512)
    assert (null.vocab_size, null.eod) == (513, 512)
    _check("null", outputs, null.tokenize, null.eod, DType.optimal_dtype(null.vocab_size))
    sp = MegatronTokenizer.from_pretrained(tokenizer_path=str(TOKS / "sp" / "tok.model"),
                                           metadata_path={"library": "sentencepiece"}, legacy=False)
    _check("sp", outputs, sp.tokenize, sp.eod, DType.optimal_dtype(sp.vocab_size))


def test_megatron_core_huggingface_tokenizer_agrees(outputs: dict[str, Path]) -> None:
    """Needs transformers (not a dependency): megatron-core's HuggingFaceTokenizer with and without
    include_special_tokens against our add_special_tokens true/false."""
    pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers import MegatronTokenizer
    for name, include in (("hf", True), ("hf-nospecial", False)):
        tok = MegatronTokenizer.from_pretrained(tokenizer_path=str(TOKS / "hf"), metadata_path={"library": "huggingface"},
                                                include_special_tokens=include, use_fast=True)
        assert tok.vocab_size == 320
        _check(name, outputs, tok.tokenize, tok.eod)


@pytest.mark.parametrize("name", ["null", "gpt2"])
def test_files_equal_what_megatrons_loop_writes(name: str, outputs: dict[str, Path], tmp_path: Path) -> None:
    """The same documents written the way preprocess_data.py does (a plain IndexedDatasetBuilder,
    add_document(doc_ids, sentence_lens) per line, finalize) give the same bytes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    if name == "null":
        tokenize, eod, vocab = (lambda text: [int(x) for x in text.split(" ")]), 512, 513
    else:
        ref = ReferenceGPT2(str(TOKS / "gpt2" / "vocab.json"), str(TOKS / "gpt2" / "merges.txt"))
        tokenize, eod, vocab = ref.encode, ref.encoder["<|endoftext|>"], len(ref.encoder)
    rows = corpus_rows()
    for key in keys_for(name):
        docs, lens = expected_documents(rows, key, tokenize, eod)
        builder = IndexedDatasetBuilder(str(tmp_path / f"{key}.bin"), dtype=DType.optimal_dtype(vocab))
        for ids, sentence_lens in zip(docs, lens):
            builder.add_document(ids, sentence_lens)
        builder.finalize(str(tmp_path / f"{key}.idx"))
        for ext in (".bin", ".idx"):
            assert (tmp_path / f"{key}{ext}").read_bytes() == (outputs[name] / f"corpus_{key}_document{ext}").read_bytes()
