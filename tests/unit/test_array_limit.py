"""data.max_running: the preprocess array's `%` concurrency limit (Slurm's `--array=0-N%M`), its
validation, MaxArraySize (Slurm's default 1001: presets/slurm_limits.yaml), and the local
executor honouring the limit. Slurm's own behaviour with the limit, on a real cluster:
tests/integration/test_array_scale.py and bench/scale_array.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm.plan import build_plan
from lingjun_slurm.presets import load
from lingjun_slurm.runs.logs import array_indices, array_limit
from lingjun_slurm.spec import parse_spec
from lingjun_slurm.spec.checks import array_size_hint, check_array_size
from tests.unit.clirun import run_cli


def _doc(tmp: Path, shards: int = 4, max_running: Any = None, **data: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"inputs": [str(tmp / "in" / "*.jsonl")], "shards": shards,
                         "tokenizer": {"type": "null", "vocab_size": 512}, "workers": 1, **data}
    if max_running is not None:
        d["max_running"] = max_running
    return {"version": 1, "run": {"name": "arr", "workdir": str(tmp / "work")},
            "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"},
                        "stages": {"preprocess": {"cpus_per_task": 1}}},
            "container": {"runtime": "none"}, "data": d,
            "stages": {"train": {"skip": True}, "checkpoint": {"skip": True}}}


def _spec(tmp: Path, **kw: Any) -> Any:
    return parse_spec(yaml.safe_dump(_doc(tmp, **kw)), "s.yaml").spec


def _preprocess(plan: Any) -> Any:
    return next(st for st in plan.stages if st.kind == "preprocess")


def test_max_running_becomes_slurms_percent_limit(tmp_path: Path) -> None:
    pre = _preprocess(build_plan(_spec(tmp_path, shards=1024, max_running=8)))
    assert pre.array == "0-1023%8"
    assert ("array", "0-1023%8") in [tuple(x) for x in pre.sbatch]
    assert array_indices(pre.array) == list(range(1024)) and array_limit(pre.array) == 8


def test_no_limit_or_one_that_limits_nothing_is_plain(tmp_path: Path) -> None:
    assert _preprocess(build_plan(_spec(tmp_path, shards=4))).array == "0-3"
    assert _preprocess(build_plan(_spec(tmp_path, shards=4, max_running=4))).array == "0-3"
    assert _preprocess(build_plan(_spec(tmp_path, shards=4, max_running=3))).array == "0-3%3"


def test_the_rendered_script_carries_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_doc(tmp_path, shards=16, max_running=2)))
    code, out, err = run_cli(capsys, "render", str(spec), "--stage", "preprocess")
    assert code == 0, err
    assert "#SBATCH --array=0-15%2\n" in out


@pytest.mark.parametrize("value", [0, -1, "two", 10001, True])
def test_a_bad_limit_names_file_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: Any) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_doc(tmp_path, max_running=value), sort_keys=False))
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "max_running" in text)
    code, out, err = run_cli(capsys, "validate", str(spec))
    assert code == 2 and "Traceback" not in err
    assert f"s.yaml:{line}" in err and "data.max_running" in err


def test_max_array_size_known_refuses_an_array_past_it_with_the_field(tmp_path: Path) -> None:
    spec = _spec(tmp_path, shards=1024, max_running=8)
    issues = check_array_size(spec, 1001)
    assert len(issues) == 1 and issues[0].loc == ("data", "shards")
    assert "MaxArraySize=1001" in issues[0].message and "0-1023" in issues[0].message
    assert "at least 1024" in issues[0].message
    assert check_array_size(spec, 1024) == []  # largest index 1023 < 1024 (slurm.conf(5))
    assert len(check_array_size(spec, 1023)) == 1
    assert check_array_size(spec, 4001) == [] and check_array_size(spec, None) == []
    off = check_array_size(_spec(tmp_path, shards=1), 0)
    assert len(off) == 1 and "MaxArraySize=0" in off[0].message


def test_validate_warns_past_slurms_default_max_array_size(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert load("slurm_limits.yaml")["max_array_size"] == {"default": 1001, "max": 4000001}
    assert array_size_hint(_spec(tmp_path, shards=1001)) == []
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_doc(tmp_path, shards=1024, max_running=8), sort_keys=False))
    code, out, err = run_cli(capsys, "validate", str(spec))
    assert code == 0
    assert "warning:" in err and "data.shards" in err and "MaxArraySize >= 1024" in err and "1001" in err


def test_array_limit_parses_slurms_syntax() -> None:
    assert array_limit("0-1023%8") == 8 and array_limit("1,4,7-9%1") == 1
    assert array_limit("0-3") is None and array_limit("0-3%0") is None  # atoi 0: no limit in slurmctld
    assert array_indices("0-15:4%2") == [0, 4, 8, 12]


def test_the_local_executor_runs_at_most_max_running_tasks_at_once(tmp_path: Path) -> None:
    """A real preprocess of 4 shards with max_running 1 under the local executor (which runs as
    many tasks at once as there are CPUs, at least 2 on CI): the task records' start/end times never overlap."""
    (tmp_path / "in").mkdir()
    for i in range(4):
        (tmp_path / "in" / f"{i}.jsonl").write_text("".join(json.dumps({"text": f"{i} {j} 3"}) + "\n"
                                                            for j in range(20)))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_doc(tmp_path, shards=4, max_running=1), sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli.main", "submit", str(spec),
                           "--executor", "local"], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "LINGJUN_STATE_DIR": str(tmp_path / "state"),
                               "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    state = next((tmp_path / "work" / "runs").glob("*/local-state.json"))
    tasks = [t for t in json.loads(state.read_text())["tasks"] if t["stage"] == "preprocess"]
    assert len(tasks) == 4 and all(t["state"] == "COMPLETED" for t in tasks)
    events = sorted([(t["start"], 1) for t in tasks] + [(t["end"], -1) for t in tasks])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 1, tasks


def test_submit_refuses_an_array_above_the_clusters_max_array_size_before_anything_is_queued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`scontrol show config` says MaxArraySize=1001 (Slurm's default): a 1,024-shard preprocess is
    refused with the spec's file, line and field, and no sbatch ran (sbatch would have refused the
    array only after the stages before it were queued)."""
    from typing import Mapping, Optional

    from lingjun_slurm.common.errors import SpecError
    from lingjun_slurm.runs.index import RunIndex
    from lingjun_slurm.spec import load_spec
    from lingjun_slurm.submit import prepare, submit_slurm
    from lingjun_slurm.transport.local import LocalTransport

    class Stub(LocalTransport):
        def _run(self, argv: tuple[str, ...], *, cwd: Optional[str], env: Optional[Mapping[str, str]],
                 input: Optional[str], timeout: Optional[float]) -> tuple[int, str, str]:
            if argv[:3] == ("scontrol", "show", "config"):
                return 0, "ClusterName = maxarr\nSLURM_VERSION = 22.05.8\nMaxArraySize = 1001\n", ""
            if argv[0] in ("sbatch", "scontrol", "scancel"):
                raise AssertionError(f"nothing may be queued: {argv}")
            return super()._run(argv, cwd=cwd, env=env, input=input, timeout=timeout)

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))  # a cluster of this test's own
    (tmp_path / "slurm.conf").write_text("ClusterName=maxarr\n")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a"}\n')
    spec = tmp_path / "s.yaml"
    spec.write_text(f"version: 1\nrun:\n  name: big\n  workdir: {tmp_path / 'w'}\ncluster:\n  network:\n"
                    f"    profile: tcp\ncontainer:\n  runtime: none\ndata:\n  inputs: [{corpus}]\n  tokenizer:\n"
                    "    type: \"null\"\n    vocab_size: 512\n  shards: 1024\n"
                    "stages:\n  train:\n    skip: true\n  checkpoint:\n    skip: true\n")
    loaded = load_spec(spec)
    prep = prepare(loaded, run_id="big-1", executor="slurm")
    with pytest.raises(SpecError) as err:
        submit_slurm(Stub(), prep, RunIndex(tmp_path / "state"), echo=lambda line: None)
    text = str(err.value)
    assert f"{spec}:15" in text and "data.shards" in text and "MaxArraySize=1001" in text, text
    assert not (tmp_path / "w").exists()
