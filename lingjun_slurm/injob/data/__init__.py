"""The built-in data pipeline: jsonl (plain, .gz, .zst) -> Megatron .bin/.idx, byte-identical to
Megatron-LM's tools/preprocess_data.py, sharded over a Slurm array and merged afterwards.

Modules: `inputs` (globs, shard assignment, streaming lines), `tokenizer` (the four tokenizer kinds),
`gpt2_bpe` (Megatron's GPT-2 BPE), `encode` (json line -> documents, the worker pool), `writer`
(megatron-core's .bin/.idx format in numpy, temp names, merge), `resume` (fingerprints and .done
markers), `progress`. Nothing here imports torch or megatron-core.
See docs/preprocessing.md.
"""

from __future__ import annotations


class DataError(Exception):
    """A problem with the data or the settings; the stages print it as one line and exit 1."""
