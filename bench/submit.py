"""Submission and status cost against a real Slurm, as a ratio to bare sbatch calls (issue #3).

    .venv/bin/python bench/submit.py [--k 1,10,50] [--slurm-conf PATH] [--json]

Without --slurm-conf it starts its own 4-node dev cluster (lingjun_slurm.devcluster, accounting
off unless --accounting; root /tmp/lingjun-bench-<pid>, ports from 17900 up; needs root and
Debian's slurmctld slurmd slurm-client munge) and always stops it again. With --slurm-conf it
uses that cluster as is and touches only the jobs it made.

For each K it submits K chains of one 4-stage spec (four cheap `command` stages, every built-in
stage skipped) through the library the CLI uses: load_spec + new_run_id + prepare + submit_slurm
(RunIndex and workdir in a temporary directory, LocalTransport). Measured, all in this process
(no interpreter start-ups):

- submit: wall time of submitting the K chains one after the other, and the Slurm commands
  issued (from LocalTransport.history), per chain and in total; also how much of the wall time
  was spent inside those commands.
- status: wall time of ONE refresh of all K runs (load_manifest of each + one
  StatusCollector.collect over all of them) and the Slurm commands it issued.
- reference: 4*K bare `sbatch --parsable --hold --wrap true`, sequential, in the same run, and
  the ratios submit time / reference time and submit commands / reference commands.

The stages carry `--begin=now+1hour` (cluster.sbatch_extra) and run `sleep 30`, so released
jobs stay pending and the cluster does no work while we measure; after each K every job this
script made is cancelled with one scancel (cancelled jobs linger in slurmctld for MinJobAge, so
later K's status refreshes parse a slightly longer squeue document). No thresholds here: this
is a benchmark, not a test. Exits non-zero on any error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError
from lingjun_slurm.common.errors import LingjunError
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.runs.manifest import Manifest, load_manifest
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.spec import load_spec
from lingjun_slurm.status import StatusCollector
from lingjun_slurm.submit import new_run_id, prepare, submit_slurm
from lingjun_slurm.transport import LocalTransport

FIRST_PORT = 17900
STAGES = 4


class BenchError(Exception):
    """The benchmark could not run or the library did not do what it should."""


class TimedTransport(LocalTransport):
    """LocalTransport that also adds up the wall time spent inside commands."""

    def __init__(self) -> None:
        super().__init__()
        self.command_s = 0.0

    def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
             input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
        start = time.perf_counter()
        try:
            return super()._run(argv, cwd=cwd, env=env, input=input, timeout=timeout)
        finally:
            self.command_s += time.perf_counter() - start


@dataclass
class Result:
    k: int
    submit_s: float
    submit_ms_per_chain: float
    submit_in_commands_s: float
    submit_calls: int
    submit_calls_per_chain: float
    submit_call_kinds: dict[str, int]
    status_s: float
    status_calls: int
    status_call_kinds: dict[str, int]
    status_states: dict[str, int]
    bare_sbatch_calls: int
    bare_sbatch_s: float
    time_ratio: float
    calls_ratio: float


def command_kinds(history: list[tuple[str, ...]]) -> dict[str, int]:
    """"sbatch", "scontrol release", ... -> count (scontrol by its sub-command)."""
    kinds = Counter(" ".join(argv[:2]) if argv[0] == "scontrol" else argv[0] for argv in history if argv)
    return dict(sorted(kinds.items()))


def write_spec(path: Path, workdir: Path, partition: str, n_stages: int = STAGES, name: str = "bench") -> Path:
    """n_stages chained `command` stages (built-ins skipped), as tests/integration/helpers.chain_spec;
    bench/scale_queue.py uses it too."""
    stages: dict[str, Any] = {s: {"skip": True} for s in ("preprocess", "merge", "train", "checkpoint")}
    commands: list[dict[str, Any]] = []
    for i in range(n_stages):
        item: dict[str, Any] = {"name": f"s{i + 1}", "command": "sleep 30"}
        if i == 0:
            item["before"] = "preprocess"
        else:
            item["after"] = f"s{i}"
        commands.append(item)
    stages["commands"] = commands
    doc = {
        "version": 1,
        "run": {"name": name, "workdir": str(workdir)},
        "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": partition, "time": "00:05:00"},
                    "sbatch_extra": {"begin": "now+1hour"}},
        "container": {"runtime": "none"},
        "stages": stages,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def submit_chains(specs: list[Path], index: RunIndex) -> tuple[float, TimedTransport, list[Manifest]]:
    """Submit one chain per spec as `lingjun-slurm submit` does; (wall seconds, transport used, manifests).
    Each spec has its own workdir: a workdir holds one live run at a time (docs/submitting.md)."""
    t = TimedTransport()
    manifests = []
    start = time.perf_counter()
    for spec in specs:
        loaded = load_spec(spec)
        prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
        while t.exists(f"{prep.run_dir}/manifest.json"):  # the CLI refuses an existing run id; draw again
            prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
        manifests.append(submit_slurm(t, prep, index, echo=lambda line: None))
    elapsed = time.perf_counter() - start
    for m in manifests:
        if m.state != "submitted" or [len(st.job_ids) for st in m.stages] != [1] * STAGES:
            raise BenchError(f"run {m.run_id}: state {m.state}, job ids {[st.job_ids for st in m.stages]}; "
                             f"expected {STAGES} stages with one job each")
    return elapsed, t, manifests


def refresh_status(run_dirs: list[str]) -> tuple[float, TimedTransport, dict[str, int]]:
    """One status refresh of every run, as `lingjun-slurm status RUN...`: (seconds, transport, states)."""
    t = TimedTransport()
    start = time.perf_counter()
    runs = StatusCollector(t).collect([load_manifest(t, d) for d in run_dirs])
    elapsed = time.perf_counter() - start
    states = Counter(s.state for r in runs for s in r.stages)
    bad = {s: n for s, n in states.items() if s not in ("PENDING", "RUNNING")}
    if bad or sum(states.values()) != STAGES * len(run_dirs):
        raise BenchError(f"status of {len(run_dirs)} fresh runs shows {dict(states)}; expected every stage PENDING")
    return elapsed, t, dict(states)


def bare_sbatch(n: int, cwd: str) -> tuple[float, list[str]]:
    """n sequential `sbatch --parsable --hold --wrap true`: (seconds, job ids)."""
    t = LocalTransport()
    ids = []
    start = time.perf_counter()
    for _ in range(n):
        out = t.run(["sbatch", "--parsable", "--hold", "--wrap", "true"], cwd=cwd, check=True).stdout
        ids.append(out.strip().split(";")[0])
    return time.perf_counter() - start, ids


def bench_k(k: int, root: Path, partition: str, index: RunIndex, scratch: Path) -> Result:
    job_ids: list[str] = []
    specs = [write_spec(root / f"spec-k{k}-{i}.yaml", root / f"work-k{k}-{i}", partition) for i in range(k)]
    try:
        submit_s, st, manifests = submit_chains(specs, index)
        job_ids += [j for m in manifests for rec in m.stages for j in rec.job_ids]
        status_s, tt, states = refresh_status([m.run_dir for m in manifests])
        bare_s, bare_ids = bare_sbatch(STAGES * k, str(scratch))
        job_ids += bare_ids
    finally:
        SlurmCLI(LocalTransport()).cancel(job_ids)  # one scancel, only this script's jobs
    n_bare = STAGES * k
    return Result(
        k=k, submit_s=submit_s, submit_ms_per_chain=submit_s * 1000 / k, submit_in_commands_s=st.command_s,
        submit_calls=len(st.history), submit_calls_per_chain=len(st.history) / k,
        submit_call_kinds=command_kinds(st.history), status_s=status_s, status_calls=len(tt.history),
        status_call_kinds=command_kinds(tt.history), status_states=states, bare_sbatch_calls=n_bare,
        bare_sbatch_s=bare_s, time_ratio=submit_s / bare_s, calls_ratio=len(st.history) / n_bare)


def free_cluster(root: Path, accounting: bool) -> DevCluster:
    for base in range(FIRST_PORT, FIRST_PORT + 20 * 10, 20):
        cluster = DevCluster(DevClusterConfig(root=root, nodes=4, base_port=base, accounting=accounting,
                                              cluster_name="lingjun-bench"))
        if not cluster.ports_in_use():
            return cluster
    raise BenchError(f"no free ports for a dev cluster in {FIRST_PORT}..{FIRST_PORT + 200}")


def print_table(results: list[Result], cluster: dict[str, Any]) -> None:
    print(f"cluster: {cluster['source']}  (SLURM_CONF={cluster['slurm_conf']}"
          + (f", started in {cluster['up_s']:.1f} s" if cluster.get("up_s") is not None else "") + ")")
    head = (f"{'K':>4} {'submit s':>9} {'ms/chain':>9} {'in cmds s':>9} {'calls':>6} {'/chain':>6} "
            f"{'bare sbatch s':>13} {'(n)':>5} {'x time':>7} {'x calls':>7} {'status s':>9} {'calls':>6}")
    print(head)
    for r in results:
        print(f"{r.k:>4} {r.submit_s:>9.3f} {r.submit_ms_per_chain:>9.1f} {r.submit_in_commands_s:>9.3f} "
              f"{r.submit_calls:>6} {r.submit_calls_per_chain:>6.1f} {r.bare_sbatch_s:>13.3f} "
              f"{r.bare_sbatch_calls:>5} {r.time_ratio:>7.2f} {r.calls_ratio:>7.2f} {r.status_s:>9.3f} "
              f"{r.status_calls:>6}")
    print()
    for r in results:
        kinds = ", ".join(f"{n} {c}" for c, n in r.submit_call_kinds.items())
        skinds = ", ".join(f"{n} {c}" for c, n in r.status_call_kinds.items())
        print(f"K={r.k}: submit commands: {kinds}; status commands: {skinds}; stage states {r.status_states}")
    print("submit s: K chains through load_spec+prepare+submit_slurm; in cmds s: part spent inside Slurm commands; "
          "x time / x calls: submit vs 4*K bare `sbatch --parsable --hold --wrap true`; "
          "status s: one load_manifest x K + StatusCollector.collect")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="1,10,50", help="comma-separated numbers of chains (default 1,10,50)")
    parser.add_argument("--slurm-conf", type=Path, help="use this running cluster instead of starting one")
    parser.add_argument("--accounting", action="store_true", help="own cluster: start it with slurmdbd (sacct)")
    parser.add_argument("--partition", default="cpu", help="partition the stages ask for (default cpu)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    opts = parser.parse_args()
    try:
        ks = [int(x) for x in opts.k.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--k {opts.k!r}: give comma-separated positive integers")
    if not ks or min(ks) < 1:
        parser.error(f"--k {opts.k!r}: give comma-separated positive integers")

    cluster: Optional[DevCluster] = None
    root = Path(f"/tmp/lingjun-bench-{os.getpid()}")
    info: dict[str, Any] = {}
    results: list[Result] = []
    try:
        if opts.slurm_conf:
            if not opts.slurm_conf.is_file():
                raise BenchError(f"--slurm-conf {opts.slurm_conf}: no such file")
            os.environ["SLURM_CONF"] = str(opts.slurm_conf.resolve())
            info = {"source": "existing cluster", "slurm_conf": os.environ["SLURM_CONF"], "up_s": None}
        else:
            cluster = free_cluster(root, opts.accounting)
            start = time.perf_counter()
            cluster.up(timeout=90)
            info = {"source": f"own dev cluster, 4 nodes, base port {cluster.config.base_port}, "
                              f"accounting {'on' if opts.accounting else 'off'}",
                    "slurm_conf": str(cluster.slurm_conf), "up_s": time.perf_counter() - start}
            os.environ.update(cluster.env)  # LocalTransport passes os.environ to every command
        with tempfile.TemporaryDirectory(prefix="lingjun-bench-submit-") as tmp:
            scratch = Path(tmp) / "bare"
            scratch.mkdir()
            index = RunIndex(Path(tmp) / "state")
            for k in ks:
                results.append(bench_k(k, Path(tmp), opts.partition, index, scratch))
                if not opts.json:
                    print(f"K={k} done", file=sys.stderr)
    except (BenchError, LingjunError, DevClusterError) as exc:
        print(f"bench/submit.py: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.down()
            shutil.rmtree(root, ignore_errors=True)
    if opts.json:
        print(json.dumps({"cluster": info, "stages_per_chain": STAGES, "results": [asdict(r) for r in results]},
                         indent=2))
    else:
        print_table(results, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
