"""A deterministic toy corpus for the tiny-gpt example and tests: no downloads, no randomness
beyond a fixed seed, the same bytes on every machine.

    python3 -m lingjun_slurm.data.synthetic OUT_DIR [--docs 2000] [--files 2] [--vocab 511] [--seed 0]

Documents are token ids written as text ("17 203 5 ..."), the input format of Megatron's
NullTokenizer. They follow a sparse Markov chain: every token has four likely successors,
so a model can learn it and the loss falls from ln(vocab) towards the chain's entropy
(about 1.2 nats). Files are written as part-NNNNN.jsonl with {"text": ...} per line;
existing files with the same content are left alone (a rerun changes nothing).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Optional

SUCCESSORS = 4
WEIGHTS = (0.55, 0.25, 0.12, 0.08)


def documents(docs: int, vocab: int, seed: int, min_len: int = 48, max_len: int = 320) -> list[str]:
    rng = random.Random(seed)
    table = [[rng.randrange(vocab) for _ in range(SUCCESSORS)] for _ in range(vocab)]
    out = []
    for _ in range(docs):
        token = rng.randrange(vocab)
        ids = [token]
        for _ in range(rng.randint(min_len, max_len) - 1):
            token = rng.choices(table[token], WEIGHTS)[0]
            ids.append(token)
        out.append(" ".join(map(str, ids)))
    return out


def write_corpus(out: Path, docs: int = 2000, files: int = 2, vocab: int = 511, seed: int = 0) -> list[Path]:
    if docs < 1 or files < 1 or vocab < 2:
        raise ValueError("need docs >= 1, files >= 1 and vocab >= 2")
    texts = documents(docs, vocab, seed)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for f in range(files):
        body = "".join(json.dumps({"text": t}) + "\n" for t in texts[f::files])
        path = out / f"part-{f:05d}.jsonl"
        if not path.exists() or path.read_text(encoding="utf-8") != body:
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(body, encoding="utf-8")
            tmp.replace(path)
        written.append(path)
    return written


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m lingjun_slurm.data.synthetic", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=511, help="token ids 0..vocab-1 (NullTokenizer vocab_size)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = write_corpus(args.out, args.docs, args.files, args.vocab, args.seed)
    except (ValueError, OSError) as exc:
        print(f"lingjun-slurm: {exc}", file=sys.stderr)
        return 1
    total = sum(p.stat().st_size for p in paths)
    print(f"lingjun-slurm: wrote {args.docs} documents ({total / 1e6:.1f} MB) to {len(paths)} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
