"""The three wings' import rules (issue 27 item 2; docs/architecture.md, "The rules, and the tests
that hold them"). Each rule is a checker function run on the real tree, and again on a copy of the
package in tmp_path with a violation planted, where it must report exactly the planted modules.

1. Only lingjun_slurm/cli/ imports click or rich (the terminal wing): every `import`, `from ...
   import` and `importlib.import_module("...")`/`__import__("...")` with a literal name, at any
   depth (a function's lazy import counts), read with ast.
2. The code the batch script runs with the host's own python3, outside the container (HOST_SIDE:
   injob/host/, `python3 -m lingjun_slurm.stages image|preflight-judge` and what they import),
   imports only the standard library: the host's python3 has nothing installed. Checked twice:
   dynamically (each module imported and each `-m` entry point run with --help in one subprocess
   whose sys.meta_path refuses every top-level name outside sys.stdlib_module_names) and
   statically (the closure of every import, lazy ones included, over lingjun_slurm modules reaches
   only the standard library, up to CONTAINER_SIDE: the edges into code that runs in the container).
3. The user-side pipeline (every top-level module and package of lingjun_slurm but cli/, injob/,
   nodes/, common/ and the entry shims stages/ and data/: a new top-level module is covered by
   itself) never imports torch, megatron or numpy: in one subprocess with those refused, every
   pipeline module is imported, every spec of examples/ is loaded, planned and rendered, and the
   CLI's validate, render and plan run on examples/tiny-gpt.yaml; and statically, no pipeline
   module names them in an import at any depth.
4. No import circles: tests/unit/test_import_graph.py (its import_graph() is reused here).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable

import pytest

from lingjun_slurm.plan import build_plan
from lingjun_slurm.spec import load_spec
from tests.conftest import REPO, scenario_files
from tests.unit import test_import_graph

EXAMPLES = REPO / "examples"
TINY = EXAMPLES / "tiny-gpt.yaml"

# ------------------------------------------------------------------------------ reading imports


def imported_names(path: Path) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in the file, at any depth: `import a.b`,
    `from a.b import c` (relative imports are the package's own: left out), and
    importlib.import_module / __import__ called with a literal absolute name."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if not node.level and node.module:
                out.append((node.module, node.lineno))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and first.value and not first.value.startswith("."):
                out.append((first.value, node.lineno))
    return out


def foreign_imports(path: Path, allowed: Callable[[str], bool]) -> list[tuple[str, int]]:
    """The file's imports of modules outside lingjun_slurm whose top-level name `allowed` refuses."""
    return [(name, line) for name, line in imported_names(path)
            if name.split(".")[0] != "lingjun_slurm" and not allowed(name.split(".")[0])]


def tree() -> tuple[dict[str, Path], dict[str, set[str]]]:
    """The package's modules and import graph (test_import_graph's, for whatever tree it points at)."""
    return test_import_graph._modules(), test_import_graph.import_graph()


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# ---------------------------------------------------------------------- rule 1: click and rich
TERMINAL_ONLY = ("click", "rich")


def terminal_imports_outside_cli(modules: dict[str, Path]) -> dict[str, list[tuple[str, int]]]:
    """Modules outside lingjun_slurm/cli/ that import click or rich: {module: [(name, line)]}."""
    found = {}
    for name, path in sorted(modules.items()):
        if under(name, "lingjun_slurm.cli"):
            continue
        bad = foreign_imports(path, lambda top: top not in TERMINAL_ONLY)
        if bad:
            found[name] = bad
    return found


# --------------------------------------------------------------- rule 2: the host's python3
# What the batch script runs with the host's python3, outside the container, and where. A key is
# a module, or a package with every module under it.
HOST_SIDE = {
    "lingjun_slurm.injob.host": "slurm_templates/partials/faults.sh.j2 and train.sbatch.j2: "
                                "`host_py -m lingjun_slurm.injob.host.exclusion|retry`, `host_py_exec -m "
                                "lingjun_slurm.injob.host.watchdog`, the probe `host_py -c 'import ...'`",
    "lingjun_slurm.stages": "slurm_templates/image.sbatch.j2: `python3 -m lingjun_slurm.stages image` (plan.py "
                            "renders the image stage with container=False); partials/faults.sh.j2 and "
                            "doctor.sbatch.j2: `host_py -m lingjun_slurm.stages preflight-judge`",
    "lingjun_slurm.injob.stages.dispatch": "lingjun_slurm/stages/__main__.py runs its main()",
    "lingjun_slurm.injob.stages.contract": "dispatch: the arguments, the plan, layout_note",
    "lingjun_slurm.injob.stages.runtime": "dispatch: the runtime packages check (the image stage's too)",
    "lingjun_slurm.injob.stages.image": "slurm_templates/image.sbatch.j2: the image stage",
    "lingjun_slurm.images": "slurm_templates/image.sbatch.j2: the image stage's references, enroot import, cache",
    "lingjun_slurm.injob.preflight": "partials/faults.sh.j2 and doctor.sbatch.j2: `host_py -m lingjun_slurm.stages "
                                     "preflight-judge` (judge.py; doctor.sbatch.j2 probes `host_py -c 'import "
                                     "lingjun_slurm.injob.preflight.judge'`); doctor.sbatch.j2 with no image: "
                                     "its tasks run `python3 -m lingjun_slurm.stages preflight` (node.py) on the "
                                     "hosts (lingjun_slurm/doctor.py, ImageChoice.describe); partials/faults.sh.j2: "
                                     "`host_py -m lingjun_slurm.stages collective-judge` (collective.py)",
    "lingjun_slurm.nodes.nccltests.bisect": "injob/preflight/collective.py (the collective smoke test's judge, on the "
                                            "batch host) replays the pairs through its Bisection",
}
# Imports of host-side modules into code that does not run on the host: dispatch.main imports a
# container stage's module only for that stage (preprocess/merge/train/checkpoint.sbatch.j2 start it
# with srun's container flags), after runtime.check has found its packages; node.checkpoint_bytes
# imports the planner inside `except Exception` (a missing package only skips the free-space
# check), and the dynamic check below runs it under the blocker and wants its estimate.
CONTAINER_SIDE = {
    ("lingjun_slurm.injob.stages.dispatch", "lingjun_slurm.injob.stages.preprocess"),
    ("lingjun_slurm.injob.stages.dispatch", "lingjun_slurm.injob.stages.merge"),
    ("lingjun_slurm.injob.stages.dispatch", "lingjun_slurm.injob.stages.train"),
    ("lingjun_slurm.injob.stages.dispatch", "lingjun_slurm.injob.stages.checkpoint"),
    # partials/faults.sh.j2 starts `python3 -m lingjun_slurm.stages collective` with the train step's
    # srun flags (in the container, torch); only collective-judge runs on the host.
    ("lingjun_slurm.injob.stages.dispatch", "lingjun_slurm.injob.stages.collective"),
    ("lingjun_slurm.injob.preflight.node", "lingjun_slurm.planner.estimate"),
}


def host_modules(modules: dict[str, Path]) -> list[str]:
    return sorted(m for m in modules if any(under(m, key) for key in HOST_SIDE))


def stdlib(top: str) -> bool:
    return top in sys.stdlib_module_names


def host_closure(graph: dict[str, set[str]], roots: Iterable[str]) -> set[str]:
    """Every lingjun_slurm module importing `roots` can run (lazy imports included): their imports
    and, for each, its parent packages (whose __init__ runs first), up to CONTAINER_SIDE."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in graph]
        todo += [t for t in graph[module] if (module, t) not in CONTAINER_SIDE]
    return seen


def host_static_violations(modules: dict[str, Path], graph: dict[str, set[str]]) -> dict[str, list[tuple[str, int]]]:
    """Modules of the host side's closure that import anything outside the standard library."""
    found = {}
    for name in sorted(host_closure(graph, host_modules(modules))):
        bad = foreign_imports(modules[name], stdlib)
        if bad:
            found[name] = bad
    return found


def main_modules(modules: dict[str, Path], names: Iterable[str]) -> list[str]:
    """The `python3 -m` entry points among names: a package's __main__ (run as the package), or a
    module with an `if __name__ == "__main__"` block."""
    out = []
    for name in names:
        if name.endswith(".__main__"):
            out.append(name.rsplit(".", 1)[0])
        elif re.search(r"^if __name__ == .__main__.:", modules[name].read_text(encoding="utf-8"), re.M):
            out.append(name)
    return sorted(out)


# ------------------------------------------------------------------ rule 3: the user pipeline
NOT_PIPELINE = ("cli", "injob", "nodes", "common", "stages", "data")
TRAINING_STACK = ("torch", "megatron", "numpy")


def pipeline_modules(modules: dict[str, Path]) -> list[str]:
    """The package itself and every module of its top-level modules and packages but NOT_PIPELINE."""
    return sorted(m for m in modules if len(m.split(".")) == 1 or m.split(".")[1] not in NOT_PIPELINE)


def pipeline_static_violations(modules: dict[str, Path]) -> dict[str, list[tuple[str, int]]]:
    found = {}
    for name in pipeline_modules(modules):
        bad = foreign_imports(modules[name], lambda top: top not in TRAINING_STACK)
        if bad:
            found[name] = bad
    return found


# ------------------------------------------------------------- the subprocess under a blocker
# Refuses imports (blocked: "stdlib", everything but the standard library and lingjun_slurm; or a
# list of top-level names), records each refusal with the lingjun_slurm module that asked (the
# nearest frame whose module is lingjun_slurm's), even when the caller catches the ImportError,
# unless the standard library itself asked,
# runs the steps, and writes {"refused": [[name, by]], "failed": [[step, error]]} to `result`.
RUNNER = r'''
import json, runpy, sys, traceback, warnings

config = json.loads(sys.argv[1])
blocked = config["blocked"]
refused, failed = [], []


def module_of(frame):
    spec = frame.f_globals.get("__spec__")
    return getattr(spec, "name", None) or frame.f_globals.get("__name__", "")


def importer(frame):
    """The module whose code asked for the import: the first frame outside importlib's machinery."""
    while frame is not None and module_of(frame).startswith(("importlib", "_frozen_importlib")):
        frame = frame.f_back
    return module_of(frame) if frame is not None else "?"


def asker(frame):
    """The nearest lingjun_slurm module on the stack (the one a third-party import was made for)."""
    while frame is not None and module_of(frame).split(".")[0] != "lingjun_slurm":
        frame = frame.f_back
    return module_of(frame) if frame is not None else "?"


class Blocker:
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if blocked == "stdlib":
            refuse = top not in sys.stdlib_module_names and top != "lingjun_slurm"
        else:
            refuse = top in blocked
        # The standard library's own optional imports (copy.py's `from org.python.core import ...`
        # for Jython) are refused as the host would, and not counted.
        if refuse and importer(sys._getframe(1)).split(".")[0] not in sys.stdlib_module_names:
            if [fullname, asker(sys._getframe(1))] not in refused:
                refused.append([fullname, asker(sys._getframe(1))])
        if refuse:
            raise ImportError(f"blocked by tests/unit/test_wings.py: {fullname}")
        return None


sys.meta_path.insert(0, Blocker())
warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")  # a module run after its import
for step in config["steps"]:
    kind, what = step[0], step[1]
    try:
        if kind == "import":
            __import__(what)
        elif kind == "run":
            sys.argv = [what] + step[2]
            try:
                runpy.run_module(what, run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise
        else:
            exec(compile(what, "<step>", "exec"), {"__name__": "step"})
    except BaseException:
        failed.append([step[:2], traceback.format_exc(limit=-4)])
with open(config["result"], "w", encoding="utf-8") as out:
    json.dump({"refused": refused, "failed": failed}, out)
'''


def run_blocked(root: Path, tmp_path: Path, blocked: str | list[str], steps: list[list]) -> dict:
    """Run the steps in one fresh interpreter importing lingjun_slurm from root, under the blocker."""
    runner = tmp_path / "wings_runner.py"
    runner.write_text(RUNNER, encoding="utf-8")
    result = tmp_path / "wings_result.json"
    config = {"blocked": blocked, "steps": steps, "result": str(result)}
    # root first; the session's PYTHONPATH after it (its sitecustomize is the hermetic write guard).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if p])}
    proc = subprocess.run([sys.executable, str(runner), json.dumps(config)], cwd=root, env=env, capture_output=True,
                          text=True, timeout=180)
    assert result.is_file(), f"the runner ended without a result (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                             f"{proc.stderr[-3000:]}"
    got = json.loads(result.read_text(encoding="utf-8"))
    got["stdout"] = proc.stdout
    got["output"] = proc.stdout[-3000:] + proc.stderr[-3000:]
    return got


CHECKPOINT_BYTES = """
import json
from lingjun_slurm.injob.preflight import node
size, source = node.checkpoint_bytes(json.load(open({plan!r}, encoding="utf-8")))
assert isinstance(size, int) and size > 0, (size, source)
"""


def host_dynamic(root: Path, tmp_path: Path, plan_json: Path) -> dict:
    """Rule 2 (a): each host-side module imported, each of their `-m` entry points run with --help,
    and the host pre-flight's checkpoint estimate made, with only the standard library importable."""
    modules = test_import_graph._modules()
    names = host_modules(modules)
    steps = [["run", m, ["--help"]] for m in main_modules(modules, names)]
    steps += [["import", m] for m in names]
    steps.append(["exec", CHECKPOINT_BYTES.format(plan=str(plan_json))])
    return run_blocked(root, tmp_path, "stdlib", steps)


USER_PATH = """
from pathlib import Path
from lingjun_slurm.cli.main import main
from lingjun_slurm.plan import build_plan
from lingjun_slurm.render import render_plan
from lingjun_slurm.spec import load_spec

for path in sorted(Path({examples!r}).glob("*.yaml")):
    loaded = load_spec(path)
    plan = build_plan(loaded.spec, spec_sha256=loaded.sha256, source=path.name, reproduce="render")
    assert render_plan(plan), path
for args in (["validate", {tiny!r}], ["render", {tiny!r}, "-o", {out!r}], ["plan", {tiny!r}]):
    try:
        main(args)
    except SystemExit as exc:
        assert exc.code in (0, None), (args, exc.code)
assert Path({out!r}, "plan.json").is_file()
"""


def pipeline_dynamic(root: Path, tmp_path: Path) -> dict:
    """Rule 3: every pipeline module imported, then the user's path, with torch, megatron and numpy refused."""
    steps = [["import", m] for m in pipeline_modules(test_import_graph._modules())]
    steps.append(["exec", USER_PATH.format(examples=str(EXAMPLES), tiny=str(TINY), out=str(tmp_path / "rendered"))])
    return run_blocked(root, tmp_path, list(TRAINING_STACK), steps)


def refusals(got: dict) -> set[tuple[str, str]]:
    return {(name, by) for name, by in got["refused"]}


def tiny_plan_json(tmp_path: Path) -> Path:
    loaded = load_spec(TINY)
    out = tmp_path / "tiny-plan.json"
    out.write_text(json.dumps(build_plan(loaded.spec, spec_sha256=loaded.sha256, source="tiny-gpt.yaml",
                                         reproduce="render").to_json()), encoding="utf-8")
    return out


# -------------------------------------------------------------------- planting a violation
@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the package (and slurm_templates/, which render reads beside it) in tmp_path, with
    test_import_graph (and so tree()) pointed at it. Returns the copy's root."""
    root = tmp_path / "tree"
    shutil.copytree(REPO / "lingjun_slurm", root / "lingjun_slurm", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "slurm_templates", root / "slurm_templates")
    monkeypatch.setattr(test_import_graph, "REPO", root)
    monkeypatch.setattr(test_import_graph, "PACKAGE", root / "lingjun_slurm")
    return root


def plant_at_top(root: Path, rel: str, line: str) -> None:
    path = root / "lingjun_slurm" / rel
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # planted by test_wings\n", encoding="utf-8")


def plant_in_function(root: Path, rel: str, line: str, function: str | None = None) -> None:
    """Insert `line` as the first statement of `function` (default: the file's first function)."""
    path = root / "lingjun_slurm" / rel
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    node = next(n for n in ast.walk(ast.parse("".join(lines))) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (function is None or n.name == function))
    first = node.body[0]
    lines.insert(first.lineno - 1, " " * first.col_offset + line + "  # planted by test_wings\n")
    path.write_text("".join(lines), encoding="utf-8")


# ============================================================================== rule 1
def test_only_cli_imports_click_or_rich() -> None:
    """Rule 1: the terminal's libraries stay in the terminal wing (docs/architecture.md), so the job
    side and the pipeline run where click and rich are not installed."""
    modules, _ = tree()
    assert modules, "no modules found"
    found = terminal_imports_outside_cli(modules)
    assert not found, f"click or rich imported outside lingjun_slurm/cli/: {found}"


def test_rule_1_sees_a_lazy_import_and_an_import_module_call(planted: Path) -> None:
    """Planted in a copy: a module-level import, a function's importlib.import_module, one inside cli/."""
    plant_at_top(planted, "injob/stacks.py", "import rich.console")
    plant_in_function(planted, "spec/load.py", "importlib.import_module('click')")
    plant_in_function(planted, "cli/ui.py", "import rich.table")  # inside cli/: allowed
    modules, _ = tree()
    assert set(terminal_imports_outside_cli(modules)) == {"lingjun_slurm.injob.stacks", "lingjun_slurm.spec.load"}


# ============================================================================== rule 2
def test_the_host_side_list_covers_what_the_scripts_run_on_the_host() -> None:
    """Every module a template runs with host_py/host_py_exec, and every module a stage rendered with
    container=False runs (`python3 -m ...` in its commands), is in HOST_SIDE; the edges
    CONTAINER_SIDE cuts exist (a stale entry would hide nothing, but says something false)."""
    modules, graph = tree()
    host = set(host_modules(modules))
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "slurm_templates").rglob("*.j2")))
    run = set(re.findall(r"\bhost_py(?:_exec)?\s+-m\s+([A-Za-z_][\w.]*)", text))
    for probe in re.findall(r"\bhost_py\s+-c\s+'import ([^']*)'", text):
        run.update(name.strip() for name in probe.split(","))
    assert {"lingjun_slurm.injob.host.exclusion", "lingjun_slurm.stages"} <= run, run
    off_container = set()
    for name, path in scenario_files().items():
        plan = build_plan(load_spec(path).spec, spec_sha256="0" * 64, source=name, reproduce="render")
        for stage in plan.stages:
            if not stage.container:
                off_container.update(str(cmd[cmd.index("-m") + 1]) for cmd in stage.commands if "-m" in cmd)
    assert "lingjun_slurm.stages" in off_container, "no scenario renders the image stage on the host any more"
    assert run | off_container <= host, f"run on the host but not in HOST_SIDE: {sorted((run | off_container) - host)}"
    assert all(key in modules for key in HOST_SIDE), [key for key in HOST_SIDE if key not in modules]
    assert all(target in graph[source] for source, target in CONTAINER_SIDE), \
        [edge for edge in CONTAINER_SIDE if edge[1] not in graph[edge[0]]]


def test_host_side_code_imports_only_the_standard_library_statically() -> None:
    """Rule 2 (b): the host's python3 has nothing installed (docs/architecture.md, "What runs where"):
    the closure of the host-side modules' imports, lazy ones included, is stdlib and lingjun_slurm."""
    modules, graph = tree()
    closure = host_closure(graph, host_modules(modules))
    assert {"lingjun_slurm.injob.host.watchdog", "lingjun_slurm.images.enroot", "lingjun_slurm.common.atomicfile",
            "lingjun_slurm.injob.preflight.judge"} <= closure
    assert "lingjun_slurm.injob.train.model" not in closure
    found = host_static_violations(modules, graph)
    assert not found, f"host-side modules importing outside the standard library: {found}"


def test_host_side_code_runs_with_the_standard_library_only(tmp_path: Path) -> None:
    """Rule 2 (a): imported and run (`-m ... --help`) where every non-stdlib import is refused."""
    got = host_dynamic(REPO, tmp_path, tiny_plan_json(tmp_path))
    assert not got["refused"], f"host-side code imported outside the standard library: {got['refused']}"
    assert not got["failed"], got["failed"]
    usages = set(re.findall(r"^usage: python3 -m ([\w.]+)", got["stdout"], re.M))
    assert {"lingjun_slurm.stages", "lingjun_slurm.injob.host.exclusion", "lingjun_slurm.injob.host.watchdog",
            "lingjun_slurm.injob.host.retry"} <= usages, usages


def test_rule_2_sees_a_planted_import(planted: Path, tmp_path: Path) -> None:
    """A module-level import in the image stage's code fails both checks; a lazy one deeper in the
    closure fails the static one; one in a container stage (beyond CONTAINER_SIDE) fails neither."""
    plant_at_top(planted, "images/reference.py", "import yaml")  # run: both checks see it
    plant_in_function(planted, "common/holderlock.py", "import numpy")  # lazy, deeper: the closure sees it
    plant_at_top(planted, "injob/stages/train.py", "import torch")  # the container's side: neither
    modules, graph = tree()
    assert set(host_static_violations(modules, graph)) == {"lingjun_slurm.images.reference",
                                                           "lingjun_slurm.common.holderlock"}
    got = host_dynamic(planted, tmp_path, tiny_plan_json(tmp_path))
    assert refusals(got) == {("yaml", "lingjun_slurm.images.reference")}, (got["refused"], got["failed"])


# ============================================================================== rule 3
def test_the_pipeline_set_comes_from_the_tree() -> None:
    modules, _ = tree()
    pipeline = pipeline_modules(modules)
    assert {"lingjun_slurm", "lingjun_slurm.plan", "lingjun_slurm.render", "lingjun_slurm.spec.load",
            "lingjun_slurm.planner.estimate", "lingjun_slurm.images.cache",
            "lingjun_slurm.report.charts"} <= set(pipeline)
    assert not [m for m in pipeline if any(under(m, f"lingjun_slurm.{x}") for x in NOT_PIPELINE)]


def test_the_pipeline_names_no_training_stack_import() -> None:
    """Rule 3, read statically: no pipeline module imports torch, megatron or numpy, lazily or not."""
    modules, _ = tree()
    found = pipeline_static_violations(modules)
    assert not found, f"the user-side pipeline imports the training stack: {found}"


def test_the_pipeline_runs_without_torch_megatron_or_numpy(tmp_path: Path) -> None:
    """Rule 3: the user's machine needs no training stack (docs/architecture.md): every pipeline
    module imports, and every example loads, plans and renders, and validate/render/plan run, with
    torch, megatron and numpy refused."""
    got = pipeline_dynamic(REPO, tmp_path)
    assert not got["refused"], f"the user-side pipeline imported the training stack: {got['refused']}"
    assert not got["failed"], got["failed"]


def test_rule_3_sees_a_planted_import(planted: Path, tmp_path: Path) -> None:
    """A new top-level module is in the pipeline by itself; a lazy import is seen when the user's path runs it."""
    (planted / "lingjun_slurm" / "wings_planted.py").write_text("import megatron\n", encoding="utf-8")
    plant_in_function(planted, "planner/estimate.py", "import torch", function="make")  # the `plan` command's path
    modules, _ = tree()
    assert set(pipeline_static_violations(modules)) == {"lingjun_slurm.wings_planted",
                                                        "lingjun_slurm.planner.estimate"}
    got = pipeline_dynamic(planted, tmp_path)
    assert refusals(got) == {("megatron", "lingjun_slurm.wings_planted"),
                             ("torch", "lingjun_slurm.planner.estimate")}, (got["refused"], got["failed"])
