"""submit's check of the Python the host-side built-in stages will run (a warning, never an error).

Which interpreter a built-in stage runs: its entry command is the bare word `python3`
(plan.PYTHON) followed by `-m lingjun_slurm.stages STAGE --plan plan.json` (plan._builtin_commands,
the image stage in plan.build_plan; the local executor's launcher is `python3 -m
lingjun_slurm.executors.launch` too). No spec field names another interpreter, so `python3` is
whatever the job's PATH finds first, run in the run directory (prelude.sh.j2: `cd "$RUN_DIR"`):

* Slurm executor, stage on the host (container.runtime: none, or the image stage): the batch
  script gets the submitting environment, PATH included. sbatch's default is --export=ALL,
  "All of the user's environment will be loaded ... from the caller's environment"
  (SchedMD/slurm doc/man/man1/sbatch.1, lines 965-966 at 284c3b95f0; SBATCH_EXPORT sets the same
  option from the environment, src/sbatch/opt.c line 203), and the tool's sbatch call passes no
  --export (slurm/client.py SlurmCLI.submit). The submitting environment is the Transport's:
  this process's for the local transport, the remote user's non-interactive login shell for
  SSH (transport/ssh.py runs every command there). With run.ship_code the stage also has
  <run_dir>/site in front of PYTHONPATH (plan.TASK_WRAPPER), so lingjun_slurm itself comes from
  there and what can be missing is the stack (injob/stages/runtime.py).
* Local executor: the runner puts the directory of its own interpreter first on PATH
  (executors/local.py LocalRunner._env), and ships no code.
* Stage inside a pyxis container: the image's PATH and python3. That cannot be checked before
  the job starts (the image may not even be imported yet), so no check is made for it and
  nothing is printed; the stage checks itself when it starts (injob/stages/runtime.py).

So this module runs that same `python3`, once, through the run's Transport, in the run
directory, with the same PATH (local executor) or sys.path head (ship_code), and reports
whether it imports lingjun_slurm, which version, and what injob/stages/runtime.py says is missing for
the host-side stages. One subprocess with a timeout; none when no built-in stage runs on the host.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Optional

from . import __version__
from .plan import PYTHON, Plan, StagePlan
from .transport.base import Transport

TIMEOUT_S = 20.0
STAGES_MODULE = "lingjun_slurm.stages"

# Runs under the cluster's python3 (3.8 or newer: the image stage's own floor, image.sbatch.j2),
# standard library only. argv: site-or-empty, then "stage:tokenizer:copy_to" per host-side stage.
_PROBE = r"""
import json, os, sys
site = sys.argv[1]
if site:
    sys.path.insert(1, site)
out = {"executable": sys.executable, "python": sys.version.split()[0],
       "sbatch_export": os.environ.get("SBATCH_EXPORT")}
try:
    import lingjun_slurm
    out["version"] = getattr(lingjun_slurm, "__version__", "?")
    out["from"] = os.path.dirname(lingjun_slurm.__file__ or "")
except Exception as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
else:
    try:
        from lingjun_slurm.injob.stages.runtime import problems
        need = {}
        for arg in sys.argv[2:]:
            stage, tok, copy_to = arg.split(":", 2)
            need[stage] = problems(stage, tok or None, copy_to or None)
        out["problems"] = need
    except Exception as exc:
        out["problems_error"] = "%s: %s" % (type(exc).__name__, exc)
print("LINGJUN-PYTHON-CHECK " + json.dumps(out))
"""


@dataclass
class Probe:
    """What the job's python3 said (or why it said nothing)."""
    executable: str = ""
    version: Optional[str] = None
    error: str = ""
    problems: dict[str, list[str]] = field(default_factory=dict)
    sbatch_export: Optional[str] = None


def host_side_stages(plan: Plan) -> list[StagePlan]:
    """Built-in stages whose `python3 -m lingjun_slurm.stages` runs outside any container."""
    return [st for st in plan.stages if st.kind != "command" and not st.container
            and any(tuple(cmd[:3]) == (PYTHON, "-m", STAGES_MODULE) for cmd in st.commands)]


def _local_executor_path() -> str:
    """PATH as the local executor's jobs see it (executors/local.py LocalRunner._env)."""
    return f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"


def probe(t: Transport, plan: Plan, run_dir: str, *, ship_code: bool, timeout: float = TIMEOUT_S) -> Probe:
    stages = host_side_stages(plan)
    settings = plan.settings or {}
    tok = str(((settings.get("data") or {}).get("tokenizer") or {}).get("type") or "")
    copy_to = str((settings.get("checkpoint") or {}).get("copy_to") or "")
    site = f"{run_dir}/site" if ship_code and plan.executor == "slurm" else ""
    argv = [PYTHON, "-c", _PROBE, site, *(f"{st.kind}:{tok}:{copy_to}" for st in stages)]
    env = {"PATH": _local_executor_path()} if plan.executor == "local" and t.kind == "local" else None
    res = t.run(argv, cwd=run_dir, env=env, timeout=timeout)
    found = Probe()
    for line in res.stdout.splitlines():
        if line.startswith("LINGJUN-PYTHON-CHECK "):
            try:
                data = json.loads(line.split(" ", 1)[1])
            except ValueError:
                break
            found.executable = str(data.get("executable") or "")
            found.version = data.get("version")
            found.error = str(data.get("error") or "")
            found.problems = {k: list(v) for k, v in (data.get("problems") or {}).items()}
            found.sbatch_export = data.get("sbatch_export")
            if data.get("problems_error"):
                found.error = f"its lingjun_slurm.injob.stages.runtime failed ({data['problems_error']})"
            return found
    if res.returncode == 127:
        found.error = f"no {PYTHON} on the PATH"
    elif res.returncode == 124:
        found.error = f"it did not answer within {timeout:g} s"
    else:
        last = (res.stderr.strip().splitlines() or res.stdout.strip().splitlines() or [""])[-1]
        found.error = f"it exited {res.returncode}" + (f": {last}" if last else "")
    return found


def _exports_path(sbatch_export: Optional[str]) -> bool:
    """Whether sbatch passes the caller's PATH: --export={[ALL,]<vars>|ALL|NIL|NONE}, default ALL
    (SchedMD/slurm doc/man/man1/sbatch.1, lines 958-1012 at 284c3b95f0)."""
    if not sbatch_export:
        return True
    items = [i.strip() for i in sbatch_export.split(",")]
    # "PATH" passes the caller's value; "PATH=/x" sets another one, which is not what was checked.
    return items[0].upper() == "ALL" or "PATH" in items


def _fix(t: Transport) -> str:
    if t.kind == "local":
        bindir = os.path.dirname(sys.executable)
        if os.path.exists(os.path.join(bindir, "activate")):
            how = f"activate the venv before submitting (`. {shlex.quote(os.path.join(bindir, 'activate'))}`)"
        else:
            how = f"put this tool's interpreter first on PATH (`export PATH={shlex.quote(bindir)}:$PATH`)"
        return how + f", or install lingjun-slurm[megatron] for the {PYTHON} on PATH"
    return (f"on {t.host}, install lingjun-slurm[megatron] for that {PYTHON}, or put a venv that has it first on "
            "PATH in the shell startup file non-interactive SSH sessions read (e.g. ~/.bashrc)")


def warning(t: Transport, plan: Plan, run_dir: str, *, ship_code: bool, timeout: float = TIMEOUT_S) -> Optional[str]:
    """One warning line, or None when the stages' python3 fits (or no built-in stage runs on the host)."""
    stages = host_side_stages(plan)
    if not stages:
        return None
    found = probe(t, plan, run_dir, ship_code=ship_code, timeout=timeout)
    if plan.executor == "slurm" and not _exports_path(found.sbatch_export):
        # SBATCH_EXPORT=NONE, NIL or a list without ALL and PATH: the jobs do not get this PATH
        # (sbatch.1 --export), so which python3 they find cannot be told from here.
        return None
    names = ", ".join(st.name for st in stages)
    who = f"`{PYTHON}`" + (f" ({found.executable})" if found.executable else "")
    where = "the PATH the jobs get from sbatch" if plan.executor == "slurm" else "the local executor's PATH"
    if t.kind != "local":
        where += f" on {t.host}"
    head = f"warning: the stages {names} will run {who}, from {where}"
    tail = f"; submitted anyway: {_fix(t)} (docs/submitting.md, \"Which Python the stages run\")"
    if found.version is None:
        return f"{head}, which cannot import lingjun_slurm: {found.error}{tail}"
    if found.version != __version__:
        return (f"{head}, which imports lingjun_slurm {found.version} (not {__version__}, the one submitting)"
                f"{tail}")
    if found.error:
        return f"{head}, which could not be checked: {found.error}{tail}"
    missing: list[str] = []
    for st in stages:
        for p in found.problems.get(st.kind, []):
            if p not in missing:
                missing.append(p)
    if missing:
        return f"{head}, which lacks what they need: {'; '.join(missing)}{tail}"
    return None


def warn(t: Transport, plan: Plan, run_dir: str, *, ship_code: bool) -> Optional[str]:
    """Print the warning (stderr) if there is one, and return it. Never raises: a check that
    cannot run says so in the warning and the submission goes on."""
    try:
        line = warning(t, plan, run_dir, ship_code=ship_code)
    except Exception as exc:  # noqa: BLE001 - a warning must never stop a submit
        line = f"warning: could not check which Python the stages will run: {exc}"
    if line:
        print(line, file=sys.stderr, flush=True)
    return line
