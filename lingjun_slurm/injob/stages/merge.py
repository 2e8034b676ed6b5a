"""The built-in merge stage: the preprocess shards -> {output_prefix}_{key}_document.bin/.idx.

    python3 -m lingjun_slurm.stages merge --plan PLAN.json  ->  main(plan)

Like a preprocess shard (data/resume.py), a merge whose inputs are unchanged is skipped: after a
merge, {shard_dir}/merge.done (written last, atomically) records what it was made from: every
shard's .done marker (by SHA-256: it carries the fingerprint of that shard's inputs, tokenizer
and flags), the size and mtime of every shard .bin/.idx, the SHA-256 of each shard .idx's 34-byte
header (dtype, sequence and document counts), and the size and mtime of every output it wrote:
checking it reads a few bytes per shard, never the data. A rerun (resubmit --from merge, or a resubmit from preprocess where every shard was
skipped) whose shards all still check out (data.shard.check_shards) and whose record matches
prints "already done" and leaves the outputs alone; anything else merges again. The record is
removed before a merge starts, so an interrupted merge is never taken for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Optional

from ..host import stagenotes
from ..data import DataError
from ..data.writer import HEADER_BYTES

MERGE_MARKER = "merge.done"
MERGE_FORMAT = 2  # 2: + the SHA-256 of each shard .idx header


def marker_file(shard_dir: str) -> str:
    return os.path.join(shard_dir, MERGE_MARKER)


def _stat(path: str) -> Optional[list[int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _digest(path: str, limit: int = -1) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read(limit)).hexdigest()
    except OSError:
        return None


def inputs_record(ds: Any) -> dict[str, Any]:
    """What the merge outputs are made from: the shards' markers and files, the keys, the targets."""
    from ..data.resume import dataset_prefix, marker_path

    shards = []
    for shard in range(ds.shards):
        files = {f"{key}{ext}": _stat(dataset_prefix(ds.shard_dir, shard, key) + ext)
                 for key in ds.keys for ext in (".bin", ".idx")}
        headers = {key: _digest(dataset_prefix(ds.shard_dir, shard, key) + ".idx", HEADER_BYTES) for key in ds.keys}
        shards.append({"marker_sha256": _digest(marker_path(ds.shard_dir, shard)), "files": files,
                       "idx_header_sha256": headers})
    return {"format": MERGE_FORMAT, "keys": list(ds.keys), "shards": shards,
            "targets": [f"{ds.output_prefix}_{key}_document" for key in ds.keys]}


def outputs_record(ds: Any) -> dict[str, Optional[list[int]]]:
    return {f"{ds.output_prefix}_{key}_document{ext}": _stat(f"{ds.output_prefix}_{key}_document{ext}")
            for key in ds.keys for ext in (".bin", ".idx")}


def is_done(ds: Any) -> bool:
    try:
        with open(marker_file(ds.shard_dir), encoding="utf-8") as fh:
            marker = json.load(fh)
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("inputs") != inputs_record(ds):
        return False
    outputs = outputs_record(ds)
    return all(v is not None for v in outputs.values()) and marker.get("outputs") == outputs


def write_marker(ds: Any, summary: dict[str, Any]) -> None:
    path = marker_file(ds.shard_dir)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"inputs": inputs_record(ds), "outputs": outputs_record(ds), "summary": summary}, fh,
                  indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(plan: dict, stage: str = "merge") -> int:
    """Merge every json key's shards in shard order; 1 with a clear message when a shard is missing.
    0 without merging when merge.done matches the current shards and outputs. `stage`: the stage
    whose `status` REASON gets the cause (preprocess when it merges its one shard itself)."""
    from ..data.shard import DataSettings, check_shards, run_merge

    try:
        ds = DataSettings.from_plan(plan)
        check_shards(ds)  # the shards are current (their fingerprints match the plan) before anything else
        if is_done(ds):
            print(f"merge: already done ({marker_file(ds.shard_dir)} matches the shards and the outputs); "
                  "skipping", file=sys.stderr, flush=True)
            return 0
        try:
            os.unlink(marker_file(ds.shard_dir))
        except FileNotFoundError:
            pass
        summary = run_merge(ds)
        write_marker(ds, summary)
    except DataError as exc:
        print(f"lingjun-slurm: merge: {exc}", file=sys.stderr, flush=True)
        stagenotes.note_failure(stagenotes.run_dir_of(plan), stage, str(exc))
        return 1
    except OSError as exc:
        from lingjun_slurm.common.diskspace import no_space_reason

        where = f"{exc.filename}: " if exc.filename else ""
        print(f"lingjun-slurm: merge: {where}{exc.strerror or exc}", file=sys.stderr, flush=True)
        stagenotes.note_failure(stagenotes.run_dir_of(plan), stage,
                                no_space_reason(exc.filename, exc.errno) or f"{where}{exc.strerror or exc}")
        return 1
    return 0
