"""10,000 jobs in the queue and the index: status, list, cancel, resubmit and submit, against bare Slurm (issue 31).

    .venv/bin/python bench/scale_queue.py [--jobs 1000,10000] [--nodes 64] [--ref-chains 40] [--json]

Starts its own dev cluster (lingjun_slurm.devcluster: --nodes slurmd, accounting on, fast timers,
root /tmp/lj-S-<pid>, base port 21000 and up; needs root and Debian's Slurm) and always stops it.
For each size J (ascending) it tops the queue up to J jobs of the tool's own chains: J/5 five-stage
chains of cheap `command` stages (every built-in stage skipped), each submitted as `lingjun-slurm
submit` does (load_spec + new_run_id + prepare + submit_slurm, one RunIndex, one workdir per chain),
with `--begin=now+1hour` (cluster.sbatch_extra) so nothing runs. At each size it then times, in this
process (no interpreter start-ups), through the CLI's own click commands (click.testing.CliRunner):

- `status --json RUN...` of every run (all J jobs), `status --json RUN` of one, `status` (the
  newest 10: what `status --watch` redraws each refresh), `list -n 0`;
- `cancel RUN` of one run, `resubmit RUN --from s3` of another;
- submit: the chains submitted to reach J, per stage (wall, and the part spent inside Slurm
  commands), against two references in the same queue (cancelled at once: references, not
  filler): --ref-chains*5 bare `sbatch --parsable --hold --wrap true`, and the last --ref-chains
  chains' own rendered scripts submitted as render's submit.sh does (`sbatch --parsable --hold
  [--dependency=afterok:PREV] SCRIPT` per stage, one `scontrol release` per chain). "x
  (time-render)": the tool's time inside Slurm commands per stage over the reference's per
  stage, i.e. the latency ratio without the rendering and record-keeping done in Python.

Slurm calls are counted by wrapping LocalTransport._run (every command any transport of the CLI
runs on this machine). LINGJUN_SCHEDULER=cli (squeue/sacct; pyslurm is not installed here).
No thresholds: a benchmark. Exits non-zero on any error.
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
from typing import Any, Optional

from lingjun_slurm.common.errors import LingjunError
from lingjun_slurm.devcluster import DevCluster, DevClusterConfig, DevClusterError
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.spec import load_spec
from lingjun_slurm.submit import new_run_id, prepare, submit_slurm
from lingjun_slurm.transport import LocalTransport

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.submit import command_kinds, write_spec as chain_spec  # noqa: E402  (the same chains as bench/submit.py)

FIRST_PORT = 21000
STAGES = 5
CALLS: list[tuple[str, ...]] = []
_IN_COMMANDS = [0.0]
LAST_IN_COMMANDS = [0.0]
_orig_run = LocalTransport._run


def _counting_run(self: LocalTransport, argv: tuple[str, ...], **kw: Any) -> tuple[int, str, str]:
    CALLS.append(tuple(argv))
    start = time.perf_counter()
    try:
        return _orig_run(self, argv, **kw)
    finally:
        _IN_COMMANDS[0] += time.perf_counter() - start


LocalTransport._run = _counting_run  # type: ignore[method-assign]
SLURM = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo", "srun", "salloc")


class BenchError(Exception):
    pass


def slurm_calls(since: int) -> list[tuple[str, ...]]:
    return [a for a in CALLS[since:] if a and os.path.basename(a[0]) in SLURM]


def kinds(calls: list[tuple[str, ...]]) -> dict[str, int]:
    return command_kinds(calls)


def write_spec(path: Path, workdir: Path) -> Path:
    return chain_spec(path, workdir, "cpu", n_stages=STAGES, name="scale")


def submit_chains(root: Path, first: int, count: int, index: RunIndex) -> tuple[float, float, int, dict[str, int],
                                                                                 list[str]]:
    """count chains: (wall s, s inside commands, Slurm calls, kinds, run ids)."""
    t = LocalTransport()
    mark, cmd0 = len(CALLS), _IN_COMMANDS[0]
    ids = []
    start = time.perf_counter()
    for i in range(first, first + count):
        loaded = load_spec(write_spec(root / "specs" / f"c{i}.yaml", root / "work" / f"c{i}"))
        prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
        while t.exists(f"{prep.run_dir}/manifest.json"):
            prep = prepare(loaded, run_id=new_run_id(loaded.spec.run.name), executor="slurm")
        m = submit_slurm(t, prep, index, echo=lambda line: None)
        if m.state != "submitted" or [len(s.job_ids) for s in m.stages] != [1] * STAGES:
            raise BenchError(f"run {m.run_id}: {m.state} {[s.job_ids for s in m.stages]}")
        ids.append(m.run_id)
    wall = time.perf_counter() - start
    calls = slurm_calls(mark)
    return wall, _IN_COMMANDS[0] - cmd0, len(calls), kinds(calls), ids


def bare_sbatch(n: int, cwd: Path) -> tuple[float, list[str]]:
    t = LocalTransport()
    ids = []
    start = time.perf_counter()
    for _ in range(n):
        out = t.run(["sbatch", "--parsable", "--hold", "--wrap", "true"], cwd=str(cwd), check=True).stdout
        ids.append(out.strip().split(";")[0])
    return time.perf_counter() - start, ids


def bare_same_scripts(run_dirs: list[str]) -> tuple[float, int, list[str]]:
    """The chains' own rendered scripts, submitted as render's submit.sh does: `sbatch --parsable
    --hold [--dependency=afterok:<previous>] SCRIPT` per stage in the run directory, then one
    `scontrol release` of them all. (seconds, sbatch calls, job ids); the caller cancels them."""
    from lingjun_slurm.runs.manifest import load_manifest

    t = LocalTransport()
    plans = [(d, [st.script for st in load_manifest(t, d).stages]) for d in run_dirs]
    ids: list[str] = []
    n = 0
    start = time.perf_counter()
    for d, scripts in plans:
        prev = None
        mine = []
        for script in scripts:
            argv = ["sbatch", "--parsable", "--hold"] + ([f"--dependency=afterok:{prev}"] if prev else []) + [script]
            prev = t.run(argv, cwd=d, check=True).stdout.strip().split(";")[0]
            mine.append(prev)
            n += 1
        t.run(["scontrol", "release", ",".join(mine)], check=True)
        ids += mine
    return time.perf_counter() - start, n, ids


def cli(args: list[str]) -> tuple[float, list[tuple[str, ...]], str]:
    """One in-process CLI command: (seconds, Slurm calls, stdout). Raises on a non-zero exit.
    LAST_IN_COMMANDS[0]: the part of those seconds spent waiting for the commands it ran."""
    from click.testing import CliRunner

    from lingjun_slurm.cli.main import cli as group

    mark, cmd0 = len(CALLS), _IN_COMMANDS[0]
    start = time.perf_counter()
    res = CliRunner().invoke(group, args, catch_exceptions=False)
    wall = time.perf_counter() - start
    LAST_IN_COMMANDS[0] = _IN_COMMANDS[0] - cmd0
    if res.exit_code != 0:
        raise BenchError(f"lingjun-slurm {' '.join(args[:3])} ...: exit {res.exit_code}: {res.output[-2000:]}")
    return wall, slurm_calls(mark), res.stdout


def queue_jobs() -> int:
    out = subprocess.run(["squeue", "--me", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    return len(out.split())


def measure(size: int, run_ids: list[str], ops: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"jobs": size, "runs": len(run_ids), "queue": queue_jobs()}
    wall, calls, out = cli(["status", "--json", *run_ids])
    doc = json.loads(out)
    states = Counter(s["state"] for r in doc["runs"] for s in r["stages"])
    if sum(states.values()) != STAGES * len(run_ids) or set(states) - {"PENDING", "CANCELLED"}:
        raise BenchError(f"status of {len(run_ids)} runs: {dict(states)}")
    row["status_all"] = {"s": wall, "cmd_s": LAST_IN_COMMANDS[0], "calls": len(calls), "kinds": kinds(calls), "states": dict(states)}
    wall, calls, _ = cli(["status", "--json", run_ids[len(run_ids) // 2]])
    row["status_one"] = {"s": wall, "cmd_s": LAST_IN_COMMANDS[0], "calls": len(calls), "kinds": kinds(calls)}
    wall, calls, _ = cli(["status"])
    row["status_newest10"] = {"s": wall, "cmd_s": LAST_IN_COMMANDS[0], "calls": len(calls), "kinds": kinds(calls)}
    wall, calls, out = cli(["list", "-n", "0"])
    if len(out.splitlines()) != len(run_ids) + 1:
        raise BenchError(f"list shows {len(out.splitlines()) - 1} runs, expected {len(run_ids)}")
    row["list"] = {"s": wall, "cmd_s": LAST_IN_COMMANDS[0], "calls": len(calls), "kinds": kinds(calls)}
    victim, redo = ops["cancel"].pop(0), ops["resubmit"].pop(0)
    wall, calls, _ = cli(["cancel", victim])
    row["cancel_one"] = {"s": wall, "cmd_s": LAST_IN_COMMANDS[0], "calls": len(calls), "kinds": kinds(calls)}
    wall, calls, _ = cli(["resubmit", redo, "--from", "s3"])
    row["resubmit"] = {"s": wall, "cmd_s": LAST_IN_COMMANDS[0], "calls": len(calls), "kinds": kinds(calls)}
    return row


def header(argv: list[str]) -> str:
    load = os.getloadavg()
    return (f"# bench/scale_queue.py  {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
            f"# command: {' '.join(argv)}\n"
            f"# load averages at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; cpus {os.cpu_count()}")


def print_rows(rows: list[dict[str, Any]]) -> None:
    ops = ("status_all", "status_one", "status_newest10", "list", "cancel_one", "resubmit")
    print("seconds in this process (in brackets: of which waiting for Slurm's commands), Slurm calls")
    print(f"{'jobs':>6} {'runs':>5} " + " ".join(f"{o:>24} {'calls':>5}" for o in ops))
    for r in rows:
        print(f"{r['jobs']:>6} {r['runs']:>5} " + " ".join(
            f"{r[o]['s']:>15.3f} ({r[o]['cmd_s']:>6.3f}) {r[o]['calls']:>5}" for o in ops))
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        n = b["jobs"] / a["jobs"]
        print(f"ratio {b['jobs']}/{a['jobs']} jobs (x{n:g} jobs): " + ", ".join(
            f"{o} x{b[o]['s'] / a[o]['s']:.2f}" for o in ops))
    print()
    print(f"{'jobs':>6} {'chains':>6} {'submit s':>9} {'ms/stage':>9} {'in cmds ms/stage':>16} {'calls/stage':>11} "
          f"{'bare ms/sbatch':>14} {'(n)':>5} {'x time':>7} {'x (time-render)':>15} {'submit.sh ms/stage':>18} "
          f"{'x (time-render)':>15}")
    for r in rows:
        s = r["submit"]
        per = s["s"] * 1000 / (s["chains"] * STAGES)
        inc = s["in_cmds_s"] * 1000 / (s["chains"] * STAGES)
        bare = s["bare_s"] * 1000 / s["bare_n"]
        print(f"{r['jobs']:>6} {s['chains']:>6} {s['s']:>9.1f} {per:>9.1f} {inc:>16.1f} "
              f"{s['calls'] / (s['chains'] * STAGES):>11.2f} {bare:>14.1f} {s['bare_n']:>5} {per / bare:>7.2f} "
              f"{inc / bare:>15.2f} {s['same_s'] * 1000 / s['same_n']:>18.1f} "
              f"{inc / (s['same_s'] * 1000 / s['same_n']):>15.2f}")
    for r in rows:
        print(f"jobs={r['jobs']}: " + "; ".join(f"{o}: {r[o]['kinds']}" for o in
                                                 ("status_all", "status_one", "list", "cancel_one", "resubmit"))
              + f"; submit: {r['submit']['kinds']}; status states {r['status_all']['states']}")


def free_cluster(root: Path, nodes: int) -> DevCluster:
    for base in range(FIRST_PORT, FIRST_PORT + 1000, 300):
        c = DevCluster(DevClusterConfig(root=root, nodes=nodes, base_port=base, accounting=True, cpus_per_node=2,
                                        gpus_per_node=0, fast_timers=True, cluster_name="lj-scale"))
        if not c.ports_in_use():
            return c
    raise BenchError(f"no free ports in {FIRST_PORT}..{FIRST_PORT + 1000}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default="1000,10000", help="queue sizes in jobs, ascending, multiples of 5")
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--ref-chains", type=int, default=40, help="bare sbatch reference: this many x 5 jobs per size")
    p.add_argument("--json", action="store_true")
    opts = p.parse_args()
    sizes = [int(x) for x in opts.jobs.split(",") if x.strip()]
    if not sizes or sizes != sorted(sizes) or any(s % STAGES or s < 4 * STAGES for s in sizes):
        p.error("--jobs: ascending multiples of 5, at least 20")
    print(header(sys.argv), flush=True)
    root = Path(f"/tmp/lj-S-{os.getpid()}")
    cluster: Optional[DevCluster] = None
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="lj-S-bench-"))
    try:
        cluster = free_cluster(root, opts.nodes)
        t0 = time.perf_counter()
        cluster.up(timeout=300)
        print(f"# cluster: {opts.nodes} nodes, base port {cluster.config.base_port}, accounting on, up in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        os.environ.update(cluster.env)
        os.environ.update({"LINGJUN_STATE_DIR": str(tmp / "state"), "LINGJUN_SCHEDULER": "cli"})
        (tmp / "specs").mkdir()
        (tmp / "bare").mkdir()
        index = RunIndex(tmp / "state")
        run_ids: list[str] = []
        for size in sizes:
            want = size // STAGES
            have = len(run_ids)
            wall, incmd, ncalls, kk, ids = submit_chains(tmp, have, want - have, index)
            run_ids += ids
            print(f"# submitted {want - have} chains in {wall:.1f} s (queue now {want} chains)", file=sys.stderr,
                  flush=True)
            bare_s, bare_ids = bare_sbatch(opts.ref_chains * STAGES, tmp / "bare")
            SlurmCLI(LocalTransport()).cancel(bare_ids)
            dirs = [index.resolve(r).run_dir for r in run_ids[-opts.ref_chains:]]
            same_s, same_n, same_ids = bare_same_scripts(dirs)
            SlurmCLI(LocalTransport()).cancel(same_ids)
            ops = {"cancel": [run_ids[1 + 2 * len(rows)]], "resubmit": [run_ids[2 + 2 * len(rows)]]}
            row = measure(size, run_ids, ops)
            row["submit"] = {"chains": want - have, "s": wall, "in_cmds_s": incmd, "calls": ncalls, "kinds": kk,
                             "bare_s": bare_s, "bare_n": len(bare_ids), "same_s": same_s, "same_n": same_n}
            rows.append(row)
            print(f"# size {size} measured", file=sys.stderr, flush=True)
    except (BenchError, LingjunError, DevClusterError, subprocess.CalledProcessError) as exc:
        print(f"bench/scale_queue.py: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.down()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if opts.json:
        print(json.dumps(rows, indent=1))
    else:
        print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
