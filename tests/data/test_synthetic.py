"""The tiny-gpt example's corpus generator: deterministic, learnable, NullTokenizer-shaped."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

from lingjun_slurm.injob.data.synthetic import documents, main, write_corpus


def test_same_seed_same_bytes_and_reruns_change_nothing(tmp_path: Path) -> None:
    a = write_corpus(tmp_path / "a", docs=50, files=2, vocab=100, seed=3)
    b = write_corpus(tmp_path / "b", docs=50, files=2, vocab=100, seed=3)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in a]
    assert digest == [hashlib.sha256(p.read_bytes()).hexdigest() for p in b]
    mtimes = [p.stat().st_mtime_ns for p in a]
    write_corpus(tmp_path / "a", docs=50, files=2, vocab=100, seed=3)
    assert [p.stat().st_mtime_ns for p in a] == mtimes
    assert write_corpus(tmp_path / "c", docs=50, files=2, vocab=100, seed=4)[0].read_bytes() != a[0].read_bytes()


def test_text_is_null_tokenizer_input_within_the_vocab(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--docs", "20", "--files", "1", "--vocab", "64"]) == 0
    for line in (tmp_path / "part-00000.jsonl").read_text().splitlines():
        ids = [int(x) for x in json.loads(line)["text"].split(" ")]
        assert ids and all(0 <= i < 64 for i in ids)


def test_the_chain_is_learnable() -> None:
    """The empirical next-token entropy is far below ln(vocab): a model's loss can fall a lot."""
    pairs: dict[int, Counter[int]] = defaultdict(Counter)
    for doc in documents(300, 511, 0):
        ids = [int(x) for x in doc.split()]
        for a, b in zip(ids, ids[1:]):
            pairs[a][b] += 1
    total = sum(sum(c.values()) for c in pairs.values())
    entropy = -sum(n / total * math.log(n / sum(c.values())) for c in pairs.values() for n in c.values())
    assert entropy < 1.5 < math.log(511) - 4
