"""The train chain at 64 nodes on a real Slurm, against bare sbatch of the same scripts (issue 31, item 1a).

    .venv/bin/python bench/scale_train.py [--nodes 64] [--sizes 16,64] [--json]

Starts its own dev cluster (lingjun_slurm.devcluster: `--nodes` slurmd, 2 CPUs and no GPUs each,
accounting on, fast timers, cgroups where writable; root /tmp/lj-N-bench-<pid>, base port from
23000 up; needs root and Debian's Slurm, munge, slurmdbd and MariaDB) and always stops it again.

For each size N (train nodes, at most --nodes) it submits one chain through the library the CLI
uses (load_spec + prepare + submit_slurm, LocalTransport): `make-corpus` (a command stage) ->
`preprocess` (2 shards, builtin tool) -> `merge` -> `train` on N nodes, 1 task per node, with the
pre-flight (training.preflight), the hang watchdog (hang_timeout) and bad-node exclusion on;
checkpoint skipped. Then it runs the chain to the end, refreshing `status` every 2 s as
`status --watch` would.

The train ranks are LIGHT STAND-INS, not torch: a `python3` first on PATH (written by this script)
runs a standard-library rank in place of `python3 -m lingjun_slurm.stages train`, and the real
interpreter for everything else. The rank does a file rendezvous of all WORLD_SIZE ranks on the
shared workdir (each writes its marker and waits for every other one, as torch.distributed's
store rendezvous waits for the world) and then, on rank 0, writes the iteration count to
<checkpoint dir>/latest_checkpointed_iteration.txt, where the train script reads progress. The
point is the control plane (submit, scheduling, srun over N nodes, the pre-flight, the watchdog,
status), not gloo on 2 shared cores: 64 real torch ranks take about 14 GB and minutes of CPU to
import. The collective smoke test (training.preflight_collective_timeout) needs torch ranks: off.

Measured per stage: submit (wall time of its sbatch call inside submit_slurm), time to start
(Slurm's Start - Submit... for a chained stage Start - End of the stage before, its eligible time,
from sacct), run time (End - Start), and for train: the pre-flight (first node report to the
verdict written, and job start to verdict), the watchdog's CPU seconds (ps, while it runs) and
status cost (seconds and Slurm calls per refresh). Reference in the same run: `sbatch --parsable
--hold` of each rendered script (then scancel), and a bare `sbatch -N N --ntasks-per-node=1` of
a script that only does `srun python3 standin_rank.py` with the same stand-in (time to start and
run time). No thresholds: a benchmark, not a test. Exits non-zero on any error.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

from lingjun_slurm.common.errors import LingjunError
from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError, cgroup_problem
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.runs.manifest import load_manifest
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.spec import load_spec
from lingjun_slurm.status import StatusCollector
from lingjun_slurm.submit import new_run_id, prepare, submit_slurm
from lingjun_slurm.transport import LocalTransport

FIRST_PORT = 23000
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED"}

STANDIN = r'''"""Stand-in rank (bench/scale_train.py): standard library only. A file rendezvous of all
WORLD_SIZE ranks on the shared workdir, then rank 0 records STANDIN_ITERS in STANDIN_TRACKER
(<checkpoint dir>/latest_checkpointed_iteration.txt, where the trainer's save records it)."""
import os, sys, time, pathlib
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
rdv = pathlib.Path(os.environ["STANDIN_RDV"]) / os.environ.get("SLURM_JOB_ID", "0")
rdv.mkdir(parents=True, exist_ok=True)
(rdv / str(rank)).write_text(os.uname().nodename)
end = time.monotonic() + 300
while len(os.listdir(rdv)) < world:
    if time.monotonic() > end:
        sys.exit(f"rank {rank}: rendezvous timed out ({len(os.listdir(rdv))} of {world})")
    time.sleep(0.2)
print(f"rank {rank}: all {world} ranks met", flush=True)
tracker = os.environ.get("STANDIN_TRACKER")
if rank == 0 and tracker:
    pathlib.Path(tracker).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(tracker).write_text(os.environ.get("STANDIN_ITERS", "1"))
'''
# First on PATH in the jobs: the train step's `python3 -m lingjun_slurm.stages train` runs the
# stand-in rank; everything else (the pre-flight, the host tools, the data stages) the real interpreter.
PYTHON3 = """#!/bin/bash
if [ "${1:-}" = -m ] && [ "${2:-}" = lingjun_slurm.stages ] && [ "${3:-}" = train ]; then
  exec %(real)s %(standin)s
fi
exec %(real)s "$@"
"""


class BenchError(Exception):
    """The benchmark could not run or the library did not do what it should."""


class TimedTransport(LocalTransport):
    """LocalTransport that records each command's wall time (argv, seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.timed: list[tuple[tuple[str, ...], float]] = []

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        start = time.perf_counter()
        try:
            return super()._run(argv, cwd=cwd, env=env, input=input, timeout=timeout)
        finally:
            self.timed.append((tuple(argv), time.perf_counter() - start))


def kinds(history: list[tuple[str, ...]]) -> dict[str, int]:
    c = Counter(" ".join(a[:2]) if a and a[0] == "scontrol" else (a[0] if a else "") for a in history)
    return dict(sorted(c.items()))


def write_spec(tmp: Path, nodes: int, tag: str = "", begin: bool = False) -> Path:
    """The chain's spec; begin: every stage with --begin=now+1hour (a submit-only sample: nothing runs)."""
    work = tmp / f"work-{nodes}{tag}"
    corpus = work / "corpus"
    doc: dict[str, Any] = {
        "version": 1,
        "run": {"name": f"scale{nodes}{tag}", "workdir": str(work)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:20:00"},
                    "stages": {"train": {"nodes": nodes, "tasks_per_node": 1, "gpus_per_node": 0,
                                         "cpus_per_task": 1}}},
        "container": {"runtime": "none"},
        "data": {"inputs": [str(corpus / "*.jsonl")], "shards": 2, "workers": 1,
                 "tokenizer": {"type": "null", "vocab_size": 128}},
        "model": {"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
        "parallelism": {"micro_batch": 1, "global_batch": nodes},
        "training": {"iterations": 10, "precision": "fp32", "save_grace_s": 60,
                     "max_restarts": 1, "preflight": True, "preflight_collective_timeout": 0,
                     "hang_timeout": 120, "hang_startup_timeout": 300, "exclude_bad_nodes": 2},
        "checkpoint": {"dir": str(work / "checkpoints")},
        "stages": {"checkpoint": {"skip": True},
                   "commands": [{"name": "make-corpus", "before": "preprocess", "container": False,
                                 "command": f"python3 -m lingjun_slurm.data.synthetic {shlex.quote(str(corpus))} "
                                            "--docs 200 --vocab 127"}]},
    }
    if begin:
        doc["cluster"]["sbatch_extra"] = {"begin": "now+1hour"}
    path = tmp / f"scale{nodes}{tag}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sacct_times(job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """job id -> {state, submit, eligible, start, end} (epoch seconds) from one sacct."""
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o",
                          "JobID,State,Submit,Eligible,Start,End", "--noconvert"],
                         capture_output=True, text=True, check=True).stdout
    got: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        jid, state, *stamps = line.split("|")

        def ts(s: str) -> Optional[float]:
            try:
                return datetime.fromisoformat(s).timestamp()
            except ValueError:
                return None
        rec = {"state": state.split()[0], **dict(zip(("submit", "eligible", "start", "end"), map(ts, stamps)))}
        base = jid.split("_")[0]  # an array's tasks (ID_N) fold into one: first eligible/start, last end
        have = got.get(base)
        if have is None:
            got[base] = rec
            continue
        for key, pick in (("submit", min), ("eligible", min), ("start", min), ("end", max)):
            vals = [v for v in (have[key], rec[key]) if v is not None]
            have[key] = pick(vals) if vals else None
        if rec["state"] != "COMPLETED":
            have["state"] = rec["state"]
    return got


def watchdog_cpu(seen: dict[int, float]) -> float:
    """CPU seconds (utime + stime, /proc/PID/stat) of the hang watchdog processes
    (`python3 -m lingjun_slurm.injob.host.watchdog`) now running; seen keeps each PID's latest
    figure across samples, and the sum over every PID seen is returned."""
    tick = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"lingjun_slurm.injob.host.watchdog" not in (proc / "cmdline").read_bytes():
                continue
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        seen[int(proc.name)] = (int(fields[11]) + int(fields[12])) / tick
    return sum(seen.values())


def run_chain(tmp: Path, nodes: int, index: RunIndex, sample: Callable[[list[str]], None]) -> dict[str, Any]:
    spec = write_spec(tmp, nodes)
    loaded = load_spec(spec)
    prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
    os.environ["STANDIN_TRACKER"] = str(tmp / f"work-{nodes}" / "checkpoints" / "latest_checkpointed_iteration.txt")
    os.environ["STANDIN_ITERS"] = "10"
    t = TimedTransport()
    start = time.perf_counter()
    manifest = submit_slurm(t, prep, index, echo=lambda line: None)
    submit_s = time.perf_counter() - start
    sbatch_s = [s for argv, s in t.timed if argv[:1] == ("sbatch",)]
    names = [st.name for st in manifest.stages]
    ids = {st.name: st.job_ids[0] for st in manifest.stages}
    if len(sbatch_s) != len(names):
        raise BenchError(f"{len(sbatch_s)} sbatch calls for {len(names)} stages")
    refreshes: list[tuple[float, int]] = []
    wd_cpu = 0.0
    wd_seen: dict[int, float] = {}
    deadline = time.monotonic() + 900
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        st = TimedTransport()
        r0 = time.perf_counter()
        runs = StatusCollector(st).collect([load_manifest(st, manifest.run_dir)])
        refreshes.append((time.perf_counter() - r0, len(st.history)))
        sample([f"[{j}" for j in ids.values()])
        states = {s.name: s.state for s in runs[0].stages}
        if states.get("train") == "RUNNING":
            wd_cpu = watchdog_cpu(wd_seen)
        if all(s in ENDED for s in states.values()):
            break
        # While train runs, sample the watchdog's CPU time more often (it ends with the step).
        for _ in range(8 if states.get("train") == "RUNNING" else 1):
            time.sleep(2 / 8 if states.get("train") == "RUNNING" else 2)
            if states.get("train") == "RUNNING":
                wd_cpu = watchdog_cpu(wd_seen)
                sample([f"[{j}" for j in ids.values()])
    else:
        raise BenchError(f"chain not ended after 900 s: {states}")
    if any(s != "COMPLETED" for s in states.values()):
        raise BenchError(f"chain ended {states}; logs in {manifest.run_dir}")
    acct = sacct_times(list(ids.values()))
    stages: list[dict[str, Any]] = []
    for name, sb in zip(names, sbatch_s):
        a = acct[ids[name]]
        stages.append({"stage": name, "job": ids[name], "submit_s": sb,
                       "wait_s": (a["start"] - a["eligible"]) if a["start"] and a["eligible"] else None,
                       "run_s": (a["end"] - a["start"]) if a["end"] and a["start"] else None})
    pre = Path(manifest.run_dir) / "preflight" / f"{ids['train']}-0"
    reports = sorted(p.stat().st_mtime for p in pre.glob("*.json") if p.name != "verdict.json")
    verdict = pre / "verdict.json"
    train = acct[ids["train"]]
    timings = []
    for p in pre.glob("*.json"):
        try:
            doc = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("timings"), dict):
            timings.append(doc["timings"])
    totals = sorted(t.get("total", 0.0) for t in timings)
    preflight = {"reports": len(reports),
                 "node_total_median_s": totals[len(totals) // 2] if totals else None,
                 "node_total_max_s": totals[-1] if totals else None,
                 "spread_s": (reports[-1] - reports[0]) if reports else None,
                 "start_to_verdict_s": (verdict.stat().st_mtime - train["start"]) if verdict.exists() else None}
    ok = json.loads(verdict.read_text()).get("exit") if verdict.exists() else None
    return {"nodes": nodes, "run_id": manifest.run_id, "submit_s": submit_s, "submit_calls": kinds(t.history),
            "stages": stages, "preflight": {**preflight, "verdict_exit": ok}, "watchdog_cpu_s": wd_cpu,
            "status_refreshes": len(refreshes),
            "status_s_median": sorted(s for s, _ in refreshes)[len(refreshes) // 2],
            "status_calls_max": max(c for _, c in refreshes),
            "run_dir": manifest.run_dir}


def submit_samples(tmp: Path, nodes: int, index: RunIndex, repeat: int) -> dict[str, Any]:
    """repeat rounds of: one chain submitted as `submit` does (every stage --begin=now+1hour, so
    nothing runs), then `sbatch --parsable --hold` of each of its rendered scripts; then one
    scancel of all. Medians per stage: the tool's sbatch call, the bare one, and the whole submit."""
    t = TimedTransport()
    tool: dict[str, list[float]] = {}
    bare_s: dict[str, list[float]] = {}
    whole: list[float] = []
    calls: list[int] = []
    jobs: list[str] = []
    try:
        for i in range(repeat):
            loaded = load_spec(write_spec(tmp, nodes, tag=f"s{i}", begin=True))
            prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
            t.timed.clear()
            t.history.clear()
            s0 = time.perf_counter()
            m = submit_slurm(t, prep, index, echo=lambda line: None)
            whole.append(time.perf_counter() - s0)
            calls.append(len(t.history))
            sb = [sec for argv, sec in t.timed if argv[:1] == ("sbatch",)]
            for st, sec in zip(m.stages, sb):
                tool.setdefault(st.name, []).append(sec)
                jobs += st.job_ids
            for st in m.stages:
                script = st.script if st.script.startswith("/") else f"{m.run_dir}/{st.script}"
                s0 = time.perf_counter()
                out = LocalTransport().run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", script],
                                           cwd=str(tmp), check=True).stdout
                bare_s.setdefault(st.name, []).append(time.perf_counter() - s0)
                jobs.append(out.strip().split(";")[0])
    finally:
        if jobs:
            SlurmCLI(LocalTransport()).cancel(jobs)

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]
    return {"repeat": repeat, "whole_s": med(whole), "calls": med([float(c) for c in calls]),
            "stages": {n: {"tool_s": med(v), "bare_s": med(bare_s[n])} for n, v in tool.items()}}


def bare(tmp: Path, nodes: int, scripts: list[str]) -> dict[str, Any]:
    """sbatch --parsable --hold of each rendered script (then one scancel), and a bare N-node job."""
    t = LocalTransport()
    held, times = [], []
    for script in scripts:
        s0 = time.perf_counter()
        out = t.run(["sbatch", "--parsable", "--hold", "-o", "/dev/null", script], cwd=str(tmp), check=True).stdout
        times.append(time.perf_counter() - s0)
        held.append(out.strip().split(";")[0])
    SlurmCLI(t).cancel(held)
    rdv = tmp / "bare-rdv"
    job_script = tmp / f"bare-{nodes}.sh"
    job_script.write_text("#!/bin/bash\nset -euo pipefail\n"
                          f"export STANDIN_RDV={shlex.quote(str(rdv))}\n"
                          f"srun --kill-on-bad-exit=1 python3 {shlex.quote(str(tmp / 'standin_rank.py'))}\n")
    s0 = time.perf_counter()
    out = t.run(["sbatch", "--parsable", "-p", "cpu", f"-N{nodes}", "--ntasks-per-node=1", "-t", "10",
                 "-o", str(tmp / f"bare-{nodes}.out"), str(job_script)],
                cwd=str(tmp), check=True).stdout
    submit_s = time.perf_counter() - s0
    job = out.strip().split(";")[0]
    end = time.monotonic() + 600
    state = ""
    while time.monotonic() < end:
        out = t.run(["scontrol", "show", "job", "-o", job], check=False).stdout
        state = next((f[9:] for f in out.split() if f.startswith("JobState=")), "")
        if state in ENDED:
            break
        time.sleep(1)
    if state != "COMPLETED":
        raise BenchError(f"bare {nodes}-node job {job} ended {state}; see {tmp}/bare-{nodes}.out")
    a = sacct_times([job])[job]
    return {"held_sbatch_s": times, "train_submit_s": submit_s,
            "train_wait_s": a["start"] - (a["eligible"] or a["submit"]),
            "train_run_s": a["end"] - a["start"]}


def header(argv: list[str]) -> str:
    load = Path("/proc/loadavg").read_text().split()[:3]
    return (f"command: {' '.join(argv)}\ndate: {datetime.now(timezone.utc).isoformat(timespec='seconds')}\n"
            f"load averages (1/5/15 min) at start: {' '.join(load)}; CPUs: {os.cpu_count()}")


def print_report(head: str, info: dict[str, Any], results: list[dict[str, Any]]) -> None:
    print(head)
    print(f"cluster: {info['nodes']} nodes, started in {info['up_s']:.1f} s. Memory (RSS sums, sampled with each "
          f"status refresh): the cluster's daemons peak {info['daemons_peak_mb']:.0f} MB, its jobs' processes "
          f"(slurmstepd, batch scripts, ranks, pre-flight) peak {info['jobs_peak_mb']:.0f} MB, together peak "
          f"{info['total_peak_mb']:.0f} MB; whole machine (free -m used, other work included) "
          f"{info['base_used_mb']} MB "
          f"before the cluster, peak {info['peak_used_mb']} MB")
    print("ranks: light stand-ins (a stdlib rank run in place of `python3 -m lingjun_slurm.stages train`: "
          "file rendezvous of all ranks, rank 0 writes the checkpoint tracker); pre-flight and host tools real")
    for r in results:
        b = r["bare"]
        print(f"\n== train on {r['nodes']} nodes (run {r['run_id']}) ==")
        print(f"{'stage':<12} {'job':>10} {'submit s':>9} {'bare s':>8} {'x':>6} {'wait s':>7} {'run s':>7}")
        for st, bs in zip(r["stages"], b["held_sbatch_s"]):
            w = "-" if st["wait_s"] is None else f"{st['wait_s']:.0f}"
            rs = "-" if st["run_s"] is None else f"{st['run_s']:.0f}"
            print(f"{st['stage']:<12} {st['job']:>10} {st['submit_s']:>9.3f} {bs:>8.3f} {st['submit_s'] / bs:>6.2f} "
                  f"{w:>7} {rs:>7}")
        sm = r["submit_samples"]
        print(f"submit only, median of {sm['repeat']} chains (stages --begin=now+1hour) each followed by bare "
              f"`sbatch --parsable --hold` of its scripts: whole submit {sm['whole_s']:.3f} s, "
              f"{sm['calls']:.0f} commands")
        for name, v in sm["stages"].items():
            print(f"  {name:<12} sbatch {v['tool_s']:.3f} s, bare {v['bare_s']:.3f} s, "
                  f"x{v['tool_s'] / v['bare_s']:.2f}")
        tr = next(s for s in r["stages"] if s["stage"] == "train")
        print(f"whole submit (render + {sum(r['submit_calls'].values())} commands: "
              f"{', '.join(f'{n} {k}' for k, n in r['submit_calls'].items())}): {r['submit_s']:.3f} s")
        p = r["preflight"]
        print(f"pre-flight: {p['reports']} node reports, spread {p['spread_s']:.2f} s; job start -> verdict "
              f"{p['start_to_verdict_s']:.1f} s (Slurm's Start has 1 s resolution); verdict exit {p['verdict_exit']}; "
              f"each node's own checks (report 'timings' total) median {p['node_total_median_s']:.2f} s, "
              f"max {p['node_total_max_s']:.2f} s")
        print(f"watchdog CPU: {r['watchdog_cpu_s']:.2f} s (utime+stime of its process on the batch host, sampled "
              "every 0.25 s while train ran: a lower bound)")
        print(f"status: {r['status_refreshes']} refreshes, median {r['status_s_median'] * 1000:.0f} ms, "
              f"at most {r['status_calls_max']} Slurm calls each")
        print(f"bare train job (sbatch -N{r['nodes']} + srun of the same stand-in): "
              f"submit {b['train_submit_s']:.3f} s, "
              f"wait {b['train_wait_s']:.0f} s, run {b['train_run_s']:.0f} s; tool's train: wait "
              f"{tr['wait_s']:.0f} s, run {tr['run_s']:.0f} s (x{tr['run_s'] / max(b['train_run_s'], 1):.1f} run time)")


def mem_used_mb() -> int:
    out = subprocess.run(["free", "-m"], capture_output=True, text=True).stdout.splitlines()
    return int(out[1].split()[2])


def _rss_mb(pid: int | str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def own_rss_mb(cluster: DevCluster, marks: list[str]) -> dict[str, float]:
    """RSS of this cluster's daemons (its state file's PIDs) and of the processes whose command line
    holds one of marks (the jobs' slurmstepd '[JOBID', this script's temporary directory, the
    stand-in ranks, the pre-flight's python3 -m lingjun_slurm...): {"daemons", "jobs"} in MB.
    Other dev clusters on the machine (other benches, tests) are not counted."""
    daemons = {d.pid for d in cluster._load_state().values()}
    got = {"daemons": sum(_rss_mb(p) for p in daemons), "jobs": 0.0}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in daemons or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in marks):
            got["jobs"] += _rss_mb(proc.name)
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64, help="nodes of the dev cluster (default 64)")
    parser.add_argument("--sizes", default="16,64", help="train stage nodes, comma-separated (default 16,64)")
    parser.add_argument("--repeat", type=int, default=5, help="submit-only samples per size (default 5)")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    try:
        sizes = [int(x) for x in opts.sizes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--sizes {opts.sizes!r}: give comma-separated integers")
    if not sizes or min(sizes) < 1 or max(sizes) > opts.nodes or not 2 <= opts.nodes <= 128:
        parser.error("--nodes must be 2..128 and every size 1..--nodes")
    head = header(sys.argv)
    root = Path(f"/tmp/lj-N-bench-{os.getpid()}")
    cluster: Optional[DevCluster] = None
    info: dict[str, Any] = {}
    results: list[dict[str, Any]] = []
    base_used = mem_used_mb()
    peak = base_used
    mem = {"daemons": 0.0, "jobs": 0.0, "total": 0.0}
    try:
        for base in range(FIRST_PORT, FIRST_PORT + 1000, 400):
            cluster = DevCluster(DevClusterConfig(root=root, nodes=opts.nodes, cpus_per_node=2, gpus_per_node=0,
                                                  accounting=True, base_port=base, fast_timers=True,
                                                  cgroups=cgroup_problem() is None, cluster_name="lj-n-bench"))
            if not cluster.ports_in_use():
                break
        else:
            raise BenchError("no free ports from 23000")
        s0 = time.perf_counter()
        cluster.up(timeout=300)
        info = {"nodes": opts.nodes, "up_s": time.perf_counter() - s0}
        os.environ.update(cluster.env)
        # The stand-in ranks and the pre-flight step run `python3 -m lingjun_slurm...`: this interpreter.
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        with tempfile.TemporaryDirectory(prefix="lj-N-bench-") as tmp_s:
            tmp = Path(tmp_s)
            os.chmod(tmp, 0o755)
            os.environ["STANDIN_RDV"] = str(tmp / "rdv")
            (tmp / "bin").mkdir()
            (tmp / "standin_rank.py").write_text(STANDIN)
            wrapper = tmp / "bin" / "python3"
            wrapper.write_text(PYTHON3 % {"real": shlex.quote(sys.executable),
                                          "standin": shlex.quote(str(tmp / "standin_rank.py"))})
            wrapper.chmod(0o755)
            os.environ["PATH"] = f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}"
            os.environ["LINGJUN_STATE_DIR"] = str(tmp / "state")
            index = RunIndex(tmp / "state")
            marks = [str(tmp)]  # run dirs, plans, the stand-in ranks: all under it

            def sample(job_marks: list[str]) -> None:
                nonlocal peak
                assert cluster is not None
                got = own_rss_mb(cluster, marks + job_marks)
                mem["daemons"] = max(mem["daemons"], got["daemons"])
                mem["jobs"] = max(mem["jobs"], got["jobs"])
                mem["total"] = max(mem["total"], got["daemons"] + got["jobs"])
                peak = max(peak, mem_used_mb())

            for n in sizes:
                r = run_chain(tmp, n, index, sample)
                r["submit_samples"] = submit_samples(tmp, n, index, max(1, opts.repeat))
                peak = max(peak, mem_used_mb())
                m = load_manifest(LocalTransport(), r["run_dir"])
                scripts = [f"{m.run_dir}/{s.script}" if not str(s.script).startswith("/") else str(s.script)
                           for s in m.stages]
                r["bare"] = bare(tmp, n, scripts)
                peak = max(peak, mem_used_mb())
                results.append(r)
                print(f"size {n} done", file=sys.stderr)
            info.update(peak_used_mb=peak, base_used_mb=base_used, daemons_peak_mb=mem["daemons"],
                        jobs_peak_mb=mem["jobs"], total_peak_mb=mem["total"])
    except (BenchError, LingjunError, DevClusterError, subprocess.CalledProcessError) as exc:
        print(f"bench/scale_train.py: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.down()
            shutil.rmtree(root, ignore_errors=True)
    if opts.json:
        print(json.dumps({"header": head, "cluster": info, "results": results}, indent=1, default=str))
    else:
        print_report(head, info, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
