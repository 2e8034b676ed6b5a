"""Hostile spec files through the real CLI: `lingjun-slurm validate` exits 2 with one clear
message naming the file, the line and the field, and never prints a traceback or
"internal error" (issue 15, items 5 and 6).

Most cases run the CLI in-process (lingjun_slurm.cli.main.main, what the console script calls);
the ones about the process itself (a FIFO that must not block, /dev/zero that never ends,
Python's recursion limit, the time a 1 MiB + 1 byte file takes) run `python -m lingjun_slurm.cli.main`
in a subprocess. The limits themselves are checked against the real things where they run
here: Slurm 22.05's own time_str2mins / str_to_mbytes (libslurmfull.so, through ctypes), the
kernel's execve and path limits, bash's test and read-only variables, numpy's seed range.
"""

from __future__ import annotations

import copy
import ctypes
import errno
import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import pytest
import yaml

from lingjun_slurm.cli.main import main
from lingjun_slurm.common.errors import SpecError
from lingjun_slurm.spec import models, parse_spec, yamlpos
from lingjun_slurm.spec.load import MAX_ISSUES
from tests.unit.test_invalid_specs import expected_line, megatron_base, mutate, tiny_base

FORBIDDEN = ("Traceback", "internal error")


def run_validate(path: Path | str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`lingjun-slurm validate PATH` in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(path)])
    out, err = capsys.readouterr()
    for word in FORBIDDEN:
        assert word not in out + err, out + err
    code = exc.value.code
    return (code if isinstance(code, int) else 1), out, err


def run_cli(path: Path | str, timeout: float = 120) -> tuple[int, str, float]:
    """`lingjun-slurm validate PATH` in a fresh interpreter: (exit code, stdout+stderr, seconds)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - start
    text = proc.stdout + proc.stderr
    for word in FORBIDDEN:
        assert word not in text, text
    return proc.returncode, text, took


def one_issue(err: str, path: Path | str, line: int | None, field: str, expect: str) -> None:
    """Exactly one problem, at path:line, naming field, saying expect."""
    rows = [row.strip() for row in err.splitlines() if row.strip()]
    assert rows[0] == f"{path}: invalid spec (1 problem)", err
    where = f"{path}:{line}" if line else f"{path}"
    assert rows[1].startswith(f"{where}: {field}: "), f"expected {where}: {field}: ... in:\n{err}"
    assert expect in rows[1], f"{expect!r} not in {rows[1]!r}"


# ---- cases built from the valid bases of test_invalid_specs.py -------------------------------

class Mut(NamedTuple):
    base: str
    mutations: dict[str, Any]
    field: str
    expect: str


def m(base: str, mutations: dict[str, Any], field: str, expect: str, id: str) -> Any:
    return pytest.param(Mut(base, mutations, field, expect), id=id)


INF, NAN = float("inf"), float("nan")
MUTATIONS = [
    # floats: NaN and infinities (YAML .inf, .nan, 1e400) never reach plan.json
    m("tiny", {"training.lr": INF}, "training.lr", "finite number", "lr-inf"),
    m("tiny", {"training.lr": NAN}, "training.lr", "finite number", "lr-nan"),
    m("tiny", {"training.min_lr": -INF}, "training.min_lr", "finite number", "min-lr-minus-inf"),
    m("tiny", {"training.weight_decay": INF}, "training.weight_decay", "finite number", "weight-decay-inf"),
    m("tiny", {"training.clip_grad": NAN}, "training.clip_grad", "finite number", "clip-grad-nan"),
    m("tiny", {"training.adam_beta2": NAN}, "training.adam_beta2", "finite number", "beta2-nan"),
    m("tiny", {"model.hidden_dropout": NAN}, "model.hidden_dropout", "finite number", "dropout-nan"),
    m("tiny", {"training.lr": True}, "training.lr", "valid number", "lr-bool"),
    # ints: no bool, no float, no string, pinned maxima
    m("tiny", {"training.iterations": 99999999999999999999999}, "training.iterations",
      "less than or equal to 1000000000000", "iterations-huge"),
    m("tiny", {"training.iterations": 10**12 + 1}, "training.iterations", "64-bit", "iterations-over-limit"),
    m("tiny", {"training.iterations": True}, "training.iterations", "valid integer (got True)", "iterations-bool"),
    m("tiny", {"training.iterations": 3.0}, "training.iterations", "valid integer (got 3.0)", "iterations-float"),
    m("tiny", {"training.iterations": "300"}, "training.iterations", "valid integer (got '300')",
      "iterations-string"),
    m("tiny", {"cluster.stages.train.nodes": True}, "cluster.stages.train.nodes", "valid integer", "nodes-bool"),
    m("tiny", {"cluster.stages.train.cpus_per_task": 2.0}, "cluster.stages.train.cpus_per_task", "valid integer",
      "cpus-float"),
    m("tiny", {"training.seed": 2**31}, "training.seed", "numpy takes seeds below 2**32", "seed-huge"),
    m("megatron", {"training.seed": 0}, "training.seed", "Megatron-LM refuses seed 0", "seed-0-megatron-lm"),
    m("tiny", {"model.hidden_size": 2**31}, "model.hidden_size", "cuBLAS", "hidden-size-huge"),
    m("tiny", {"parallelism.global_batch": 10**6 + 1}, "parallelism.global_batch", "less than or equal to 1000000",
      "global-batch-huge"),
    m("tiny", {"training.iterations": 10**12, "training.eval_interval": 1, "training.eval_iters": 10**12},
      "training.eval_iters", "more samples than a 64-bit integer holds", "eval-samples-overflow"),
    m("tiny", {"version": True}, "version", "Input should be 1 (got True)", "version-bool"),
    m("tiny", {"version": 1.0}, "version", "Input should be 1 (got 1.0)", "version-float"),
    # strict booleans: "yes" and 1 are not booleans (YAML's unquoted yes already is one)
    m("tiny", {"run.ship_code": "yes"}, "run.ship_code", "valid boolean (got 'yes')", "bool-yes-string"),
    m("tiny", {"cluster.exclusive": 1}, "cluster.exclusive", "valid boolean (got 1)", "bool-one"),
    # Slurm time limits
    m("tiny", {"cluster.defaults.time": "99999-00:00:00"}, "cluster.defaults.time",
      "at most 24855-03:13:08", "time-99999-days"),
    m("tiny", {"cluster.defaults.time": "24855-03:13:09"}, "cluster.defaults.time", "more than Slurm can hold",
      "time-one-second-over"),
    m("tiny", {"cluster.defaults.time": 10**13}, "cluster.defaults.time", "more than Slurm can hold",
      "time-minutes-huge"),
    m("tiny", {"cluster.defaults.time": "UNLIMITED"}, "cluster.defaults.time", "Slurm's unlimited", "time-unlimited"),
    m("tiny", {"cluster.defaults.time": "infinite"}, "cluster.defaults.time", "Slurm's unlimited", "time-infinite"),
    m("tiny", {"cluster.defaults.time": "-1"}, "cluster.defaults.time", "Slurm's unlimited", "time-minus-one"),
    m("tiny", {"cluster.defaults.time": "\u0661\u0660"}, "cluster.defaults.time", "in ASCII digits",
      "time-arabic-digits"),
    m("tiny", {"cluster.defaults.time": ["01:00:00"]}, "cluster.defaults.time", "expected a Slurm time limit",
      "time-list"),
    # memory
    m("tiny", {"cluster.defaults.mem": "9007199254740992G"}, "cluster.defaults.mem", "signed 64-bit count of MiB",
      "mem-overflows-slurm"),
    m("tiny", {"cluster.defaults.mem": "9" * 30}, "cluster.defaults.mem", "more than Slurm can hold", "mem-30-digits"),
    # env that replaces what the stages need
    m("tiny", {"env": {"PATH": "/opt/tools/bin"}}, "env.PATH", "env would replace PATH", "env-path"),
    m("tiny", {"env": {"LD_LIBRARY_PATH": "/opt/lib"}}, "env.LD_LIBRARY_PATH", "CUDA, NCCL", "env-ld-library-path"),
    m("tiny", {"env": {"PYTHONPATH": "/opt/py"}}, "env.PYTHONPATH", "run.ship_wheels", "env-pythonpath"),
    m("tiny", {"env": {"PYTHONHOME": "/opt/py"}}, "env.PYTHONHOME", "standard library", "env-pythonhome"),
    m("tiny", {"env": {"HOME": "/scratch"}}, "env.HOME", "enroot", "env-home"),
    m("tiny", {"env": {"BASH_ENV": "/etc/profile"}}, "env.BASH_ENV", "bash -c", "env-bash-env"),
    m("tiny", {"env": {"SHELLOPTS": "xtrace"}}, "env.SHELLOPTS", "read-only bash variable", "env-shellopts"),
    m("tiny", {"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES", "one task per GPU",
      "env-cuda-visible"),
    m("tiny", {"env": {"NVIDIA_VISIBLE_DEVICES": "0"}}, "env.NVIDIA_VISIBLE_DEVICES", "98-nvidia.sh",
      "env-nvidia-visible"),
    m("tiny", {"env": {"SRUN_EXPORT_ENV": "NONE"}}, "env.SRUN_EXPORT_ENV", "src/srun/opt.c", "env-srun-prefix"),
    m("tiny", {"env": {"OMP_NUM_THREADS": "8"}}, "env.OMP_NUM_THREADS", "the train stage sets OMP_NUM_THREADS",
      "env-set-by-train"),
    m("tiny", {"cluster.network.overrides": {"PATH": "/x"}}, "cluster.network.overrides.PATH",
      "an override would replace PATH", "override-path"),
    m("megatron", {"container.env_passthrough": ["HF_HOME", "LD_LIBRARY_PATH"]}, "container.env_passthrough[1]",
      "put the host's value over the image's", "passthrough-ld-library-path"),
    # sizes of strings and paths
    m("tiny", {"env": {"BIG": "x" * (models.TEXT_BYTES_MAX + 1)}}, "env.BIG", "MAX_ARG_STRLEN", "env-value-too-long"),
    m("megatron", {"stages.commands[0].command": "\u00e9" * (models.TEXT_BYTES_MAX // 2 + 1)},
      "stages.commands[0].command", "bytes is too long", "command-too-long-in-utf8"),
    m("tiny", {"run.workdir": "/" + "a" * 256}, "run.workdir", "NAME_MAX", "workdir-component-too-long"),
    m("tiny", {"checkpoint.dir": "/" + "/".join(["d" * 200] * 21)}, "checkpoint.dir", "PATH_MAX", "path-too-long"),
    m("megatron", {"container.mounts[1]": "/mnt/" + "d" * 300 + ":/mnt/data"}, "container.mounts[1]", "NAME_MAX",
      "mount-string-component-too-long"),
    m("tiny", {"data.json_keys": ["k" * 240]}, "data.json_keys", "ENAMETOOLONG", "json-key-file-name-too-long"),
    # dataset split weights
    m("tiny", {"data.split": "0,0,0"}, "data.split", "must not all be 0", "split-all-zero"),
    m("tiny", {"data.split": "0,1,1"}, "data.split", "gives training no documents", "split-no-train"),
    m("tiny", {"data.split": "9" * 400 + ",1"}, "data.split", "finite", "split-weight-overflows-float"),
]


@pytest.mark.parametrize("case", MUTATIONS)
def test_hostile_value(case: Mut, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = copy.deepcopy({"tiny": tiny_base, "megatron": megatron_base}[case.base]())
    for path, value in case.mutations.items():
        mutate(data, path, value)
    text = yaml.safe_dump(data, sort_keys=False, width=10**7, allow_unicode=True)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text, encoding="utf-8")
    code, _out, err = run_validate(spec, capsys)
    assert code == 2, err
    one_issue(err, spec, expected_line(text, case.field), case.field, case.expect)


@pytest.mark.parametrize(("mutations", "field"), [
    pytest.param({"cluster.defaults.time": "24855-03:13:08"}, "cluster.defaults.time", id="time-at-slurm-limit"),
    pytest.param({"cluster.defaults.mem": "9007199254740991G"}, "cluster.defaults.mem", id="mem-at-slurm-limit"),
    pytest.param({"training.iterations": 10**12}, "training.iterations", id="iterations-at-limit"),
    pytest.param({"training.seed": 2**31 - 1}, "training.seed", id="seed-at-limit"),
    pytest.param({"env": {"LD_PRELOAD": "/opt/lib/libjemalloc.so", "HF_HOME": "/w/hf"}}, "env", id="env-allowed"),
])
def test_limits_themselves_are_accepted(mutations: dict[str, Any], field: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    data = tiny_base()
    for path, value in mutations.items():
        mutate(data, path, value)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    main(["validate", str(spec)])
    assert ": valid; stages:" in capsys.readouterr().out


# ---- raw YAML text: bytes, nesting, aliases, tags --------------------------------------------

BASE_TEXT = yaml.safe_dump(tiny_base(), sort_keys=False, width=1000)
NAME_LINE = BASE_TEXT.splitlines().index("  name: tiny-gpt") + 1
TIME_LINE = BASE_TEXT.splitlines().index("    time: 00:20:00") + 1


def replaced(old: str, new: str) -> str:
    assert BASE_TEXT.count(old) == 1, old
    return BASE_TEXT.replace(old, new)


def appended(extra: str) -> tuple[str, int]:
    """BASE_TEXT plus extra lines; the line number where they start."""
    return BASE_TEXT + extra, BASE_TEXT.count("\n") + 1


def laughs(levels: int = 9) -> str:
    out = 'lol0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n'
    for i in range(1, levels + 1):
        out += f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n"
    return out


def merge_laughs(levels: int = 9) -> str:
    out = "m0: &m0 {k0: 1}\n"
    for i in range(1, levels + 1):
        out += f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}], k{i}: {i}}}\n"
    return out


def alias_chain(levels: int) -> str:
    out = "c0: &c0 [x]\n"
    for i in range(1, levels + 1):
        out += f"c{i}: &c{i} [*c{i - 1}]\n"
    return out


class Raw(NamedTuple):
    data: bytes
    line: int | None
    field: str
    expect: str


def raw(text: str | bytes, line: int | None, field: str, expect: str, id: str) -> Any:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return pytest.param(Raw(data, line, field, expect), id=id)


def _raw_cases() -> list[Any]:
    extra_at = BASE_TEXT.count("\n") + 1
    deep = "[" * 500 + "]" * 500
    many = "".join(f"  - /d/{i}.jsonl\n" for i in range(yamlpos.MAX_NODES + 1))
    return [
        raw(replaced("name: tiny-gpt", "name: tiny\x1bgpt"), NAME_LINE, "run.name", "U+001B (ESC)", "raw-esc"),
        raw(replaced("name: tiny-gpt", "name: tiny\x00gpt"), NAME_LINE, "run.name", "U+0000 (NUL)", "raw-nul"),
        raw(replaced("name: tiny-gpt", "name: tiny\x7fgpt"), NAME_LINE, "run.name", "U+007F (DEL)", "raw-del"),
        raw(replaced("name: tiny-gpt", "name: tiny\x9bgpt"), NAME_LINE, "run.name", "U+009B", "raw-c1-csi"),
        raw(BASE_TEXT.encode().replace(b"name: tiny-gpt", b"name: tiny\xffgpt"), NAME_LINE, "run.name",
            "not UTF-8: byte 0xff", "not-utf8"),
        raw(BASE_TEXT.encode("utf-16"), 1, "<root>", "not UTF-8", "utf16-file"),
        raw(BASE_TEXT + f"deep: {deep}\n", extra_at, "deep[0]", "nested more than 32 levels deep", "nested-500"),
        raw(BASE_TEXT + "data2:\n  inputs:\n  - " + "[" * 40 + "\n", extra_at + 2, "data2.inputs[0]",
            "nested more than 32 levels deep", "nested-in-list"),
        raw(BASE_TEXT + alias_chain(40), None, "c", "through aliases", "alias-chain-depth"),
        raw(BASE_TEXT + laughs(), None, "lol", "expands to more than 20000 values", "billion-laughs"),
        raw(BASE_TEXT + merge_laughs(), None, "m", "expands to more than 20000 values", "merge-key-laughs"),
        raw(BASE_TEXT + "more:\n" + many, None, "more", f"more than {yamlpos.MAX_NODES} values", "too-many-values"),
        raw(BASE_TEXT + "run:\n  name: x\n", extra_at, "run", "duplicate key", "duplicate-top-level"),
        raw(BASE_TEXT + "x: &x {a: 1}\ny: {<<: *x, <<: *x}\n", extra_at + 1, "y.<<", "duplicate key",
            "duplicate-merge-key"),
        raw(BASE_TEXT + "y: {<<: 3}\n", extra_at, "y", "takes a mapping or a list of mappings", "merge-a-scalar"),
        raw(replaced("time: 00:20:00", "time: 1:30:00"), TIME_LINE, "cluster.defaults.time",
            "base-60 number 5400", "sexagesimal-time"),
        raw(replaced("container:\n", "container:\n  yes: 1\n"), BASE_TEXT.splitlines().index("container:") + 2,
            "container", "reads as the boolean True", "bool-key"),
        raw(BASE_TEXT + 'env:\n  "A\\eB": x\n', extra_at + 1, "env", "control character U+001B (ESC)",
            "key-with-escape"),
        raw(BASE_TEXT + "env:\n  ? " + "K" * 2000 + "\n  : x\n", extra_at + 1, "env", "a key of 2000 characters",
            "huge-explicit-key"),  # (an implicit key is at most 1024 characters in YAML itself)
        raw(BASE_TEXT + "? [a, b]\n: 1\n", extra_at, "<root>", "plain strings", "list-as-key"),
        raw(replaced("name: tiny-gpt", "name: 2001-02-30"), NAME_LINE, "run.name", "day is out of range",
            "impossible-date"),
        raw(replaced("name: tiny-gpt", 'name: !!int "abc"'), NAME_LINE, "run.name", "cannot read the YAML value",
            "int-tag-on-text"),
        raw(replaced("name: tiny-gpt", "name: 0x_"), NAME_LINE, "run.name", "cannot read the YAML value",
            "bad-hex"),
        raw(replaced("name: tiny-gpt", "name: !foo x"), NAME_LINE, "run.name", "constructor for the tag '!foo'",
            "unknown-tag"),
        raw(replaced("name: tiny-gpt", "name: !!python/object:os.system x"), NAME_LINE, "run.name",
            "constructor for the tag", "python-tag"),
        raw(replaced("name: tiny-gpt", "name: !!python/object:os.system {a: 1}"), NAME_LINE, "run.name",
            "is not read here", "python-tag-on-mapping"),
        raw(replaced("name: tiny-gpt", 'name: "a\\ud800b"'), NAME_LINE, "run.name", "lone UTF-16 surrogate",
            "lone-surrogate"),
        raw(BASE_TEXT + "---\nrun: {}\n", extra_at, "<root>", "expected a single document", "two-documents"),
        raw(replaced("lr: 0.001", "lr: 1.0e+400"), BASE_TEXT.splitlines().index("  lr: 0.001") + 1, "training.lr",
            "finite number", "lr-1e400"),
        raw(replaced("lr: 0.001", "lr: .inf"), BASE_TEXT.splitlines().index("  lr: 0.001") + 1, "training.lr",
            "finite number", "lr-dot-inf"),
        raw(replaced("name: tiny-gpt", "name: " + "9" * 5000), NAME_LINE, "run.name", "cannot read the YAML value",
            "int-over-4300-digits"),
    ]


@pytest.mark.parametrize("case", _raw_cases())
def test_hostile_yaml(case: Raw, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(case.data)
    code, _out, err = run_validate(spec, capsys)
    assert code == 2, err
    if case.line is None:  # the line where the expansion ran out of budget: any, but given
        rows = err.splitlines()
        assert len(rows) == 2 and re.match(rf"  {re.escape(str(spec))}:\d+: {re.escape(case.field)}", rows[1]), err
        assert case.expect in rows[1], err
    else:
        one_issue(err, spec, case.line, case.field, case.expect)


def test_merge_keys_follow_the_yaml_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Keys of the mapping win over merged ones, earlier merged mappings over later ones; today's
    main refused `{<<: *d, time: ...}` as a duplicate key."""
    text = replaced("  defaults:\n", "  defaults: &d\n").replace(
        "  stages:\n", "  stages:\n    merge: {<<: [*d, {partition: other, mem: 1G}], time: '00:30:00'}\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    main(["validate", str(spec)])
    assert ": valid; stages:" in capsys.readouterr().out
    merge = parse_spec(text, "spec.yaml").spec.cluster.stages["merge"]
    assert (merge.time, merge.partition, merge.mem) == ("00:30:00", "cpu", "1G")


def test_a_bom_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"\xef\xbb\xbf" + BASE_TEXT.encode())
    main(["validate", str(spec)])
    assert ": valid; stages:" in capsys.readouterr().out


def test_many_problems_are_summed_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tiny_base()
    data["env"] = {f"VAR_{i}": i for i in range(300)}  # 300 values that are not strings
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    code, _out, err = run_validate(spec, capsys)
    assert code == 2
    rows = err.splitlines()
    assert rows[0] == f"{spec}: invalid spec ({MAX_ISSUES + 1} problems)"
    assert rows[-1].strip() == f"{spec}: <root>: {300 - MAX_ISSUES} more problems not shown"


def test_huge_values_are_shown_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tiny_base()
    data["run"]["name"] = "x y" * 100_000
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, width=10**7))
    code, _out, err = run_validate(spec, capsys)
    assert code == 2 and len(err) < 1000, err[:2000]


# ---- the spec file itself ---------------------------------------------------------------------

def test_over_one_mib_is_refused_without_reading(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 50 MB spec (sparse: st_size says so, nothing is on disk) is refused from its size alone."""
    spec = tmp_path / "big.yaml"
    with spec.open("wb") as fh:
        fh.truncate(50 * 1024 * 1024)
    code, _out, err = run_validate(spec, capsys)
    assert code == 2
    one_issue(err, spec, None, "<root>", "the file is 52428800 bytes; a spec may be at most 1048576")


def test_one_mib_plus_one_byte(tmp_path: Path) -> None:
    """Exactly 1 MiB (a valid spec and a comment) is read; one byte more is refused. The real CLI in a
    subprocess; the times go to the test output (no speed target)."""
    spec = tmp_path / "spec.yaml"
    head = BASE_TEXT + "# "
    spec.write_text(head + "x" * (yamlpos.MAX_BYTES - len(head) - 1) + "\n")
    assert spec.stat().st_size == yamlpos.MAX_BYTES
    code, text, at_limit = run_cli(spec)
    assert code == 0 and ": valid; stages:" in text, text
    spec.write_text(head + "x" * (yamlpos.MAX_BYTES - len(head)) + "\n")
    code, text, over = run_cli(spec)
    assert code == 2, text
    one_issue(text, spec, None, "<root>", "the file is 1048577 bytes")
    _code, _text, startup = run_cli(tmp_path / "missing.yaml")  # the same process start, nothing to read
    print(f"\nvalidate, 1 MiB spec: {at_limit:.2f} s; 1 MiB + 1 byte: {over:.2f} s; "
          f"a missing file (process start and imports): {startup:.2f} s")


def test_billion_laughs_in_a_fresh_process(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(BASE_TEXT + laughs())
    code, text, took = run_cli(spec)
    assert code == 2 and "expands to more than 20000 values" in text, text
    print(f"\nvalidate, billion laughs: {took:.2f} s")


def test_deep_nesting_in_a_fresh_process(tmp_path: Path) -> None:
    """Python's default recursion limit, not pytest's: 500 nested '[' was a RecursionError."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(BASE_TEXT + "deep: " + "[" * 100_000 + "\n")
    code, text, _took = run_cli(spec)
    assert code == 2 and "nested more than 32 levels deep" in text, text


def test_dev_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _took = run_cli("/dev/zero", timeout=60)
    assert code == 2
    one_issue(text, "/dev/zero", None, "<root>", "is a character device, not a spec file")


def test_a_fifo_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    code, text, _took = run_cli(fifo, timeout=60)  # nobody ever writes: a blocking open would hang
    assert code == 2
    one_issue(text, fifo, None, "<root>", "is a FIFO (named pipe)")


def test_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_validate(tmp_path, capsys)
    assert code == 2 and "is a directory" in err, err
    with pytest.raises(SpecError, match="is a directory"):
        from lingjun_slurm.spec import load_spec

        load_spec(tmp_path)


def test_a_symlink_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "spec.yaml"
    loop.symlink_to(loop)
    code, _out, err = run_validate(loop, capsys)
    assert code == 2
    one_issue(err, loop, None, "<root>", "cannot read the spec: Too many levels of symbolic links")


def test_parse_spec_refuses_big_text_too() -> None:
    """Callers with text in hand (resubmit reads the run's copy) get the same limit."""
    with pytest.raises(SpecError, match="more than 1048576 bytes"):
        parse_spec(BASE_TEXT + "#" * yamlpos.MAX_BYTES, "spec.yaml")


# ---- the limits against the real things -------------------------------------------------------

def _libslurm() -> Any:
    found = sorted(glob.glob("/usr/lib/*/slurm-wlm/libslurmfull.so") + glob.glob("/usr/lib*/slurm/libslurmfull.so"))
    if not found:
        pytest.skip("Slurm's libslurmfull.so is not installed")
    lib = ctypes.CDLL(found[0])
    lib.time_str2mins.restype, lib.time_str2mins.argtypes = ctypes.c_int, [ctypes.c_char_p]
    lib.str_to_mbytes.restype, lib.str_to_mbytes.argtypes = ctypes.c_uint64, [ctypes.c_char_p]
    return lib


def test_time_limit_is_where_slurm_stops_counting() -> None:
    """Slurm's own time_str2mins (src/common/parse_time.c; the Debian 12 slurm-client 22.05 here):
    every limit the spec accepts reads back exactly, the first one it refuses does not."""
    lib = _libslurm()
    for text in ("1", "00:20:00", "2-00:00:00", "365-00:00:00", models.format_time(models.TIME_S_MAX)):
        assert lib.time_str2mins(text.encode()) == -(-models.check_time(text) // 60), text
    for text in (models.format_time(models.TIME_S_MAX + 1), "99999-00:00:00"):
        with pytest.raises(ValueError):
            models.check_time(text)
        assert lib.time_str2mins(text.encode()) != -(-models.parse_time(text) // 60), text  # Slurm wraps


def test_mem_limit_is_where_slurm_stops_counting() -> None:
    """Slurm's own str_to_mbytes (src/common/proc_args.c): what --mem the spec accepts, sbatch reads
    as the same MiB; the first value the spec refuses, Slurm misreads (its signed arithmetic wraps,
    or the result sets bit 63, which Slurm takes for MEM_PER_CPU)."""
    lib = _libslurm()
    top = models.MEM_MIB_MAX
    accepted = {"64G": 65536, "0": 0, f"{top}": top, f"{top // 1024}G": top // 1024 * 1024,
                f"{top // 1024 ** 2}T": top // 1024 ** 2 * 1024 ** 2, f"{top - 1023}K": (top - 1023 + 1023) // 1024}
    for text, mib in accepted.items():
        assert models._mem_fits(text) == text
        assert lib.str_to_mbytes(text.encode()) == mib, text
    refused = {f"{top + 1}": top + 1, f"{top // 1024 + 1}G": (top // 1024 + 1) * 1024,
               f"{top // 1024 ** 2 + 1}T": (top // 1024 ** 2 + 1) * 1024 ** 2, f"{top - 1022}K": (top + 1) // 1024}
    for text, mib in refused.items():
        with pytest.raises(ValueError):
            models._mem_fits(text)
        got = lib.str_to_mbytes(text.encode())
        # a wrong count, NO_VAL64, or one with MEM_PER_CPU (slurm.h: bit 63) set: per-CPU memory
        assert got != mib or got & 0x8000000000000000, text


def test_text_limit_is_inside_the_kernel_limit(tmp_path: Path) -> None:
    """execve(2): one environment string of 131072 bytes (with its NUL) runs, one byte more is E2BIG;
    a spec value at the limit, with a long variable name in front, still runs."""
    name = "V" * yamlpos.MAX_KEY_CHARS
    subprocess.run(["/bin/true"], env={name: "x" * models.TEXT_BYTES_MAX}, check=True)
    subprocess.run(["/bin/true"], env={"B": "x" * (models.ARG_STRLEN_MAX - 3)}, check=True)
    with pytest.raises(OSError) as exc:
        subprocess.run(["/bin/true"], env={"B": "x" * (models.ARG_STRLEN_MAX - 2)})
    assert exc.value.errno == errno.E2BIG


def test_path_limits_are_the_kernels(tmp_path: Path) -> None:
    for bad in (tmp_path / ("a" * (models.NAME_BYTES_MAX + 1)),
                Path("/" + "/".join(["d" * 200] * 21))):
        with pytest.raises(OSError) as exc:
            os.stat(bad)
        assert exc.value.errno == errno.ENAMETOOLONG
    with pytest.raises(FileNotFoundError):  # at the limits: merely absent
        os.stat(tmp_path / ("a" * models.NAME_BYTES_MAX))
    at_limit = "/" + "/".join(["d" * 200] * 20) + "/" + "e" * (models.PATH_BYTES_MAX - 20 * 201 - 1)
    assert len(at_limit) == models.PATH_BYTES_MAX
    with pytest.raises(FileNotFoundError):
        os.stat(at_limit)


def bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env})


def test_bash_cannot_compare_iterations_past_64_bits() -> None:
    """The train script's `[ "$last" -lt ITERATIONS ]`: the limit works, 2**63 is an error."""
    assert bash(f'[ 1 -lt {models.COUNT_MAX} ]').returncode == 0
    broken = bash(f'[ 1 -lt {2 ** 63} ]')
    assert broken.returncode == 2 and "integer expression expected" in broken.stderr


@pytest.mark.parametrize("name", ["SHELLOPTS", "BASHOPTS"])
def test_exporting_a_readonly_bash_variable_ends_the_script(name: str) -> None:
    done = bash(f"set -euo pipefail; export {name}=xtrace; echo reached")
    assert done.returncode != 0 and "reached" not in done.stdout and "readonly variable" in done.stderr


def test_bash_env_is_sourced_by_every_bash_c(tmp_path: Path) -> None:
    hook = tmp_path / "hook.sh"
    hook.write_text("echo sourced\n")
    assert bash("echo task", BASH_ENV=str(hook)).stdout == "sourced\ntask\n"


def test_seed_limit_fits_numpy() -> None:
    np = pytest.importorskip("numpy")
    np.random.seed(models.SEED_MAX + 100 * 10**6)  # any pipeline rank a world of WORLD_MAX tasks can have
    with pytest.raises(ValueError):
        np.random.seed(2**32)


def test_every_limit_reason_is_shown() -> None:
    """Each pinned maximum of the models carries its reason into the message (load._message)."""
    bounds: set[int] = set()
    for model in (models.TrainingSpec, models.ParallelismSpec, models.ModelSpec, models.CheckpointSpec,
                  models.Resources, models.Tokenizer, models.RecomputeSpec):
        for name, field in model.model_fields.items():
            for meta in field.metadata:
                le = getattr(meta, "le", None)
                if le is not None and name != "seed":
                    bounds.add(le)
    known: Callable[[int], bool] = lambda le: le in models.LIMIT_REASONS or le <= 10_000
    assert all(known(le) for le in bounds), sorted(b for b in bounds if not known(b))
