"""A preprocess array of many shards with a `%` limit from the spec, on a 64-node dev cluster,
against a bare `sbatch --array` of the same rendered script in the same run (issue 31, item 1b).

    .venv/bin/python bench/scale_array.py [--shards 1024] [--max-running 16] [--nodes 64] [--json]

Starts its own dev cluster (lingjun_slurm.devcluster: --nodes slurmd processes, 2 CPUs each, no
GPUs, accounting on (sacct), fast timers, MaxArraySize 4001; root /tmp/lj-P-<pid>, ports from
22000; needs root and Debian's Slurm) and always stops it. Through the library the CLI uses
(load_spec + prepare + submit_slurm, LocalTransport whose history counts the Slurm commands):

- the tool: submit the chain preprocess (array 0-(S-1)%M, builtin tokenizer "null", one input
  file cut into S byte ranges) -> merge; wait for the end with one StatusCollector refresh every
  2 s (its Slurm calls per refresh recorded); squeue at each refresh gives the RUNNING tasks of
  the array, and sacct at the end every task's start and end: the largest number that ran at
  once must be <= M (real evidence of Slurm's limit); then one status refresh of the finished
  run (calls, seconds) and the report's data (report/data.collect: its commands and its file
  reads counted: the markers come in one read_dir_files);
- the reference: the shard outputs removed, `sbatch --parsable --array=0-(S-1)%M` of the same
  rendered preprocess.sbatch, waited for the same way (squeue only), its concurrency from sacct;
  then the ratios tool/bare of submit time and of array wall time (first start to last end).
No thresholds: a benchmark. Exits non-zero on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from lingjun_slurm.common.errors import LingjunError
from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.runs.manifest import load_manifest
from lingjun_slurm.spec import load_spec
from lingjun_slurm.status import StatusCollector
from lingjun_slurm.submit import new_run_id, prepare, submit_slurm
from lingjun_slurm.transport import LocalTransport

FIRST_PORT = 22000
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")


class BenchError(Exception):
    pass


class CountingTransport(LocalTransport):
    """LocalTransport counting its file reads too (read_text/read_bytes/read_range, listdir,
    read_dir_files), and the seconds spent inside commands."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()
        self.command_s = 0.0

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        start = time.perf_counter()
        try:
            return super()._run(argv, cwd=cwd, env=env, input=input, timeout=timeout)
        finally:
            self.command_s += time.perf_counter() - start

    def read_bytes(self, path: str) -> bytes:
        self.reads["read_bytes"] += 1
        if "/jobs/" in path:
            self.reads["read_bytes of a jobs/ marker"] += 1
        return super().read_bytes(path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        self.reads["read_range"] += 1
        return super().read_range(path, offset, length)

    def listdir(self, path: str) -> list[str]:
        self.reads["listdir"] += 1
        return super().listdir(path)

    def read_dir_files(self, path: str, prefix: str = "", max_bytes: int = 1 << 16) -> dict[str, bytes]:
        self.reads["read_dir_files"] += 1
        return super().read_dir_files(path, prefix, max_bytes)


def kinds(history: list[tuple[str, ...]]) -> dict[str, int]:
    """"sbatch", "scontrol release", ... -> count; `env -- NAME=V prog` counted as prog."""
    names = []
    for a in history:
        a = tuple(x for x in a if not (a[0] == "env" and ("=" in x or x in ("env", "--"))))
        names.append(" ".join(a[:2]) if a and a[0] == "scontrol" else (a[0] if a else "env"))
    return dict(sorted(Counter(names).items()))


def write_spec(root: Path, shards: int, max_running: int) -> Path:
    corpus = root / "corpus"
    corpus.mkdir()
    # one input file, cut into `shards` byte ranges at line boundaries (docs/preprocessing.md "Sharding")
    with open(corpus / "c.jsonl", "w") as f:
        for i in range(shards * 4):
            f.write(json.dumps({"text": " ".join(str((i * 7 + j) % 500) for j in range(16))}) + "\n")
    doc = {
        "version": 1,
        "run": {"name": "scale-array", "workdir": str(root / "work")},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:10:00"},
                    "stages": {"preprocess": {"cpus_per_task": 1}, "merge": {"cpus_per_task": 1}}},
        "container": {"runtime": "none"},
        "data": {"inputs": [str(corpus / "c.jsonl")], "shards": shards, "max_running": max_running, "workers": 1,
                 "tokenizer": {"type": "null", "vocab_size": 512}},
        "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}},
    }
    path = root / "spec.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def squeue_running(array_job: str) -> int:
    out = subprocess.run(["squeue", "-h", "-r", "-j", array_job, "-t", "RUNNING", "-o", "%i"],
                         capture_output=True, text=True, timeout=60).stdout
    return sum(1 for line in out.splitlines() if line.strip())


def sacct_tasks(array_job: str) -> list[tuple[int, int, str]]:
    """(start, end, state) of every task of the array, from sacct (epoch seconds)."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", array_job, "--format", "JobID,Start,End,State"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "SLURM_TIME_FORMAT": "%s"})
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and "_" in parts[0] and parts[1].isdigit() and parts[2].isdigit():
            rows.append((int(parts[1]), int(parts[2]), parts[3]))
    return rows


def peak_overlap(rows: list[tuple[int, int, str]]) -> int:
    """The largest number of tasks running at once; sacct counts whole seconds, so a task that ends
    in the second another starts is counted ended first (ends before starts at the same time)."""
    events = sorted([(s, 1) for s, _, _ in rows] + [(e, -1) for _, e, _ in rows])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def wait_array(array_job: str, timeout: float, refresh: Any = None) -> dict[str, Any]:
    """Poll every 2 s until the array has left squeue; the largest RUNNING count seen."""
    seen = 0
    polls = 0
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if refresh is not None:
            refresh()
        n = squeue_running(array_job)
        seen = max(seen, n)
        polls += 1
        left = subprocess.run(["squeue", "-h", "-r", "-j", array_job, "-o", "%i"], capture_output=True, text=True,
                              timeout=60).stdout.strip()
        if not left:
            return {"max_running_seen_in_squeue": seen, "polls": polls}
        time.sleep(2)
    raise BenchError(f"array {array_job} still in the queue after {timeout:g} s")


def run(opts: argparse.Namespace, root: Path) -> dict[str, Any]:
    spec = write_spec(root, opts.shards, opts.max_running)
    index = RunIndex(root / "state")
    t = CountingTransport()
    loaded = load_spec(spec)
    prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
    start = time.perf_counter()
    m = submit_slurm(t, prep, index, echo=lambda line: None)
    submit_s = time.perf_counter() - start
    submit_calls = kinds(t.history)
    submit_in_commands_s = t.command_s
    pre = next(r for r in m.stages if r.kind == "preprocess")
    array_job = pre.job_ids[0]
    refreshes: list[tuple[float, int]] = []

    def refresh() -> None:
        tt = CountingTransport()
        s = time.perf_counter()
        StatusCollector(tt).collect([load_manifest(tt, m.run_dir)])
        refreshes.append((time.perf_counter() - s, len(tt.history)))

    tool_wait = wait_array(array_job, opts.timeout, refresh)
    merge = next(r for r in m.stages if r.kind == "merge").job_ids[0]
    end = time.monotonic() + 300
    while time.monotonic() < end and subprocess.run(["squeue", "-h", "-j", merge], capture_output=True,
                                                    text=True).stdout.strip():
        time.sleep(1)
    time.sleep(3)  # accounting catches up
    tool_rows = sacct_tasks(array_job)

    st = CountingTransport()
    s = time.perf_counter()
    runs = StatusCollector(st).collect([load_manifest(st, m.run_dir)])
    status_s = time.perf_counter() - s
    status_calls = kinds(st.history)
    status_reads = dict(st.reads)  # load_manifest's read included
    states = {x.name: x.state for x in runs[0].stages}

    from lingjun_slurm.report import data as report_data

    rt = CountingTransport()
    s = time.perf_counter()
    rstatus = StatusCollector(rt).collect([load_manifest(rt, m.run_dir)])[0]
    report_status_reads = dict(rt.reads)
    rt.reads.clear()
    calls_before = len(rt.history)
    rdoc = report_data.collect(rt, m, rstatus)
    report_s = time.perf_counter() - s
    report_own_calls = kinds(rt.history[calls_before:])
    pre_doc = next(x for x in rdoc["stages"] if x["kind"] == "preprocess")

    # the reference: the same rendered script, bare sbatch, the shard outputs removed first
    shard_dir = Path(json.loads((Path(m.run_dir) / "plan.json").read_text())["settings"]["data"]["shard_dir"])
    shutil.rmtree(shard_dir, ignore_errors=True)
    array = f"0-{opts.shards - 1}%{opts.max_running}"
    bt = LocalTransport()
    s = time.perf_counter()
    out = bt.run(["sbatch", "--parsable", f"--array={array}", f"{m.run_dir}/{pre.script}"], cwd=m.run_dir,
                 check=True).stdout
    bare_submit_s = time.perf_counter() - s
    bare_job = out.strip().split(";")[0]
    bare_wait = wait_array(bare_job, opts.timeout)
    time.sleep(3)
    bare_rows = sacct_tasks(bare_job)

    def span(rows: list[tuple[int, int, str]]) -> Optional[int]:
        return (max(e for _, e, _ in rows) - min(s for s, _, _ in rows)) if rows else None

    tool_span, bare_span = span(tool_rows), span(bare_rows)
    return {
        "shards": opts.shards, "max_running": opts.max_running, "array": pre.array,
        "stage_states": states,
        "tool": {"submit_s": round(submit_s, 3), "submit_in_commands_s": round(submit_in_commands_s, 3),
                 "submit_calls": submit_calls,
                 "tasks_in_sacct": len(tool_rows), "task_states": dict(Counter(r[2] for r in tool_rows)),
                 "peak_running_sacct": peak_overlap(tool_rows), **tool_wait, "array_wall_s": tool_span,
                 "status_refreshes_while_running": len(refreshes),
                 "status_refresh_calls_max": max((c for _, c in refreshes), default=0),
                 "status_refresh_s_max": round(max((x for x, _ in refreshes), default=0.0), 3),
                 "status_after_s": round(status_s, 3), "status_after_calls": status_calls,
                 "status_after_reads": status_reads,
                 "report_s": round(report_s, 3), "report_calls": kinds(rt.history),
                 "report_status_part_reads": report_status_reads,
                 "report_data_collect_calls": report_own_calls, "report_data_collect_reads": dict(rt.reads),
                 "report_preprocess_attempts": len(pre_doc["attempts"])},
        "bare": {"submit_s": round(bare_submit_s, 3), "tasks_in_sacct": len(bare_rows),
                 "task_states": dict(Counter(r[2] for r in bare_rows)), "peak_running_sacct": peak_overlap(bare_rows),
                 **bare_wait, "array_wall_s": bare_span},
        "ratio_submit_tool_over_bare": round(submit_s / bare_submit_s, 2) if bare_submit_s else None,
        "ratio_array_wall_tool_over_bare": round(tool_span / bare_span, 2) if tool_span and bare_span else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1024)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=1500)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    if opts.shards < 2 or opts.max_running < 1 or not 2 <= opts.nodes <= 128:
        parser.error("--shards >= 2, --max-running >= 1, --nodes 2..128")
    header = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "load_before": open("/proc/loadavg").read().split()[:3], "cpus": os.cpu_count()}
    root = Path(f"/tmp/lj-P-{os.getpid()}")
    root.mkdir(parents=True, exist_ok=True)
    cluster: Optional[DevCluster] = None
    try:
        for base in range(FIRST_PORT, FIRST_PORT + 1000, 400):
            cluster = DevCluster(DevClusterConfig(root=root / "cluster", nodes=opts.nodes, base_port=base,
                                                  cpus_per_node=2, gpus_per_node=0, accounting=True,
                                                  fast_timers=True, cluster_name="lj-p-bench",
                                                  max_array_size=4001))
            if not cluster.ports_in_use():
                break
        else:
            raise BenchError("no free ports from 22000")
        s = time.perf_counter()
        cluster.up(timeout=300)
        header["cluster"] = f"own dev cluster: {opts.nodes} nodes x 2 CPUs, accounting on, fast timers, " \
                            f"MaxArraySize 4001, up in {time.perf_counter() - s:.1f} s"
        os.environ.update(cluster.env)
        with tempfile.TemporaryDirectory(prefix="work-", dir=root) as tmp:
            result = run(opts, Path(tmp))
    except (BenchError, LingjunError, DevClusterError, subprocess.SubprocessError, OSError) as exc:
        print(f"bench/scale_array.py: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.down()
        shutil.rmtree(root, ignore_errors=True)
    header["load_after"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps({"header": header, "result": result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
