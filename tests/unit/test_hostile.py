"""Hostile strings in every string field never execute (submitit's weird_tmp_path idea).

Every string leaf of a feature-rich spec (and every user-chosen mapping key) gets each
hostile value in turn. A field either rejects it at validation, naming that field, or
accepts it; then all accepting fields are set at once, the chain is rendered, and every
rendered script is *run* with srun/sbatch/scontrol/scancel/python3 stubbed on PATH (srun's
stub really executes the task command, so quoting is tested through the task wrapper).
No marker file may appear. The only field meant to run is a command stage's `command`.
"""

from __future__ import annotations

import copy
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm.common.errors import SpecError, dotted
from lingjun_slurm.plan import build_plan
from lingjun_slurm.render import render_plan, write_files
from lingjun_slurm.spec import parse_spec

BASE: dict[str, Any] = {
    "run": {"name": "hostile", "workdir": "/w/run", "log_dir": "/w/logs"},
    "cluster": {
        "network": {"profile": "lingjun", "overrides": {"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring"}},
        "account": "acct", "qos": "normal", "reservation": "resv", "constraint": "a100",
        "sbatch_extra": {"comment": "hello", "mail-user": "a@b.c"},
        "defaults": {"partition": "gpu", "time": "01:00:00", "mem": "10G"},
        "stages": {"train": {"nodes": 2, "gpus_per_node": 2}},
    },
    "container": {"image": "nvcr.io#nvidia/pytorch:25.04-py3", "mounts": ["/w:/w", {"src": "/d", "dst": "/d"}],
                  "workdir": "/w", "name": "ctr", "env_passthrough": ["HF_HOME"]},
    "megatron_lm": {"version": "0.16.1", "path": "/opt/megatron-lm"},
    "env": {"HF_HOME": "/w/hf", "MY_VAR": "value"},
    "data": {"tool": "megatron-lm", "inputs": ["/d/a.jsonl", "/d/b.jsonl"], "json_keys": ["text"],
             "train_key": "text", "output_prefix": "/w/data/corpus",
             "tokenizer": {"type": "gpt2-bpe", "vocab_file": "/d/vocab.json", "merge_file": "/d/merges.txt"},
             "split": "98,1,1"},
    "model": {"preset": "tiny"},
    "parallelism": {"micro_batch": 1, "global_batch": 4},
    "training": {"entrypoint": "megatron-lm", "iterations": 10, "save_grace_s": 60,
                 "extra_args": ["--foo", "bar baz"]},
    "checkpoint": {"dir": "/w/ckpt", "copy_to": "/backup/ckpt"},
    "stages": {"commands": [{"name": "eval", "after": "train", "command": "echo evaluating",
                             "resources": {"partition": "cpu"}}]},
}
NOT_A_SHELL_VALUE = {("stages", "commands", 0, "command")}  # a command stage is meant to run
KEYED = [("env",), ("cluster", "network", "overrides"), ("cluster", "sbatch_extra")]


def hostile_values(marker: Path) -> list[str]:
    m = str(marker)
    base = str(marker.parent / "v")
    return [
        f"{base}$(touch {m})",
        f"{base}`touch {m}`",
        f"{base}'; touch {m}; '",
        f'{base}"; touch {m}; "',
        f"{base}\ntouch {m}\n",
        f"{base} * ? [a] ~ ${{HOME}} {{{{ x }}}} #",
    ]


def string_paths(node: Any, loc: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in string_paths(v, loc + (k,))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in string_paths(v, loc + (i,))]
    return [loc] if isinstance(node, str) and loc not in NOT_A_SHELL_VALUE else []


def set_path(spec: dict[str, Any], loc: tuple[Any, ...], value: Any) -> None:
    node: Any = spec
    for part in loc[:-1]:
        node = node[part]
    node[loc[-1]] = value


def rename_key(spec: dict[str, Any], loc: tuple[Any, ...], value: str) -> None:
    node: Any = spec
    for part in loc:
        node = node[part]
    first = next(iter(node))
    node[value] = node.pop(first)


STUBS = {
    # srun: drop srun's own options, then run the task command for real.
    "srun": 'while [ "$#" -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done\n'
            'SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 exec "$@"\n',
    "sbatch": 'printf "%s\\n" "sbatch $*" >> "$STUB_LOG"\necho "$((RANDOM + 100));cluster"\n',
    "scontrol": 'printf "%s\\n" "scontrol $*" >> "$STUB_LOG"\n'
                'case "$1 $2" in\n  "show hostnames") echo node1 ;;\n'
                '  "show node") echo "NodeName=node1 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=node1" ;;\nesac\n',
    "scancel": 'printf "%s\\n" "scancel $*" >> "$STUB_LOG"\n',
    "python3": 'printf "%s\\0" "$@" >> "$STUB_ARGV"\nprintf "\\n" >> "$STUB_ARGV"\n',
}


def make_stubs(bindir: Path) -> None:
    bindir.mkdir()
    for name, body in STUBS.items():
        path = bindir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def fake_image_record(run_dir: Path) -> None:
    """What the image stage leaves for the later stages: $RUN_DIR/image/{sqsh,digest}."""
    sqsh = run_dir / "images" / ("sha256-" + "ab" * 32 + ".sqsh")
    sqsh.parent.mkdir(exist_ok=True)
    sqsh.write_bytes(b"hsqs")
    (run_dir / "image").mkdir(exist_ok=True)
    (run_dir / "image" / "sqsh").write_text(f"{sqsh}\n")
    (run_dir / "image" / "digest").write_text("sha256:" + "ab" * 32 + "\n")


def run_all_scripts(outdir: Path, bindir: Path, tmp: Path) -> list[tuple[str, int, str]]:
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "LINGJUN_RUN_DIR": str(outdir),
           "STUB_LOG": str(tmp / "stub.log"), "STUB_ARGV": str(tmp / "argv.log"), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "node1", "SLURM_ARRAY_TASK_ID": "0", "HOME": str(tmp)}
    fake_image_record(outdir)
    results = []
    for script in sorted(outdir.iterdir()):
        if script.suffix in (".sbatch", ".sh"):
            proc = subprocess.run(["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
            results.append((script.name, proc.returncode, proc.stdout + proc.stderr))
    return results


def test_base_spec_is_valid() -> None:
    parse_spec(yaml.safe_dump(BASE), "base.yaml")


def test_every_string_field_rejects_or_neutralises_hostile_values(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    values = hostile_values(marker)
    accepted: dict[tuple[Any, ...], list[str]] = {}
    rejected = 0
    fields = string_paths(BASE)
    assert len(fields) > 30
    for loc in fields + [("<key>",) + k for k in KEYED]:
        for value in values:
            spec = copy.deepcopy(BASE)
            if loc[0] == "<key>":
                rename_key(spec, loc[1:], value)
                where = dotted(loc[1:])
            else:
                set_path(spec, loc, value)
                where = dotted(loc)
            try:
                parse_spec(yaml.safe_dump(spec), "hostile.yaml")
            except SpecError as exc:
                rejected += 1
                assert where in str(exc), f"rejecting {value!r} at {where} must name the field:\n{exc}"
                continue
            accepted.setdefault(loc, []).append(value)
    assert rejected and accepted, "expected some fields to quote and some to reject"

    make_stubs(tmp_path / "bin")
    for i, value in enumerate(values):
        spec = copy.deepcopy(BASE)
        for loc, ok in accepted.items():
            if value in ok and loc[0] != "<key>":
                set_path(spec, loc, value)
        loaded = parse_spec(yaml.safe_dump(spec), "hostile.yaml")
        outdir = tmp_path / f"out{i}"
        write_files(render_plan(build_plan(loaded.spec, source="hostile.yaml")), outdir)
        results = run_all_scripts(outdir, tmp_path / "bin", tmp_path)
        assert not marker.exists(), f"injected command ran for value {value!r}: {results}"
        assert {name for name, _, _ in results} >= {"train.sbatch", "submit.sh", "eval.sbatch"}
        failed = [(n, rc, out) for n, rc, out in results if rc != 0 and n != "merge.sbatch"]
        assert not failed, f"scripts failed for value {value!r}: {failed}"
    # The values reached the programs literally: argv of python3 holds them byte for byte.
    argv = (tmp_path / "argv.log").read_text()
    assert values[0] in argv and values[4] in argv


def test_accepted_values_arrive_literally_in_megatron_arguments(tmp_path: Path) -> None:
    spec = copy.deepcopy(BASE)
    weird = "/w/it's a \"dir\" with $(x) and `y`"
    set_path(spec, ("checkpoint", "dir"), weird)
    set_path(spec, ("training", "extra_args"), ["--data-cache-path", weird])
    loaded = parse_spec(yaml.safe_dump(spec), "x.yaml")
    outdir = tmp_path / "out"
    write_files(render_plan(build_plan(loaded.spec)), outdir)
    make_stubs(tmp_path / "bin")
    results = run_all_scripts(outdir, tmp_path / "bin", tmp_path)
    assert all(rc == 0 for n, rc, _ in results if n == "train.sbatch")
    calls = [line.split("\0")[:-1] for line in (tmp_path / "argv.log").read_text().splitlines() if line]
    # python3 -m lingjun_slurm.injob.pyrun .../pretrain_gpt.py ARGS: pyrun registers the hang watchdog's stack dump
    train = next(c[c.index(w):] for c in calls for w in c if w.endswith("pretrain_gpt.py"))
    assert any(c[:2] == ["-m", "lingjun_slurm.injob.pyrun"] for c in calls if train[0] in c), calls
    assert train[train.index("--save") + 1] == weird
    assert train[train.index("--load") + 1] == weird
    assert train[-2:] == ["--data-cache-path", weird]


@pytest.mark.parametrize("value", ["a\nb", "$(x)", "a b", "a,b", "a:b"])
def test_mount_lists_reject_what_pyxis_would_split(value: str) -> None:
    spec = copy.deepcopy(BASE)
    spec["container"]["mounts"] = [f"/w{value}:/w"]
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(spec), "m.yaml")
    assert "container.mounts[0]" in str(info.value)
