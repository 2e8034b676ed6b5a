"""The status parsers and the options the tool uses, across Slurm 22.05 to 25.11.

Fixtures: tests/fixtures/slurm/versions/ (SOURCES.md says where each file comes from):
*_recorded.json are real slurmrestd answers of each version (Slurm-web's test assets),
*_scenarios.json are real records of each version with the parsed fields set per scenario in
that version's data_parser encoding, options.json is each release's option tables
(tools/slurm_options.py). docs/slurm-versions.md summarises what differs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Iterator

import pytest

from lingjun_slurm.slurm.parse import (
    SACCT_FIELDS,
    JobInfo,
    SlurmParseError,
    parse_sacct_json,
    parse_sacct_parsable,
    parse_squeue_json,
)
from tests.conftest import REPO, render_scenario, scenario_files

VERSIONS_DIR = REPO / "tests" / "fixtures" / "slurm" / "versions"
JSON_VERSIONS = {"23.02": 39, "23.11": 40, "24.05": 41, "24.11": 42, "25.05": 43, "25.11": 44}
ALL_VERSIONS = ("22.05", *JSON_VERSIONS)
T0 = 1767261600  # 2026-01-01T10:00:00Z, the scenarios' time origin (make_fixtures.py)


def read(name: str) -> str:
    return (VERSIONS_DIR / name).read_text()


def by_id(jobs: list[JobInfo]) -> dict[str, JobInfo]:
    ids = [j.job_id for j in jobs]
    assert len(ids) == len(set(ids)), ids
    return {j.job_id: j for j in jobs}


@pytest.fixture
def utc() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


def rel(t: float | None) -> int | None:
    return None if t is None else int(t - T0)


# ---------------------------------------------------------------------------- fixture shapes


@pytest.mark.parametrize("version", JSON_VERSIONS)
def test_fixtures_have_their_versions_shapes(version: str) -> None:
    """Each file is in its version's shape (guards against a fixture of the wrong version)."""
    dp = JSON_VERSIONS[version]
    for kind in ("recorded", "scenarios"):
        doc = json.loads(read(f"squeue_{version}_{kind}.json"))
        meta = json.dumps(doc["meta"])
        assert f"v0.0.{dp}" in meta and version.split(".")[0] in meta
        for job in doc["jobs"]:
            assert isinstance(job["job_state"], str if dp == 39 else list)
            assert isinstance(job["array_task_id"], dict) and set(job["array_task_id"]) == {"set", "infinite", "number"}
            if dp == 39:
                assert set(job["exit_code"]) == {"set", "infinite", "number"}  # raw wait status
                assert isinstance(job["start_time"], int)
            else:
                assert set(job["exit_code"]) == {"status", "return_code", "signal"}
                assert isinstance(job["exit_code"]["status"], list)
                assert set(job["start_time"]) == {"set", "infinite", "number"}
        sacct = json.loads(read(f"sacct_{version}_{kind}.json"))
        for job in sacct["jobs"]:
            assert isinstance(job["state"]["current"], str if dp == 39 else list)
            assert isinstance(job["exit_code"]["status"], str if dp == 39 else list)
            assert isinstance(job["time"]["start"], int)
            assert ("restart_cnt" in job) == (dp >= 42)


# ---------------------------------------------------------------------------- squeue --json

# job id -> (state, flags, reason, exit code, signal, start, end, nodes, restarts, array job, task, pending)
SQUEUE_EXPECTED: dict[str, tuple] = {
    "101": ("PENDING", (), "Dependency", None, None, None, None, None, 0, None, None, None),
    "102": ("PENDING", (), "DependencyNeverSatisfied", None, None, None, None, None, 0, None, None, None),
    "103": ("RUNNING", (), None, None, None, 60, None, "cn[1-2]", 0, None, None, None),
    "104": ("COMPLETED", (), None, 0, 0, 10, 40, "cn1", 0, None, None, None),
    "105": ("FAILED", (), "NonZeroExitCode", 7, 0, 12, 17, "cn2", 0, None, None, None),
    "106": ("FAILED", (), "JobLaunchFailure", None, 9, 14, 15, "cn2", 0, None, None, None),
    "107": ("CANCELLED", (), None, None, 15, 15, 35, "cn1", 0, None, None, None),
    "108": ("TIMEOUT", (), "TimeLimit", None, 15, 16, 77, "cn3", 0, None, None, None),
    "109": ("FAILED", ("COMPLETING",), "NonZeroExitCode", 7, 0, 17, 20, "cn3", 0, None, None, None),
    "110_0": ("RUNNING", (), None, None, None, 20, None, "cn1", 0, "110", 0, None),
    "110_1": ("COMPLETED", (), None, 0, 0, 20, 28, "cn2", 0, "110", 1, None),
    "110_[2-5]": ("PENDING", (), "JobArrayTaskLimit", None, None, None, None, None, 0, "110", None, "2-5"),
    "120": ("PENDING", (), "BeginTime", None, None, None, None, None, 1, None, None, None),
    "121": ("RUNNING", (), None, None, None, 40, None, "cn4", 2, None, None, None),
    "122": ("PENDING", ("REQUEUE_HOLD",), "JobHeldUser", None, None, None, None, None, 1, None, None, None),
}


def squeue_expected(version: str) -> dict[str, tuple]:
    expected = dict(SQUEUE_EXPECTED)
    if JSON_VERSIONS[version] == 39:
        # 23.02 prints job_state_string(): a set flag replaces the base state.
        expected["109"] = ("COMPLETING",) + ((),) + expected["109"][2:]
        expected["122"] = ("REQUEUE_HOLD",) + ((),) + expected["122"][2:]
    return expected


@pytest.mark.parametrize("version", JSON_VERSIONS)
def test_squeue_scenarios(version: str) -> None:
    """squeue_<v>_scenarios.json: pending (dependency), running, completed, exit 7, SIGKILL,
    cancelled, timeout, an array (tasks and remainder), requeued jobs, in each version's shape."""
    jobs = by_id(parse_squeue_json(read(f"squeue_{version}_scenarios.json")))
    got = {jid: (j.state, j.flags, j.reason, j.exit_code, j.signal, rel(j.start), rel(j.end), j.nodes, j.restarts,
                 j.array_job_id, j.array_task_id, j.array_tasks_pending) for jid, j in jobs.items()}
    assert got == squeue_expected(version)
    assert {j.name for j in jobs.values()} >= {"pend_dep", "fail7", "arr", "requeued"}
    assert all(j.source == "squeue" and j.elapsed_s is None for j in jobs.values())


# version -> {job id: (state, reason, exit code, signal, nodes)} of the real recordings
SQUEUE_RECORDED = {
    "23.02": {"307": ("COMPLETED", None, 0, 0, "cn[001-050,052-065]"), "310": ("RUNNING", None, None, None, "cn[052-067]"),
              "326": ("PENDING", "Resources", None, None, None), "327": ("PENDING", "Priority", None, None, None)},
    "23.11": {"671": ("PENDING", "Priority", None, None, None), "717": ("COMPLETED", None, 0, 0, "cn3"),
              "808": ("PENDING", "ReqNodeNotAvail", None, None, None), "816": ("RUNNING", None, None, None, "cn1"),
              "823": ("PENDING", "Resources", None, None, None)},
    "24.05": {"649717": ("TIMEOUT", "TimeLimit", None, 15, "cn001"), "649718": ("COMPLETED", None, 0, 0, "cn001"),
              "649719": ("FAILED", "NonZeroExitCode", 1, 0, "cn001"), "649722": ("RUNNING", None, None, None, "cn001"),
              "649730": ("PENDING", "BeginTime", None, None, None)},
    "24.11": {"6355": ("CANCELLED", None, None, 15, "ia1"), "6357": ("TIMEOUT", "TimeLimit", None, 15, "cn1"),
              "6358": ("COMPLETED", None, 0, 0, "cn1"), "6359": ("FAILED", "NonZeroExitCode", 1, 0, "cn1"),
              "6360": ("RUNNING", None, None, None, "cn1"), "6369": ("PENDING", "Resources", None, None, None),
              "6370": ("PENDING", "BeginTime", None, None, None)},
    "25.05": {"2195": ("CANCELLED", "QOSMaxCpuPerJobLimit", 0, 0, None), "4728": ("CANCELLED", None, None, 15, "gpu1"),
              "4730": ("TIMEOUT", "TimeLimit", None, 15, "cn1"), "4731": ("COMPLETED", None, 0, 0, "cn1"),
              "4732": ("FAILED", "NonZeroExitCode", 1, 0, "cn1"), "4734": ("RUNNING", None, None, None, "cn[1-3]"),
              "4741": ("PENDING", "Resources", None, None, None), "4743": ("PENDING", "BeginTime", None, None, None)},
    "25.11": {"5736": ("CANCELLED", None, None, 15, "gpu1"), "5737": ("TIMEOUT", "TimeLimit", None, 15, "cn1"),
              "5738": ("COMPLETED", None, 0, 0, "cn1"), "5739": ("FAILED", "NonZeroExitCode", 1, 0, "cn1"),
              "5745": ("RUNNING", None, None, None, "cn1"), "5750": ("PENDING", "BeginTime", None, None, None)},
}


@pytest.mark.parametrize("version", JSON_VERSIONS)
def test_squeue_recorded(version: str) -> None:
    """squeue_<v>_recorded.json: real answers of each version (Slurm-web's recordings)."""
    jobs = by_id(parse_squeue_json(read(f"squeue_{version}_recorded.json")))
    got = {jid: (j.state, j.reason, j.exit_code, j.signal, j.nodes) for jid, j in jobs.items()}
    assert got == SQUEUE_RECORDED[version]
    for job in jobs.values():
        assert job.array_job_id is None and job.restarts == 0 and job.flags == ()
        if job.state == "PENDING":
            assert job.start is None and job.end is None  # estimates are not kept
        if job.state == "RUNNING":
            assert job.start and job.end is None
        if job.state in ("COMPLETED", "FAILED", "TIMEOUT") or job.signal:
            assert job.start <= job.end


# ---------------------------------------------------------------------------- sacct --json

# job id -> (state, flags, reason, exit code, signal, start, end, elapsed, nodes, restarts, array job, task, pending)
SACCT_EXPECTED: dict[str, tuple] = {
    "101": ("PENDING", (), "Dependency", None, None, None, None, 0, None, 0, None, None, None),
    "103": ("RUNNING", (), None, None, None, 60, None, 600, "cn[1-2]", 0, None, None, None),
    "104": ("COMPLETED", (), None, 0, 0, 10, 40, 30, "cn1", 0, None, None, None),
    "105": ("FAILED", (), None, 7, 0, 12, 17, 5, "cn2", 0, None, None, None),
    "106": ("FAILED", (), None, None, 9, 14, 15, 1, "cn2", 0, None, None, None),
    "107": ("CANCELLED", (), None, 0, 0, 15, 35, 20, "cn1", 0, None, None, None),
    "108": ("TIMEOUT", (), None, 0, 0, 16, 77, 61, "cn3", 0, None, None, None),
    "110_0": ("RUNNING", (), None, None, None, 20, None, 600, "cn1", 0, "110", 0, None),
    "110_1": ("COMPLETED", (), None, 0, 0, 20, 28, 8, "cn2", 0, "110", 1, None),
    "110_[2-5]": ("PENDING", (), "JobArrayTaskLimit", None, None, None, None, 0, None, 0, "110", None, "2-5"),
    # two runs (--duplicates): the first REQUEUED, the second wins; one restart.
    "120": ("COMPLETED", (), "BeginTime", 0, 0, 50, 59, 9, "cn2", 1, None, None, None),
}


def _sacct_got(jobs: list[JobInfo]) -> dict[str, tuple]:
    return {jid: (j.state, j.flags, j.reason, j.exit_code, j.signal, rel(j.start), rel(j.end), j.elapsed_s, j.nodes,
                  j.restarts, j.array_job_id, j.array_task_id, j.array_tasks_pending) for jid, j in by_id(jobs).items()}


@pytest.mark.parametrize("version", JSON_VERSIONS)
def test_sacct_json_scenarios(version: str) -> None:
    """sacct_<v>_scenarios.json: the same jobs as sacct's job records in each version's shape.

    23.02 (v0.0.39) prints every exited job as {"status": "SUCCESS", "return_code": 0}, even
    `exit 7`: only COMPLETED jobs get exit code 0 from it, the others None (unknown).
    """
    expected = dict(SACCT_EXPECTED)
    if JSON_VERSIONS[version] == 39:
        for jid in ("105", "107", "108"):
            expected[jid] = expected[jid][:3] + (None, None) + expected[jid][5:]
    assert _sacct_got(parse_sacct_json(read(f"sacct_{version}_scenarios.json"))) == expected


def test_sacct_json_2302_exit_object_is_not_read_as_a_list() -> None:
    """v0.0.39's string status must not be read character by character, nor its -127 as an exit code."""
    jobs = by_id(parse_sacct_json(read("sacct_23.02_scenarios.json")))
    assert (jobs["105"].exit_code, jobs["105"].signal) == (None, None)  # not (0, 0): 7 is lost in 23.02
    assert (jobs["106"].exit_code, jobs["106"].signal) == (None, 9)  # not (-127, 0)


SACCT_RECORDED = {
    "23.02": {"307": ("COMPLETED", 0, 0, 360), "326": ("PENDING", None, None, 0), "310": ("RUNNING", None, None, 92)},
    "23.11": {"816": ("COMPLETED", 0, 0, 361), "1717": ("FAILED", 1, 0, 360), "671": ("PENDING", None, None, 0),
              "760": ("RUNNING", None, None, 310)},
    "24.05": {"649718": ("COMPLETED", 0, 0, 1), "649719": ("FAILED", 1, 0, 1), "649717": ("TIMEOUT", 0, 0, 83),
              "649730": ("PENDING", None, None, 0), "649722": ("RUNNING", None, None, 88)},
    "24.11": {"6362": ("COMPLETED", 0, 0, 61), "6359": ("FAILED", 1, 0, 1), "6357": ("TIMEOUT", 0, 0, 65),
              "6370": ("PENDING", None, None, 0), "6368": ("RUNNING", None, None, 56)},
    "25.05": {"4742": ("COMPLETED", 0, 0, 60), "4732": ("FAILED", 1, 0, 2), "4730": ("TIMEOUT", 0, 0, 63),
              "4743": ("PENDING", None, None, 0), "4739": ("RUNNING", None, None, 25)},
    "25.11": {"5749": ("COMPLETED", 0, 0, 30), "5739": ("FAILED", 1, 0, 2), "5737": ("TIMEOUT", 0, 0, 82),
              "5750": ("PENDING", None, None, 0), "5748": ("RUNNING", None, None, 72)},
}


@pytest.mark.parametrize("version", JSON_VERSIONS)
def test_sacct_json_recorded(version: str) -> None:
    """sacct_<v>_recorded.json: real slurmdbd job records of each version (Slurm-web)."""
    jobs = by_id(parse_sacct_json(read(f"sacct_{version}_recorded.json")))
    assert {jid: (j.state, j.exit_code, j.signal, j.elapsed_s) for jid, j in jobs.items()} == SACCT_RECORDED[version]
    for job in jobs.values():
        assert job.source == "sacct" and job.array_job_id is None
        if job.state == "PENDING":
            assert job.start is None and job.end is None and job.nodes is None  # "None assigned"
        else:
            assert job.start and job.nodes


def test_sacct_json_errors() -> None:
    with pytest.raises(SlurmParseError, match="sacct --json output is not valid JSON"):
        parse_sacct_json("{")
    with pytest.raises(SlurmParseError, match=r"sacct --json jobs\[0\] has no job_id"):
        parse_sacct_json('{"jobs": [{"name": "x"}]}')
    with pytest.raises(SlurmParseError, match="sacct --json reported errors: boom"):
        parse_sacct_json('{"jobs": [], "errors": [{"description": "boom"}]}')
    assert parse_sacct_json('{"jobs": [], "errors": []}') == []


# ---------------------------------------------------------------------------- sacct --parsable2


def test_sacct_text_scenarios(utc: None) -> None:
    """sacct_23.02-25.11_scenarios.txt: the -P text of the same jobs (print.c is unchanged in
    every version), parsed to the same records as 24.05+'s sacct --json."""
    assert _sacct_got(parse_sacct_parsable(read("sacct_23.02-25.11_scenarios.txt"))) == SACCT_EXPECTED


# ---------------------------------------------------------------------------- options

OPTIONS = json.loads(read("options.json"))
# pyxis's SPANK options (github.com/NVIDIA/pyxis): not in Slurm's tables, present when pyxis is.
PYXIS = {"container-image", "container-mounts", "container-workdir", "container-name", "container-mount-home",
         "no-container-mount-home", "container-remap-root", "no-container-remap-root", "container-writable",
         "container-readonly", "container-env"}
COMMANDS = ("sbatch", "srun", "squeue", "sacct", "scancel", "scontrol")


def test_options_json_covers_every_version() -> None:
    assert set(ALL_VERSIONS) <= set(OPTIONS)
    for version in ALL_VERSIONS:
        entry = OPTIONS[version]
        assert entry["tag"].startswith("slurm-" + version.replace(".", "-"))
        assert {"account", "array", "dependency", "time"} <= set(entry["sbatch"])
        assert {"kill-on-bad-exit", "mpi"} <= set(entry["srun"]) and "kill-on-bad-exit" not in entry["sbatch"]


def _words(script: str) -> list[list[str]]:
    """Shell lines (continuations joined) as words; comments and #SBATCH lines left out."""
    joined = re.sub(r"\\\n\s*", " ", script)
    lines = []
    for line in joined.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            lines.append(shlex.split(stripped, comments=True))
        except ValueError:
            lines.append(stripped.split())
    return lines


def _invocations(words: list[str], used: dict[str, set[str]]) -> None:
    for i, word in enumerate(words):
        command = re.sub(r"^.*\$\(", "", word)  # "x=$(scontrol" -> "scontrol"
        if command not in COMMANDS:
            continue
        rest = words[i + 1:]
        if command == "scontrol":
            subs = [w for w in rest[:2] if re.fullmatch(r"[a-z]+", w)]
            used["scontrol"].update(subs)
            continue
        for option in rest:
            if not option.startswith("--"):
                if command in ("srun", "sbatch") and not option.startswith("-"):
                    break
                continue
            used[command].add(option[2:].split("=", 1)[0])


def _option_words(nodes: list[ast.expr]) -> list[str]:
    words = []
    for elt in nodes:
        if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
            words.append(elt.value)
        elif isinstance(elt, ast.JoinedStr) and elt.values and isinstance(elt.values[0], ast.Constant):
            words.append(str(elt.values[0].value))
        elif isinstance(elt, (ast.List, ast.Tuple)):
            words += _option_words(list(elt.elts))
        elif isinstance(elt, (ast.BinOp, ast.IfExp)):
            words += _option_words([c for c in ast.iter_child_nodes(elt) if isinstance(c, ast.expr)])
    return words


def _python_invocations(used: dict[str, set[str]]) -> None:
    """argv lists in lingjun_slurm/ whose first item is a Slurm command, with what is added to
    them (`+ [...]`, `argv.append(...)`, `argv += [...]`): their --options and scontrol words."""
    for path in sorted((REPO / "lingjun_slurm").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope in scopes or [tree]:
            _scope_invocations(scope, used)


def _scope_invocations(scope: ast.AST, used: dict[str, set[str]]) -> None:
    argv_names: dict[str, str] = {}  # argv variables of this function
    for node in ast.walk(scope):
        if isinstance(node, ast.BinOp):
            continue  # handled through the list inside it
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in COMMANDS:
            command, words = node.elts[0].value, _option_words(list(node.elts[1:]))
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.BinOp)):
            first = node.value if isinstance(node.value, ast.List) else node.value.left
            if isinstance(first, ast.List) and first.elts and isinstance(first.elts[0], ast.Constant) \
                    and first.elts[0].value in COMMANDS:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        argv_names[target.id] = first.elts[0].value
                command, words = first.elts[0].value, _option_words([node.value])
            else:
                continue
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in argv_names \
                and node.func.attr in ("append", "extend"):
            command, words = argv_names[node.func.value.id], _option_words(list(node.args))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) \
                and node.target.id in argv_names:
            command, words = argv_names[node.target.id], _option_words([node.value])
        else:
            continue
        if command == "scontrol":
            used["scontrol"].update(w for w in words[:2] if re.fullmatch(r"[a-z]+", w))
        else:
            used[command].update(w[2:].split("=", 1)[0] for w in words if w.startswith("--"))


def _rendered_scripts(tmp_path: Path) -> dict[str, str]:
    from tests.golden.test_golden_nccl import CASES, render_case

    scripts: dict[str, str] = {}
    for name, path in scenario_files().items():
        for file, text in render_scenario(name, path).items():
            if file.endswith((".sbatch", ".sh")):
                scripts[f"{name}/{file}"] = text
    for name, args in CASES.items():
        scripts[f"{name}/nccl-test.sbatch"] = render_case(args, tmp_path / name)
    return scripts


@pytest.fixture(scope="module")
def used_options(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    used: dict[str, set[str]] = {c: set() for c in COMMANDS}
    scripts = _rendered_scripts(tmp_path_factory.mktemp("render"))
    assert len(scripts) >= 10
    for text in scripts.values():
        for match in re.finditer(r"^#SBATCH --([A-Za-z0-9-]+)", text, re.M):
            used["sbatch"].add(match.group(1))
        for words in _words(text):
            _invocations(words, used)
    _python_invocations(used)
    return used


def test_used_options_were_found(used_options: dict[str, set[str]]) -> None:
    """The extraction sees what the tool is known to use (so an empty set cannot pass)."""
    assert {"job-name", "output", "open-mode", "nodes", "ntasks-per-node", "signal", "requeue", "no-requeue",
            "kill-on-invalid-dep", "parsable", "hold", "dependency"} <= used_options["sbatch"]
    assert {"kill-on-bad-exit", "mpi", "container-image"} <= used_options["srun"]
    assert {"json", "me"} <= used_options["squeue"]
    assert {"parsable2", "noheader", "allocations", "duplicates", "format", "jobs"} <= used_options["sacct"]
    assert {"signal", "me", "name"} <= used_options["scancel"]
    assert {"release", "requeue", "show", "hostnames", "config", "node"} <= used_options["scontrol"]


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_every_used_option_exists(version: str, used_options: dict[str, set[str]]) -> None:
    """Every option the scripts and the Python code pass exists in this Slurm release."""
    table = OPTIONS[version]
    missing: dict[str, list[str]] = {}
    for command in COMMANDS:
        known = set(table[command])
        names = used_options[command] - (PYXIS if command == "srun" else set())
        if command == "scontrol":  # scontrol accepts any unambiguous prefix of a keyword
            lost = [w for w in names if not any(k.startswith(w) for k in known)]
        else:
            lost = sorted(names - known)
        if lost:
            missing[command] = sorted(lost)
    assert not missing, f"Slurm {version} ({table['tag']}) lacks: {missing}"


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_sacct_fields_exist(version: str) -> None:
    fields = {f.lower() for f in OPTIONS[version]["sacct_fields"]}
    assert {f.lower() for f in SACCT_FIELDS} <= fields


# sbatch_extra keys the spec allows that a release lacks (docs/slurm-versions.md): sbatch
# --tres-per-task appeared in 23.02; on 22.05 sbatch rejects it ("unrecognized option").
KNOWN_GAPS = {"22.05": ["tres-per-task"]}


@pytest.mark.parametrize("version", ALL_VERSIONS)
def test_sbatch_extra_allow_list_exists(version: str) -> None:
    """Every key a spec may put in cluster.sbatch_extra is an sbatch option of this release."""
    from lingjun_slurm.spec.checks import SBATCH_EXTRA_ALLOWED

    missing = sorted(SBATCH_EXTRA_ALLOWED - set(OPTIONS[version]["sbatch"]))
    assert missing == KNOWN_GAPS.get(version, []), f"Slurm {version} sbatch lacks {missing}"
