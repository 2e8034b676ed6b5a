"""Shared helpers for tests/data: fixture paths, plans, running the stages, reading documents back."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "data"
CORPUS = FIXTURES / "corpus"
TOKS = FIXTURES / "tokenizers"
GOLDEN = FIXTURES / "golden"
UPDATE = os.environ.get("LINGJUN_UPDATE_GOLDEN") == "1"

TOKENIZERS: dict[str, dict[str, Any]] = {
    "null": {"type": "null", "vocab_size": 512},
    "hf": {"type": "huggingface", "path": str(TOKS / "hf")},
    "hf-nospecial": {"type": "huggingface", "path": str(TOKS / "hf" / "tokenizer.json"), "add_special_tokens": False},
    "gpt2": {"type": "gpt2-bpe", "vocab_file": str(TOKS / "gpt2" / "vocab.json"),
             "merge_file": str(TOKS / "gpt2" / "merges.txt")},
    "sp": {"type": "sentencepiece", "path": str(TOKS / "sp" / "tok.model")},
}
KEYS = {"null": ["ids"]}
DEFAULT_KEYS = ["text", "title"]


def keys_for(name: str) -> list[str]:
    return KEYS.get(name, DEFAULT_KEYS)


def make_plan(out: Path, tokenizer: dict[str, Any], keys: list[str], inputs: list[str] | None = None,
              shards: int = 1, workers: int = 1, append_eod: bool = True) -> dict[str, Any]:
    data = {"tool": "builtin", "inputs": inputs or [str(CORPUS / "*.jsonl")], "json_keys": keys,
            "train_key": None, "tokenizer": tokenizer, "append_eod": append_eod, "shards": shards,
            "workers": workers, "output_prefix": str(out / "corpus"), "prefix": None, "split": "969,30,1",
            "shard_dir": str(out / "corpus.shards"), "train_prefix": str(out / "corpus_text_document")}
    return {"schema": 1, "run_id": "test", "settings": {"data": data}}


def run_all(plan: dict[str, Any]) -> None:
    from lingjun_slurm.injob.stages import merge, preprocess

    for shard in range(plan["settings"]["data"]["shards"]):
        assert preprocess.main(plan, shard) == 0
    assert merge.main(plan) == 0


def read_documents(prefix: str | Path) -> tuple[list[list[int]], list[list[int]], Any]:
    """(token ids per document, sentence lengths per document, dtype), through megatron-core."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    ds = IndexedDataset(str(prefix))
    bounds = ds.document_indices
    docs, lens = [], []
    for d in range(len(bounds) - 1):
        seqs = [ds[s].tolist() for s in range(int(bounds[d]), int(bounds[d + 1]))]
        docs.append([t for seq in seqs for t in seq])
        lens.append([len(seq) for seq in seqs])
    return docs, lens, ds.index.dtype


def corpus_rows() -> list[dict[str, Any]]:
    """The corpus read independently of the implementation: every non-blank line, files sorted."""
    rows = []
    for path in sorted(CORPUS.glob("*.jsonl")):
        for raw in path.read_bytes().split(b"\n"):
            if raw.strip():
                rows.append(json.loads(raw.decode("utf-8")))
    return rows


def expected_documents(rows: list[dict[str, Any]], key: str, tokenize, eod: int) -> tuple[list, list]:
    """Megatron's Encoder.encode rule: texts (or lists of texts) tokenized, empty ones dropped, EOD
    appended to the last sentence of a non-empty document."""
    docs, lens = [], []
    for row in rows:
        value = row[key]
        ids: list[int] = []
        sentence_lens: list[int] = []
        for text in value if isinstance(value, list) else [value]:
            got = tokenize(text)
            if got:
                ids.extend(got)
                sentence_lens.append(len(got))
        if ids:
            ids.append(eod)
            sentence_lens[-1] += 1
        docs.append(ids)
        lens.append(sentence_lens)
    return docs, lens
