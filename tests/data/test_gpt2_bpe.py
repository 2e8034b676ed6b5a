"""The GPT-2 BPE: `tokenizers`' fast path and our Python path both equal Megatron's algorithm
(tests/data/gpt2_reference.py), including unicode and whitespace edge cases."""

from __future__ import annotations

import random
import sys
import unicodedata
from pathlib import Path

import pytest

from lingjun_slurm.data import gpt2_bpe
from lingjun_slurm.data.tokenizer import TokenizerSpec, build
from tests.data.gpt2_reference import ReferenceGPT2, pattern
from tests.data.helpers import TOKENIZERS, TOKS

VOCAB, MERGES = str(TOKS / "gpt2" / "vocab.json"), str(TOKS / "gpt2" / "merges.txt")
EDGE_TEXTS = [
    "", " ", "  ", "\n", " \n ", "a", " a", "a ", "a  b", "a\t\tb", "a \t b", "a\n\nb", "\r\n\r\n", "x\u00a0y",
    "x \u00a0 y", "x\u2028y", "x\x85y", "x\x1fy", "x\x1c\x1d\x1e y", "x\u200by", "\u3000\u3000word",
    "it's IT'S it'S I'm you're we'll they'd we've don't", "''", "'", "'s's", " 's", "l'été",
    "e\u0301t\u00e9 ma\u00f1ana", "\u4e2d\u6587 \u65e5\u672c", "\U0001F642\U0001F642 \U0001F680x",
    "1\u0661\u00bd\u2167 3.14 1,000", "a_b-c.d/e\\f", "<|endoftext|>", "tab\tend\t", "trailing   ",
    "\u0645\u0631\u062d\u0628\u0627 \u0928\u092e\u0938\u094d\u0924\u0947", "Ǆ ǅ ǆ Ⅻ ⅻ",
]


@pytest.fixture(scope="module")
def ref() -> ReferenceGPT2:
    return ReferenceGPT2(VOCAB, MERGES)


def _fast_and_slow():
    encoder, ranks = gpt2_bpe.load_files(VOCAB, MERGES)
    assert gpt2_bpe.fast_path_problem(encoder, ranks) is None
    fast = gpt2_bpe.fast_tokenizer(encoder, ranks)
    return fast, gpt2_bpe.SlowBPE(encoder, ranks)


def test_fast_and_slow_paths_equal_the_reference(ref: ReferenceGPT2) -> None:
    fast, slow = _fast_and_slow()
    rng = random.Random(4)
    alphabet = list(" \t\n\r\x0b\x0c\x85\xa0\u2028\u3000\x1f'sStTreldmv1٣½aAé中!?.,-_\U0001F642\u0301")
    texts = EDGE_TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16))) for _ in range(3000)]
    want = [ref.encode(t) for t in texts]
    assert [slow.encode(t) for t in texts] == want
    assert [e.ids for e in fast.encode_batch(texts, add_special_tokens=False)] == want


def _all_assigned_chars() -> list[str]:
    return [chr(cp) for cp in range(sys.maxunicode + 1)
            if unicodedata.category(chr(cp)) not in ("Cn", "Cs", "Co")]  # private use: all "other"


def test_pretokenization_agrees_on_every_assigned_code_point() -> None:
    """Every character assigned in this Python's Unicode database (14.0 for 3.11), in contexts that
    exercise letters/numbers/other runs, the optional space and the whitespace lookahead: our scanner,
    `tokenizers`' ByteLevel pre-tokenizer (Oniguruma) and the reference pattern all split the same.
    (Characters assigned after that version may be classified differently; see docs.)"""
    from tokenizers import pre_tokenizers

    chars = _all_assigned_chars()
    text = "".join(f"a{c} {c}{c}\n{c}" for c in chars)
    ours = gpt2_bpe.pretokenize(text)
    assert ours == pattern().findall(text)
    table = gpt2_bpe.BYTE_TABLE
    mapped = ["".join(table[b] for b in piece.encode("utf-8")) for piece in ours]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    assert [p for p, _ in byte_level.pre_tokenize_str(text)] == mapped


def test_optional_cross_check_with_the_regex_module() -> None:
    regex = pytest.importorskip("regex")  # what Megatron-LM itself uses; not a dependency here
    pat = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    text = "".join(f"a{c}b {c}{c}  {c}'s{c} 1{c}\n{c}" for c in _all_assigned_chars())  # more contexts
    assert pat.findall(text) == gpt2_bpe.pretokenize(text)


def test_merges_are_parsed_like_megatron(tmp_path: Path) -> None:
    """First line always dropped (the #version header), last element dropped (after the final
    newline, so a file without one loses its last merge), a repeated pair keeps its last rank."""
    (tmp_path / "m.txt").write_text("a b\nb c\nc d\na b")
    (tmp_path / "v.json").write_text('{"a": 0}')
    _, ranks = gpt2_bpe.load_files(str(tmp_path / "v.json"), str(tmp_path / "m.txt"))
    assert ranks == {("b", "c"): 0, ("c", "d"): 1}
    (tmp_path / "m.txt").write_text("#version: 0.2\r\nx y\r\nz w\r\nx y\r\n")
    _, ranks = gpt2_bpe.load_files(str(tmp_path / "v.json"), str(tmp_path / "m.txt"))
    assert ranks == {("x", "y"): 2, ("z", "w"): 1}


def _tiny(tmp_path: Path, vocab: dict[str, int], merges: list[str]) -> TokenizerSpec:
    import json

    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    return TokenizerSpec("gpt2-bpe", vocab_file=str(tmp_path / "vocab.json"), merge_file=str(tmp_path / "merges.txt"))


def test_files_tokenizers_would_merge_differently_take_the_python_path(tmp_path: Path) -> None:
    """A merge ranked before the merge that produces its part: Megatron merges all (a, b) first
    ('ab ab'); a heap-based merge would take 'ab'+'a' as soon as it appears ('aba b')."""
    vocab = {gpt2_bpe.BYTE_TABLE[b]: b for b in range(256)}
    vocab.update({"ab": 256, "aba": 257, "<|endoftext|>": 258})
    spec = _tiny(tmp_path, vocab, ["ab a", "a b"])
    tok = build(spec, need_eod=True)
    assert isinstance(tok.backend, gpt2_bpe.SlowBPE) and "later merge" in tok.describe
    ref = ReferenceGPT2(spec.vocab_file, spec.merge_file)
    assert tok.encode_batch(["abab"]) == [ref.encode("abab")] == [[256, 256]]


def test_unknown_symbols_are_id_0_like_megatron(tmp_path: Path) -> None:
    vocab = {"h": 5, "i": 6, "hi": 7, "<|endoftext|>": 8}  # no other byte symbols: Megatron gives 0
    spec = _tiny(tmp_path, vocab, ["h i"])
    tok = build(spec, need_eod=True)
    assert isinstance(tok.backend, gpt2_bpe.SlowBPE)
    assert tok.encode_batch(["hi ih!"]) == [[7, 0, 6, 5, 0]] == [ReferenceGPT2(spec.vocab_file, spec.merge_file).encode("hi ih!")]
    assert (tok.vocab_size, tok.eod) == (4, 8)


def test_endoftext_in_the_text_is_plain_text_not_the_eod_id() -> None:
    tok = build(TokenizerSpec(**{k: v for k, v in TOKENIZERS["gpt2"].items()}), need_eod=True)
    ids = tok.encode_batch(["<|endoftext|>"])[0]
    assert tok.eod not in ids and len(ids) > 1
