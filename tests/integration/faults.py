"""Fault injection on the one-host test Slurm cluster, for tests/integration/test_faults_slurm.py
and bench/faults.py: a training spec that recovers, the ranks of a running train step, and the
faults themselves (a rank killed or stopped, a node lost, a byte flipped in a checkpoint).

Every node of the test cluster is a slurmd on this machine (lingjun_slurm/devcluster.py); a rank
is found by the stack file it opens at start (lingjun_slurm/injob/stacks.py: <node>-rank<R>-pid<P>.txt
under <run_dir>/stacks/<job>-<restart>/), so a fault hits exactly one rank of one node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from .helpers import chain_spec

STACK_FILE = re.compile(r"^(?P<node>.+)-rank(?P<rank>\d+)-pid(?P<pid>\d+)\.txt$")


def train_spec(tmp: Path, name: str, *, data_prefix: Optional[str] = None, nodes: int = 2, iterations: int = 40,
               save_interval: int = 10, hang_timeout: int = 15, preflight: bool = True, max_restarts: int = 3,
               ckpt_dir: Optional[str] = None, extra_training: Optional[dict[str, Any]] = None) -> Path:
    """A DP=`nodes` builtin GPT on the CPU, one task per node, saving every `save_interval`
    iterations, with the fault handling on (pre-flight, a short hang timeout, exclusion). Without
    `data_prefix` the chain makes and preprocesses its own corpus first."""
    work = tmp / name
    corpus = work / "corpus"
    stages: dict[str, Any] = {"checkpoint": {"skip": True}}
    data: dict[str, Any] = {"tokenizer": {"type": "null", "vocab_size": 128}}
    if data_prefix:
        stages.update(preprocess={"skip": True}, merge={"skip": True})
        data["prefix"] = data_prefix
    else:
        data.update(inputs=[str(corpus / "*.jsonl")], shards=1, workers=1)
        stages["commands"] = [{"name": "make-corpus", "before": "preprocess", "container": False,
                               "command": f"python3 -m lingjun_slurm.data.synthetic {corpus} --docs 300 --vocab 127"}]
    doc: dict[str, Any] = {
        "version": 1,
        "run": {"name": name, "workdir": str(work)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:15:00"},
                    "stages": {"train": {"nodes": nodes, "tasks_per_node": 1, "gpus_per_node": 0,
                                         "cpus_per_task": 1}}},
        "container": {"runtime": "none"},
        "data": data,
        "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
        "parallelism": {"micro_batch": 2, "global_batch": 4 * nodes},
        "training": {"entrypoint": "builtin", "iterations": iterations, "lr": 3e-3, "min_lr": 3e-4,
                     "lr_warmup_iters": 2, "precision": "fp32", "log_interval": 1, "eval_interval": 100000,
                     "eval_iters": 0, "save_grace_s": 60, "max_restarts": max_restarts,
                     "preflight": preflight, "hang_timeout": hang_timeout, "hang_startup_timeout": 300,
                     "exclude_bad_nodes": 2, **(extra_training or {})},
        "checkpoint": {"save_interval": save_interval, "keep_last": 3, **({"dir": ckpt_dir} if ckpt_dir else {})},
        "stages": stages,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def last_iteration(run_dir: Path) -> int:
    return max((r["iteration"] for r in records(run_dir) if r.get("type") == "train"), default=0)


def tracker(ckpt_dir: Path) -> int:
    try:
        return int((ckpt_dir / "latest_checkpointed_iteration.txt").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def ranks(run_dir: Path) -> dict[int, tuple[str, int]]:
    """rank -> (node, pid) of the newest attempt whose ranks are alive."""
    best: dict[int, tuple[str, int]] = {}
    stacks = run_dir / "stacks"
    if not stacks.is_dir():
        return best
    for attempt in sorted(stacks.iterdir(), key=lambda p: p.stat().st_mtime):
        found = {}
        for f in attempt.iterdir():
            m = STACK_FILE.match(f.name)
            if m and Path(f"/proc/{m['pid']}").exists():
                found[int(m["rank"])] = (m["node"], int(m["pid"]))
        if found:
            best = found
    return best


def wait_until(pred, timeout: float, what: str, poll: float = 0.2) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_for_rank(run_dir: Path, rank: int, after_iteration: int, timeout: float = 240) -> tuple[str, int]:
    """(node, pid) of `rank` once training has passed `after_iteration`."""
    def ready() -> Optional[tuple[str, int]]:
        if last_iteration(run_dir) <= after_iteration:
            return None
        return ranks(run_dir).get(rank)
    return wait_until(ready, timeout, f"rank {rank} past iteration {after_iteration}")


def signal_rank(pid: int, sig: signal.Signals) -> None:
    os.kill(pid, sig)


def node_processes(cluster_root: Path, node: str) -> list[int]:
    """Every process of a test-cluster node: its slurmd, and the slurmstepds (and their tasks) that
    hold files under its spool dir (SlurmdSpoolDir=<root>/spool/%n: each step's socket is there)."""
    spool = str(cluster_root / "spool" / node)
    pids: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if cmd and cmd[0].endswith(b"slurmd") and node.encode() in cmd:
                pids.add(int(proc.name))
                continue
            if not any(b"slurmstepd" in c for c in cmd[:1]):
                continue
            for fd in (proc / "fd").iterdir():
                try:
                    if os.readlink(fd).startswith(spool):
                        pids.add(int(proc.name))
                        break
                except OSError:
                    continue
        except OSError:
            continue
    # and their descendants (the tasks)
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    todo, out = list(pids), set(pids)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return sorted(out)


def lose_node(cluster_root: Path, node: str, rank_pid: Optional[int] = None) -> list[int]:
    """SIGKILL the node's slurmd, its slurmstepds and their tasks (and `rank_pid`): to slurmctld the
    node stops answering, as a machine that lost power would."""
    pids = node_processes(cluster_root, node) + ([rank_pid] if rank_pid else [])
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def flip_byte(ckpt_dir: Path, iteration: int) -> Path:
    """Flip one byte in the middle of the largest shard of iter_<iteration>."""
    it = ckpt_dir / f"iter_{iteration:07d}"
    shard = max((p for p in it.rglob("*.distcp")), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


def resumes(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer's start records (iteration: where each attempt resumed)."""
    return [r for r in records(run_dir) if r.get("type") == "start"]


def first_train_after(run_dir: Path, t: float) -> Optional[dict[str, Any]]:
    return next((r for r in records(run_dir) if r.get("type") == "train" and r["time"] > t), None)


ITERATIONS_STANDIN = 4

# The stand-in's preamble: where the tracker is, which rank and attempt this is.
PREAMBLE = """\
import os, pathlib, signal, sys, time
ckpt = pathlib.Path({ckpt!r})
rank = int(os.environ["SLURM_PROCID"])
attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
pathlib.Path({pids!r}).mkdir(parents=True, exist_ok=True)
pathlib.Path({pids!r}, f"{{attempt}}-{{rank}}-{{os.environ['SLURMD_NODENAME']}}").write_text(str(os.getpid()))
def finish():
    if rank == 0:
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / "latest_checkpointed_iteration.txt").write_text("{iterations}")
    sys.exit(0)
"""


def megatron_standin_spec(tmp: Path, body: str, *, max_restarts: int = 3, exclude: int = 2) -> tuple[Path, Path]:
    """(spec, pids dir): a 2-node, 1-task-per-node `entrypoint: megatron-lm` train stage whose
    pretrain_gpt.py is a stand-in, PREAMBLE + body: what it does per rank (SLURM_PROCID) and
    attempt (SLURM_RESTART_COUNT) is the fault; finish() writes Megatron's tracker at the last
    iteration, as Megatron-LM's rank 0 does. Files under tmp (megatron/, work/, pids/, s.yaml)."""
    mlm = tmp / "megatron"
    mlm.mkdir()
    ckpt = tmp / "work" / "checkpoints"
    pids = tmp / "pids"
    (mlm / "pretrain_gpt.py").write_text(PREAMBLE.format(ckpt=str(ckpt), pids=str(pids), iterations=ITERATIONS_STANDIN)
                                         + body)
    spec = chain_spec(tmp / "s.yaml", tmp / "work", [])
    doc = yaml.safe_load(spec.read_text())
    doc["stages"] = {"preprocess": {"skip": True}, "merge": {"skip": True}, "checkpoint": {"skip": True}}
    # Megatron-LM needs GPUs (a spec check): the test cluster's are gres device files, enough for srun.
    doc["cluster"]["stages"] = {"train": {"partition": "gpu", "nodes": 2, "tasks_per_node": 1, "gpus_per_node": 1}}
    doc["megatron_lm"] = {"version": "0.16.1", "path": str(mlm)}
    doc["data"] = {"prefix": str(tmp / "data" / "corpus_text_document"), "tokenizer": {"type": "null", "vocab_size": 512}}
    doc["model"] = {"preset": "tiny", "vocab_size": 512}
    doc["parallelism"] = {"micro_batch": 1, "global_batch": 2}
    doc["training"] = {"entrypoint": "megatron-lm", "iterations": ITERATIONS_STANDIN, "max_restarts": max_restarts,
                       "save_grace_s": 60, "preflight": False, "exclude_bad_nodes": exclude}
    doc["checkpoint"] = {"dir": str(ckpt)}
    spec.write_text(yaml.safe_dump(doc))
    return spec, pids
