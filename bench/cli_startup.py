"""Start-up time of the light CLI commands, as a ratio to a bare interpreter start.

    python bench/cli_startup.py [--repeat 20] [--keep-env]

Prints the median wall time and CPU time (user + sys) of `python -c pass` (the reference,
measured in the same run, taking turns with the commands) and of `lingjun-slurm --help`,
`validate`, `render` and `status` on the shipped examples, each with its ratio to the
reference. On a loaded machine the CPU ratio is the steadier of the two. `status` reads a
finished run of examples/command-chain.yaml that the bench first runs with the local executor
(its workdir and $LINGJUN_STATE_DIR in a temporary directory), so it reads a real manifest and
calls no Slurm command. `render` runs with the template cache of that state dir, filled by the
warm-up round; "render, no template cache" with none (every template compiled). The "floor"
row imports only click, yaml and pydantic's BaseModel and Field, which validate and render cannot
do without, and the "render floor" row jinja2 as well: what is left above them is this
project's own start-up. status imports none of them but click.

Byte code: an installed package has up-to-date .pyc files. A checkout under edit with
PYTHONDONTWRITEBYTECODE=1 (as in this project's sandbox) has stale ones, and every run would
then compile every edited module from source (about half the time measured before issue 15).
So, unless --keep-env, the commands run with PYTHONDONTWRITEBYTECODE unset and
PYTHONPYCACHEPREFIX set to a temporary directory (writes nothing beside the sources), and each
command runs once, untimed, before it is measured. No thresholds here: this is a benchmark,
not a test (tests/unit/test_startup_imports.py checks what the commands import).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "megatron-gpt.yaml"
CHAIN = REPO / "examples" / "command-chain.yaml"
CHAIN_WORKDIR = "/tmp/lingjun-slurm/command-chain"


# argv, the directory it runs in (`-m` imports the package from there), and variables to set
Case = tuple[list[str], Path, dict[str, str]]
# What validate and render import before any code of this project runs: click (the command
# line), yaml (the spec) and pydantic's BaseModel and Field (the spec models); render also jinja2
# (the templates). No lingjun_slurm module is imported. status imports click alone of these.
FLOOR = "import click, yaml; from pydantic import BaseModel, Field"
RENDER_FLOOR = FLOOR + "; import jinja2"


def run_once(case: Case, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + sys, from wait4's rusage) seconds of one run of a case."""
    argv, cwd, extra = case
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**env, **extra},
                            cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"{' '.join(argv)}: exit {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def measure(cases: dict[str, Case], repeat: int, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Median wall and CPU seconds of each case. The cases take turns (one run of each per round,
    after one untimed warm-up round), so a change in the machine's load hits all of them alike."""
    for case in cases.values():
        run_once(case, env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, case in cases.items():
            samples[name].append(run_once(case, env))
    return {name: (statistics.median(w for w, _ in got), statistics.median(c for _, c in got))
            for name, got in samples.items()}


def finished_local_run(cli: list[str], tmp: Path, env: dict[str, str]) -> str:
    """Run examples/command-chain.yaml to the end with the local executor, inside tmp."""
    text = CHAIN.read_text(encoding="utf-8")
    if CHAIN_WORKDIR not in text:
        sys.exit(f"{CHAIN}: expected run.workdir {CHAIN_WORKDIR} to replace")
    spec = tmp / "command-chain.yaml"
    spec.write_text(text.replace(CHAIN_WORKDIR, str(tmp / "work")), encoding="utf-8")
    run_id = "bench-startup"
    subprocess.run(cli + ["submit", str(spec), "--executor", "local", "--run-id", run_id], check=True,
                   stdout=subprocess.DEVNULL, env=env, cwd=REPO)
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep-env", action="store_true",
                        help="Run with this environment's byte-code settings as they are (no warm-up cache).")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="Also time validate, render and status of the lingjun_slurm in DIR (another checkout, "
                             "e.g. `git worktree add DIR HEAD~1`), taking turns with this one's.")
    opts = parser.parse_args()
    cli = [sys.executable, "-m", "lingjun_slurm.cli"]
    with tempfile.TemporaryDirectory(prefix="lingjun-bench-startup-") as tmpdir:
        tmp = Path(tmpdir)
        env = dict(os.environ, LINGJUN_STATE_DIR=str(tmp / "state"))
        if not opts.keep_env:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        run_id = finished_local_run(cli, tmp, env)
        out = tmp / "render"
        # A state dir below a plain file: no template cache can be made there (render.py), so
        # this render compiles every template, as the first render after an upgrade does.
        (tmp / "not-a-dir").write_text("", encoding="utf-8")
        no_cache = {"LINGJUN_STATE_DIR": str(tmp / "not-a-dir" / "state")}
        cases: dict[str, Case] = {
            "python -c pass (reference)": ([sys.executable, "-c", "pass"], REPO, {}),
            "floor: click+yaml+pydantic": ([sys.executable, "-c", FLOOR], REPO, {}),
            "render floor: + jinja2": ([sys.executable, "-c", RENDER_FLOOR], REPO, {}),
            "lingjun-slurm --help": (cli + ["--help"], REPO, {}),
        }
        for where, label in [(REPO, "")] + ([(opts.against.resolve(), " (against)")] if opts.against else []):
            cases[f"lingjun-slurm validate{label}"] = (cli + ["validate", str(EXAMPLE)], where, {})
            cases[f"lingjun-slurm render{label}"] = (cli + ["render", str(EXAMPLE), "-o", str(out)], where, {})
            if not label:
                cases["render, no template cache"] = (cli + ["render", str(EXAMPLE), "-o", str(out)], where, no_cache)
            cases[f"lingjun-slurm status{label}"] = (cli + ["status", run_id], where, {})
        if opts.against:
            print(f"against: {opts.against.resolve()}")
        print(f"byte code: {'as the environment has it' if opts.keep_env else 'cached in a temporary prefix'}; "
              f"median of {opts.repeat} rounds")
        print(f"{'command':<34} {'wall ms':>9} {'x ref':>7} {'cpu ms':>9} {'x ref':>7}")
        results = measure(cases, opts.repeat, env)
        ref_wall, ref_cpu = results["python -c pass (reference)"]
        for name, (wall, cpu) in results.items():
            print(f"{name:<34} {wall * 1000:>9.1f} {wall / ref_wall:>7.2f} {cpu * 1000:>9.1f} {cpu / ref_cpu:>7.2f}")


if __name__ == "__main__":
    main()
