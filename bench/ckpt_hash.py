"""The cost of the hash check before a resume: a torch_dist checkpoint loaded with and without it.

    .venv/bin/python bench/ckpt_hash.py [--ranks 2] [--gib 2] [--repeat 5] [--dir DIR] [--keep] [--json]

Starts --ranks processes (torch.distributed, gloo, 127.0.0.1, CPU). They save one checkpoint of
--gib GiB with megatron-core's dist_checkpointing.save (torch_dist, the trainer's strategy: each
rank writes its own shards, two writer threads each) into DIR/iter_0000001, then write its
manifest the way the trainer's save does (lingjun_slurm/injob/train/hashcheck.py save_manifest, each
rank hashing the files it wrote), and then load it --repeat times in each of three ways, in
alternating order, in the same run:

  load         dist_checkpointing.load alone
  cheap+load   rank 0's structure-and-sizes check (LINGJUN_VERIFY_CHECKPOINT=cheap, the old default)
               and the load
  hash+load    the trainer's default (train/resume.py check_all_ranks, then the load): the cheap
               check, then every file of the manifest hashed by exactly one rank, all ranks in
               parallel, threads in each, the verdict combined across ranks; then the load. The
               hash is the manifest's XXH3-128 (python-xxhash; checkpoint/manifest.py)
  sha256+load  the same with the manifest's SHA-256s: what an image without xxhash gets

Each time is the slowest rank's (barriers around it). The files are in the page cache for every
load (written just before, 2 GiB fits), so the load is at its fastest and the check's share at its
largest; on a parallel filesystem the load waits for the network and the ratio is smaller.
With --cold every load starts with the checkpoint's files evicted from the page cache
(posix_fadvise DONTNEED on those files only), so the load reads the disk, and the hash thread and
the load read the same files at the same time. `ratio` = median(hash+load) / median(load): the
budget is 1.10. Writes only under DIR (default: a
new directory under /tmp, removed at the end unless --keep). Needs torch and megatron-core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TENSORS_PER_RANK = 16
MODES = ("load", "cheap+load", "hash+load", "sha256+load")


class _Rt:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size


def _state(rank: int, world: int, per_rank_bytes: int, empty: bool) -> dict:
    import torch
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    rows = per_rank_bytes // TENSORS_PER_RANK // (1024 * 4)  # fp32 rows of 1024
    out: dict = {"iteration": 1, "args": {"bench": True}}
    gen = torch.Generator().manual_seed(1234 + rank)
    for i in range(TENSORS_PER_RANK):
        t = torch.empty(rows, 1024) if empty else torch.randn(rows, 1024, generator=gen)
        out[f"layer{i}.weight"] = ShardedTensor.from_rank_offsets(f"layer{i}.weight", t, (0, rank, world))
    out["rng_state"] = ShardedObject("rng_state", [{"rank": rank}], (world,), (rank,), replica_id=0)
    return out


def _evict(iter_dir: Path) -> None:
    """Drop the checkpoint's pages from the page cache (posix_fadvise DONTNEED on its files only)."""
    for path in iter_dir.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def worker(rank: int, world: int, ckpt_dir: str, gib: float, repeat: int, cold: bool = False) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    from lingjun_slurm.injob.train import cpu_compat, hashcheck, resume

    import logging

    # sha256+load stands in for an image without xxhash: the trainer's warning saying so is not news here
    logging.getLogger("lingjun_slurm.injob.train.resume").setLevel(logging.ERROR)
    cpu_compat.activate()  # megatron-core's CUDA-only calls on the CPU, as the trainer runs them
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=world)
    rt = _Rt(rank, world)
    per_rank = int(gib * 2**30 / world)
    iter_dir = Path(ckpt_dir) / "iter_0000001"
    if rank == 0:
        iter_dir.mkdir(parents=True)
    dist.barrier()
    state = _state(rank, world, per_rank, empty=False)
    t0 = time.perf_counter()
    dist_checkpointing.save(state, str(iter_dir), get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    t_save = time.perf_counter() - t0
    del state
    files, size, t_manifest = hashcheck.save_manifest(rt, str(iter_dir), 1)
    dist.barrier()
    t_manifest_all = time.perf_counter() - t0 - t_save
    if rank == 0:
        (Path(ckpt_dir) / "latest_checkpointed_iteration.txt").write_text("1\n")

    def once(mode: str) -> float:
        import gc

        gc.collect()  # the previous mode's 1 GiB of tensors is freed before the clock starts, not during
        if cold and rank == 0:
            _evict(iter_dir)
        dist.barrier()
        start = time.perf_counter()
        pending = None
        chooser = hashcheck.algorithm_for
        if mode == "sha256+load":
            hashcheck.algorithm_for = lambda files: "sha256"
        try:
            if mode != "load":  # resume.start_check: rank 0's cheap check, then the hash threads start
                problems, pending = resume.start_check(rt, ckpt_dir, 1, "cheap" if mode == "cheap+load" else "hash")
                assert not problems, problems
            if pending is not None:  # the trainer's order: the verdict before the load
                assert getattr(pending, "algorithm") == ("sha256" if mode == "sha256+load" else "xxh3_128")
                assert not resume.hash_verdict(rt, ckpt_dir, 1, pending)
        finally:
            hashcheck.algorithm_for = chooser
        loaded = dist_checkpointing.load(_state(rank, world, per_rank, empty=True), str(iter_dir))
        assert loaded["layer0.weight"].numel() > 0
        del loaded
        dist.barrier()
        return time.perf_counter() - start

    once("load")  # warm-up: imports, the first metadata read
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(repeat):
        order = MODES if r % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            times[mode].append(once(mode))
    if rank == 0:
        print(json.dumps({"ranks": world, "bytes": size, "files": files, "save_s": t_save,
                          "manifest_s": t_manifest_all, "times": times}), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dir", help="checkpoint directory to create (default: a new one under /tmp)")
    p.add_argument("--keep", action="store_true", help="leave the checkpoint behind")
    p.add_argument("--cold", action="store_true",
                   help="evict the checkpoint's files from the page cache before every load (posix_fadvise)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker is not None:
        worker(a.worker, a.ranks, a.dir, a.gib, a.repeat, a.cold)
        return 0
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="lingjun-bench-hash-", dir="/tmp"))
    ckpt = base / "ckpt"
    env = {**os.environ, "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONWARNINGS": "ignore"}
    try:
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), "--ranks", str(a.ranks),
                                   "--dir", str(ckpt), "--gib", str(a.gib), "--repeat", str(a.repeat)]
                                  + (["--cold"] if a.cold else []),
                                  env=env, stdout=subprocess.PIPE, text=True, cwd=str(REPO)) for r in range(a.ranks)]
        outs = [pr.communicate()[0] for pr in procs]
        if any(pr.returncode for pr in procs):
            print(f"a rank failed: exit codes {[pr.returncode for pr in procs]}", file=sys.stderr)
            return 1
        result = json.loads(outs[0].strip().splitlines()[-1])
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in result["times"].items()}
    result["median_s"] = med
    result["ratio"] = med["hash+load"] / med["load"]
    result["ratio_vs_cheap"] = med["hash+load"] / med["cheap+load"]
    if a.json:
        print(json.dumps(result, indent=1))
        return 0
    gib = result["bytes"] / 2**30
    print(f"checkpoint: {gib:.2f} GiB in {result['files']} files, {result['ranks']} ranks (gloo, CPU, "
          f"{os.cpu_count()} CPUs), page cache {'cold (evicted before every load)' if a.cold else 'warm'}")
    print(f"save {result['save_s']:.2f} s; manifest at save (each rank hashes what it wrote) "
          f"{result['manifest_s']:.2f} s = {100 * result['manifest_s'] / result['save_s']:.0f}% of the save")
    print(f"{'mode':12} {'median s':>9} {'GiB/s':>7}   runs")
    for m in MODES:
        runs = " ".join(f"{t:.2f}" for t in result["times"][m])
        print(f"{m:12} {med[m]:9.2f} {gib / med[m]:7.2f}   {runs}")
    print(f"ratio hash+load / load: {result['ratio']:.2f} (budget 1.10); "
          f"hash+load / cheap+load: {result['ratio_vs_cheap']:.2f}; "
          f"sha256+load / load: {med['sha256+load'] / med['load']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
