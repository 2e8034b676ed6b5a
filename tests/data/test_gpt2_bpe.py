"""The GPT-2 BPE: `tokenizers`' fast path and our Python path both equal Megatron's algorithm
(tests/data/gpt2_reference.py), including unicode and whitespace edge cases."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from lingjun_slurm.injob.data import gpt2_bpe
from lingjun_slurm.injob.data.tokenizer import TokenizerSpec, build
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
    assert fast.encode_batch(texts) == want


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


# --- characters newer than this Python's Unicode database (issue 18 item 5) ---------------------

MEGATRON_GIT = Path(os.environ.get("LINGJUN_MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo"))
MEGATRON_REF = "core_v0.16.1"
NEW_LETTER = "\U00031350"  # CJK Ext H (Unicode 15.0): Lo to `regex`, unassigned (Cn) to Python 3.11


def _tiny_files(tmp_path: Path) -> tuple[str, str, dict[str, int]]:
    """All 256 byte symbols, <|endoftext|>, and merges building NEW_LETTER's 4 UTF-8 bytes, then 'd' + it."""
    table = gpt2_bpe.BYTE_TABLE
    letter = "".join(table[b] for b in NEW_LETTER.encode("utf-8"))
    vocab = {table[b]: b for b in range(256)}
    merges = [(letter[0], letter[1]), (letter[:2], letter[2]), (letter[:3], letter[3]), ("d", letter)]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab[gpt2_bpe.EOD_TOKEN] = len(vocab)
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
                                         encoding="utf-8")
    return str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), vocab


def _megatron_gpt2(vocab: str, merges: str, tmp_path: Path):
    """Megatron-LM's own GPT2Tokenizer (core_v0.16.1), from a local git mirror, or None."""
    if not (MEGATRON_GIT / "HEAD").exists():
        return None
    proc = subprocess.run(["git", "--git-dir", str(MEGATRON_GIT), "show",
                           f"{MEGATRON_REF}:megatron/training/tokenizer/gpt2_tokenization.py"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    source = tmp_path / "megatron_gpt2_tokenization.py"
    source.write_text(proc.stdout, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("megatron_gpt2_tokenization", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    tok = module.GPT2Tokenizer(vocab, merges, errors="replace", special_tokens=[], max_len=None)
    return lambda text: tok.convert_tokens_to_ids(tok.tokenize(text))


def _newer_texts() -> list[str]:
    """Texts around code points Python 3.11 calls unassigned and `regex` assigns (letters, digits)."""
    regex = pytest.importorskip("regex")
    newer = [chr(c) for c in range(0x80, sys.maxunicode + 1)
             if unicodedata.category(chr(c)) == "Cn" and regex.match(r"[\p{L}\p{N}]", chr(c))]
    assert NEW_LETTER in newer
    rng = random.Random(18)
    picks = [NEW_LETTER, "\U00011F50"] + rng.sample(newer, min(200, len(newer)))
    return ([f"ad{NEW_LETTER}b d{NEW_LETTER} {NEW_LETTER}d", f"x  {NEW_LETTER}1", "plain ascii text"] +
            [f"d{c}{c}d 1{c} {c}'s  d{c}" for c in picks])


def test_a_merge_across_d_and_a_unicode_15_letter_gives_megatrons_ids(tmp_path: Path) -> None:
    """'d' + U+31350 is one word to Megatron (`regex`: \\p{L}), two to Python 3.11's unicodedata:
    the merge across them must apply, on the fast and on the Python path."""
    vocab, merges, ids = _tiny_files(tmp_path)
    encoder, ranks = gpt2_bpe.load_files(vocab, merges)
    assert gpt2_bpe.fast_path_problem(encoder, ranks) is None
    fast, slow = gpt2_bpe.fast_tokenizer(encoder, ranks), gpt2_bpe.SlowBPE(encoder, ranks)
    table = gpt2_bpe.BYTE_TABLE
    d_letter = "d" + "".join(table[b] for b in NEW_LETTER.encode("utf-8"))
    want = [ids["a"], ids[d_letter]]
    assert gpt2_bpe.pretokenize("ad" + NEW_LETTER) == ["ad" + NEW_LETTER]
    assert slow.encode("ad" + NEW_LETTER) == want
    assert fast.encode_batch(["ad" + NEW_LETTER, "abc"]) == [want, [ids["a"], ids["b"], ids["c"]]]
    megatron = _megatron_gpt2(vocab, merges, tmp_path)
    if megatron is not None:
        assert megatron("ad" + NEW_LETTER) == want


def test_newer_code_points_split_as_regex_does_on_both_paths(tmp_path: Path) -> None:
    """Texts with characters assigned after Unicode 14: both paths give the ids of Megatron-LM's own
    GPT2Tokenizer when its source is at hand (a Megatron-LM git mirror), and always the ids of
    Megatron's algorithm on `regex`'s split (tests/data/gpt2_reference.py's BPE on pattern words)."""
    vocab, merges, _ = _tiny_files(tmp_path)
    encoder, ranks = gpt2_bpe.load_files(vocab, merges)
    fast, slow = gpt2_bpe.fast_tokenizer(encoder, ranks), gpt2_bpe.SlowBPE(encoder, ranks)
    texts = _newer_texts()
    import regex

    pat = regex.compile(gpt2_bpe.PATTERN)
    ref = ReferenceGPT2(vocab, merges)
    want = [[i for w in pat.findall(t) for i in ref.encode_word(w)] for t in texts]
    assert [slow.encode(t) for t in texts] == want
    assert fast.encode_batch(texts) == want
    megatron = _megatron_gpt2(vocab, merges, tmp_path)
    if megatron is None:
        pytest.skip(f"no Megatron-LM git mirror at {MEGATRON_GIT} (LINGJUN_MEGATRON_LM_GIT): checked against "
                    "the regex split only")
    assert [megatron(t) for t in texts] == want


def test_has_newer_characters() -> None:
    assert not gpt2_bpe.has_newer_characters("ascii only")
    assert not gpt2_bpe.has_newer_characters("\u4e2d\u6587 \U0001F642 \u00e9")
    assert gpt2_bpe.has_newer_characters("x" + NEW_LETTER)
