"""Invalid specs through the real CLI: `lingjun-slurm validate` must exit 2 and name the
file, the line and the dotted field path of every problem, with no traceback.

Each case starts from a valid base spec (modelled on examples/megatron-gpt.yaml or
examples/tiny-gpt.yaml), applies mutations to dotted paths, dumps it with
yaml.safe_dump and checks the reported line against a plain text search of the dump.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

from lingjun_slurm.cli.main import main

DELETE = object()  # mutation value: remove the key / list item


def megatron_base() -> dict[str, Any]:
    """A valid 4 x 8 GPU spec like examples/megatron-gpt.yaml."""
    return {
        "version": 1,
        "run": {"name": "llama8b-pretrain", "workdir": "/mnt/cpfs/runs/llama8b-pretrain"},
        "cluster": {
            "network": {"instance_type": "ml.gu7xf.8xlarge-gu108", "overrides": {"NCCL_DEBUG": "WARN"}},
            "account": "llm-team",
            "exclusive": True,
            "sbatch_extra": {"mail-type": "FAIL", "mail-user": "llm-oncall@example.com"},
            "defaults": {"partition": "lingjun", "time": "04:00:00"},
            "stages": {
                "preprocess": {"partition": "cpu", "cpus_per_task": 16, "mem": "64G", "time": "02:00:00"},
                "merge": {"partition": "cpu", "cpus_per_task": 4, "mem": "32G", "time": "01:00:00"},
                "train": {"nodes": 4, "gpus_per_node": 8, "cpus_per_task": 12, "time": "2-00:00:00"},
                "checkpoint": {"partition": "cpu", "cpus_per_task": 8, "time": "02:00:00"},
            },
        },
        "container": {
            "image": "dsw-registry-vpc.cn-wulanchabu.cr.aliyuncs.com#pai/megatron-training:25.04-gpu-py312-cu128",
            "mounts": ["/mnt/cpfs:/mnt/cpfs", "/mnt/data:/mnt/data:ro"],
            "workdir": "/mnt/cpfs/runs/llama8b-pretrain",
            "name": "llama8b",
        },
        "megatron_lm": {"version": "0.16.1", "path": "/workspace/Megatron-LM"},
        "data": {
            "inputs": ["/mnt/data/corpus/part-*.jsonl.gz"],
            "json_keys": ["text"],
            "tokenizer": {"type": "huggingface", "path": "/mnt/data/tokenizers/llama3"},
            "shards": 16,
            "workers": 16,
        },
        "model": {"preset": "llama3-8b", "seq_length": 4096, "max_position_embeddings": 4096},
        "parallelism": {
            "tensor": 2, "pipeline": 1, "sequence_parallel": True, "micro_batch": 1, "global_batch": 256,
            "distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
        },
        "training": {
            "entrypoint": "megatron-lm", "iterations": 50000, "lr": 3.0e-4, "min_lr": 3.0e-5,
            "lr_warmup_iters": 2000, "precision": "bf16", "recompute": {"granularity": "selective"},
            "save_grace_s": 600, "max_restarts": 10,
        },
        "checkpoint": {
            "dir": "/mnt/cpfs/runs/llama8b-pretrain/checkpoints", "save_interval": 1000, "keep_last": 3,
            "copy_to": "oss://llm-team-ckpt/llama8b-pretrain",
        },
        "stages": {"commands": [{
            "name": "eval", "after": "checkpoint",
            "command": "python /mnt/cpfs/tools/eval_ckpt.py --ckpt /mnt/cpfs/runs/llama8b-pretrain/checkpoints",
            "resources": {"nodes": 1, "gpus_per_node": 8, "time": "01:00:00"},
        }]},
    }


def tiny_base() -> dict[str, Any]:
    """A valid one-CPU-process spec like examples/tiny-gpt.yaml."""
    return {
        "version": 1,
        "run": {"name": "tiny-gpt", "workdir": "/tmp/lingjun-slurm/tiny-gpt"},
        "cluster": {
            "network": {"profile": "tcp"},
            "defaults": {"partition": "cpu", "time": "00:20:00"},
            "stages": {
                "preprocess": {"cpus_per_task": 1},
                "train": {"nodes": 1, "tasks_per_node": 1, "gpus_per_node": 0, "cpus_per_task": 2},
            },
        },
        "container": {"runtime": "none"},
        "data": {
            "inputs": ["/tmp/lingjun-slurm/tiny-gpt/corpus/*.jsonl"],
            "tokenizer": {"type": "null", "vocab_size": 512},
            "shards": 2,
            "workers": 1,
        },
        "model": {"preset": "tiny", "vocab_size": 512},
        "parallelism": {"micro_batch": 4, "global_batch": 8},
        "training": {
            "entrypoint": "builtin", "iterations": 40, "lr": 1.0e-3, "min_lr": 1.0e-4, "lr_warmup_iters": 4,
            "precision": "fp32", "log_interval": 5, "eval_interval": 20, "eval_iters": 2, "save_grace_s": 60,
        },
        "checkpoint": {"save_interval": 20, "keep_last": 2},
    }


BASES = {"megatron": megatron_base, "tiny": tiny_base}
_PART_RE = re.compile(r"[^.\[\]]+|\[\d+\]")


def _parts(path: str) -> list[str | int]:
    return [int(p[1:-1]) if p.startswith("[") else p for p in _PART_RE.findall(path)]


def mutate(data: dict[str, Any], path: str, value: Any) -> None:
    """Set (or with DELETE remove) a dotted path like 'stages.commands[1].name'; an index equal
    to the list's length appends, a missing mapping on the way is created."""
    *parents, last = _parts(path)
    node: Any = data
    for part in parents:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    if value is DELETE:
        del node[last]
    elif isinstance(last, int) and last == len(node):
        node.append(value)
    else:
        node[last] = value


def expected_line(text: str, path: str) -> int:
    """1-based line of the key at a dotted path in block-style YAML, or of its nearest
    present parent (1 for the root). Plain text search, indentation-aware."""
    rows = []
    for raw in text.splitlines():
        m = re.match(r"^( *)((?:- )?)(.*)$", raw)
        assert m is not None
        dash, key_col = len(m.group(1)), len(m.group(1)) + len(m.group(2))
        rows.append((dash, key_col, bool(m.group(2)), m.group(3)))
    row, col, in_item = -1, -1, False  # current node: its row, its column, whether it is a list item
    for part in _parts(path):
        found: int | None = None
        start = row if in_item else row + 1
        items, child_col = 0, None
        for j in range(start, len(rows)):
            dash, key_col, is_item, content = rows[j]
            if not content:
                continue
            if j > start and (key_col <= col or (is_item and dash <= col and in_item)):
                break  # left the current node's block
            child_col = key_col if child_col is None else child_col  # keys of this mapping start here
            if isinstance(part, str) and key_col == child_col and (content == f"{part}:"
                                                                   or content.startswith(f"{part}: ")):
                found, new_col, new_item = j, key_col, False
                break
            if isinstance(part, int) and is_item and dash >= col:
                if items == part:
                    found, new_col, new_item = j, dash, True
                    break
                items += 1
        if found is None:
            break
        row, col, in_item = found, new_col, new_item
    return row + 1 if row >= 0 else 1


def run_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`lingjun-slurm validate PATH` in-process; returns (exit code, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    code = exc.value.code
    return (code if isinstance(code, int) else 1), err


def assert_issue(err: str, path: Path, line: int, field: str, expect: str) -> None:
    prefix = f"{path}:{line}: {field}: "
    hits = [ln for ln in err.splitlines() if prefix in ln]
    assert hits, f"no issue starting {prefix!r} in:\n{err}"
    assert any(expect in ln for ln in hits), f"{expect!r} not in {hits}"


class Case(NamedTuple):
    base: str
    mutations: dict[str, Any]
    field: str
    expect: str


def c(base: str, mutations: dict[str, Any], field: str, expect: str, id: str, xfail: str | None = None) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(Case(base, mutations, field, expect), id=id, marks=marks)


EVAL = megatron_base()["stages"]["commands"][0]
CASES = [
    c("megatron", {"bogus": 1}, "bogus", "unknown field; expected one of:", "unknown-top-level"),
    c("megatron", {"training.learning_rate": 1e-4}, "training.learning_rate", "unknown field", "unknown-nested"),
    c("megatron", {"cluster.stages.train.gpus": 8}, "cluster.stages.train.gpus", "gpus_per_node",
      "unknown-resource-field"),
    c("megatron", {"version": 2}, "version", "Input should be 1", "bad-version"),
    c("megatron", {"run.name": DELETE}, "run.name", "required field is missing", "missing-run-name"),
    c("megatron", {"run.workdir": DELETE}, "run.workdir", "required field is missing", "missing-workdir"),
    c("megatron", {"run.workdir": "runs/llama"}, "run.workdir", "an absolute path", "relative-workdir"),
    c("megatron", {"run.workdir": "/mnt/my runs"}, "run.workdir", "got '/mnt/my runs'", "workdir-space"),
    c("megatron", {"run.name": "llama 8b!"}, "run.name", "letters, digits", "bad-run-name"),
    c("megatron", {"run.log_dir": "logs"}, "run.log_dir", "an absolute path", "relative-log-dir"),
    c("megatron", {"parallelism.context": 3}, "parallelism.tensor", "must divide the world size 32",
      "model-parallel-not-dividing-world"),
    c("megatron", {"model.num_attention_heads": 24, "model.hidden_size": 3072, "parallelism.tensor": 16},
      "parallelism.tensor", "num_attention_heads (24) must be divisible by tensor (16)", "heads-vs-tensor"),
    c("megatron", {"model.num_layers": 30, "parallelism.pipeline": 4}, "parallelism.pipeline",
      "num_layers (30) must be divisible by pipeline (4)", "layers-vs-pipeline"),
    c("megatron", {"parallelism.global_batch": 100}, "parallelism.global_batch",
      "micro_batch x data parallel = 1 x 16", "global-batch"),
    c("megatron", {"cluster.stages.train.tasks_per_node": 4}, "cluster.stages.train.tasks_per_node",
      "must equal gpus_per_node (8)", "tasks-vs-gpus"),
    c("megatron", {"cluster.stages.train.nodes": 0}, "cluster.stages.train.nodes", "greater than or equal to 1",
      "zero-nodes"),
    c("megatron", {"cluster.stages.train.time": "2 days"}, "cluster.stages.train.time",
      "expected a Slurm time limit", "unparsable-time"),
    c("megatron", {"cluster.stages.train.time": True}, "cluster.stages.train.time", "expected a Slurm time limit",
      "time-bool"),
    c("megatron", {"cluster.defaults.time": DELETE, "cluster.stages.train.time": DELETE},
      "cluster.stages.train.time", "needs a time limit", "train-without-time"),
    c("tiny", {"cluster.defaults.time": "00:01:00"}, "training.save_grace_s", "under half", "grace-vs-time"),
    c("megatron", {"parallelism.tensor": 1}, "parallelism.sequence_parallel", "needs tensor > 1",
      "sequence-parallel-tp1"),
    c("megatron", {"parallelism.distributed_optimizer": False}, "parallelism.overlap_param_gather",
      "needs distributed_optimizer", "overlap-param-gather"),
    c("megatron", {"container.image": "localhost/pytorch:24.05-py3"}, "container.image",
      "'localhost#pytorch:24.05-py3'", "image-localhost-no-port"),
    c("megatron", {"container.image": "nvcr.io/nvidia/pytorch:24.05-py3", "container.enroot_version": "3.5.0"},
      "container.image", "'nvcr.io#nvidia/pytorch:24.05-py3'", "image-docker-style-on-enroot-3"),
    c("megatron", {"container.enroot_version": "four"}, "container.enroot_version", "not an enroot version",
      "enroot-version-malformed"),
    c("megatron", {"container.image": "images/pytorch.sqsh"}, "container.image", "starting with '/' or './'",
      "sqsh-relative"),
    c("megatron", {"container.image": "nvcr.io#nvidia/pytorch 24.05"}, "container.image", "splits on spaces",
      "image-with-space"),
    c("megatron", {"container.mounts[0]": "/mnt/cpfs"}, "container.mounts[0]", "expected SRC:DST[:FLAGS]",
      "mount-shape"),
    c("megatron", {"container.mounts[1]": "/mnt/data:/mnt/data:readonly"}, "container.mounts[1]",
      "unknown mount flag", "mount-flag"),
    c("megatron", {"container.mounts[0]": "/mnt/a:/mnt/a,/mnt/b:/mnt/b"}, "container.mounts[0]",
      "one mount per list item", "mount-comma"),
    c("megatron", {"container.mounts[0]": "data:/mnt/data"}, "container.mounts[0]",
      "SRC 'data' must be an absolute path", "mount-relative-src"),
    c("megatron", {"container.mounts[1]": {"src": "data", "dst": "/mnt/x"}}, "container.mounts[1].src",
      "an absolute path", "mount-mapping-relative-src"),
    c("megatron", {"container.mounts[1]": "/mnt/x:/mnt/cpfs"}, "container.mounts[1]", "share the destination",
      "mount-duplicate-dst"),
    c("megatron", {"container.image": DELETE}, "container.image", "an image is required", "pyxis-without-image"),
    c("megatron", {"container.runtime": "none"}, "container.image", "runtime is 'none'", "runtime-none-image"),
    c("tiny", {"cluster.network.profile": "infiniband"}, "cluster.network.profile", "unknown network profile",
      "unknown-profile"),
    c("megatron", {"cluster.network": DELETE}, "cluster.network", "choose a network profile", "no-network"),
    c("megatron", {"cluster.network.instance_type": "ml.gu9.xlarge"}, "cluster.network.instance_type",
      "no network profile lists instance type", "unknown-instance-type"),
    c("megatron", {"cluster.network.profile": "generic-ib"}, "cluster.network.instance_type",
      "belongs to profile 'lingjun'", "instance-vs-profile"),
    c("megatron", {"cluster.network.overrides.MASTER_ADDR": "10.0.0.1"}, "cluster.network.overrides.MASTER_ADDR",
      "set by the tool", "override-reserved"),
    c("megatron", {"cluster.network.overrides.NCCL_NET_PLUGIN": None}, "cluster.network.overrides.NCCL_NET_PLUGIN",
      "no value of NCCL_NET_PLUGIN means 'not set'", "override-unset-from-node-file"),
    c("megatron", {"env.RANK": "0"}, "env.RANK", "set by Slurm or by the tool", "env-reserved"),
    c("megatron", {"env.SLURM_JOB_NAME": "x"}, "env.SLURM_JOB_NAME", "set by Slurm", "env-reserved-prefix"),
    c("megatron", {"env.NCCL_IB_HCA": "mlx5"}, "env.NCCL_IB_HCA", "cluster.network.overrides", "env-nccl"),
    c("megatron", {"cluster.sbatch_extra.job-name": "x"}, "cluster.sbatch_extra.job-name", "is not allowed",
      "sbatch-job-name"),
    c("megatron", {"cluster.sbatch_extra.dependency": "afterok:1"}, "cluster.sbatch_extra.dependency",
      "is not allowed", "sbatch-dependency"),
    c("megatron", {"cluster.sbatch_extra.comment": "two words"}, "cluster.sbatch_extra.comment",
      "cannot be quoted", "sbatch-value-space"),
    c("megatron", {"cluster.stages.evaluate": {"time": "01:00:00"}}, "cluster.stages.evaluate", "unknown stage",
      "cluster-unknown-stage"),
    c("megatron", {"megatron_lm": DELETE}, "training.entrypoint", "add megatron_lm", "entrypoint-without-mlm"),
    c("megatron", {"megatron_lm.version": "23.06"}, "megatron_lm.version", "core_v0.16", "mlm-calendar-23.06"),
    c("megatron", {"megatron_lm.version": "0.15.0"}, "megatron_lm.version", "older than the supported floor",
      "mlm-0.15"),
    c("megatron", {"megatron_lm.version": "latest"}, "megatron_lm.version", "expected a Megatron-LM version",
      "mlm-garbage"),
    c("megatron", {"model.preset": "llama4-400b"}, "model.preset", "unknown preset", "unknown-preset"),
    c("megatron", {"model.preset": DELETE}, "model.num_layers", "required (or choose model.preset)",
      "dims-without-preset"),
    c("megatron", {"data.tokenizer": {"type": "gpt2-bpe", "vocab_file": "/mnt/data/vocab.json"}},
      "data.tokenizer.merge_file", "needs merge_file", "gpt2-without-merges"),
    c("megatron", {"data.tokenizer": DELETE}, "data.tokenizer", "need a tokenizer", "no-tokenizer"),
    c("megatron", {"stages.preprocess": {"skip": True}, "data.prefix": "/mnt/data/corpus_text_document"},
      "stages.merge", "go together", "preprocess-skipped-merge-not"),
    c("megatron", {"stages.preprocess": {"skip": True}, "stages.merge": {"skip": True}}, "data.prefix",
      "give the existing dataset prefix", "skipped-without-prefix"),
    c("megatron", {"data.tool": "megatron-lm"}, "data.inputs[0]", "not globs", "mlm-tool-glob"),
    c("megatron", {"data.train_key": "content"}, "data.train_key", "is not one of json_keys", "train-key"),
    c("megatron", {"training.min_lr": 1.0e-3}, "training.min_lr", "must not exceed lr", "min-lr"),
    c("megatron", {"training.lr_warmup_iters": 50000}, "training.lr_warmup_iters", "must be below iterations",
      "warmup"),
    c("megatron", {"training.recompute": {"granularity": "full"}}, "training.recompute", "needs method",
      "recompute-full"),
    c("tiny", {"training.extra_args": ["--use-flash-attn"]}, "training.extra_args", "entrypoint: megatron-lm",
      "extra-args-builtin"),
    c("megatron", {"container.mounts[0]": "/lustre/runs:/mnt/cpfs"}, "container.mounts[0]",
      "puts host /lustre/runs/runs/llama8b-pretrain at the run's workdir", "workdir-behind-foreign-mount"),
    c("megatron", {"checkpoint.copy_to": "backups/llama8b"}, "checkpoint.copy_to", "an absolute path or a URL",
      "copy-to-relative"),
    c("megatron", {"stages.commands[1]": dict(EVAL)}, "stages.commands[1].name", "duplicate stage name",
      "duplicate-command-stage"),
    c("megatron", {"stages.commands[0].before": "train"}, "stages.commands[0]", "exactly one of before",
      "before-and-after"),
    c("megatron", {"stages.commands[0].after": DELETE}, "stages.commands[0]", "exactly one of before",
      "neither-before-nor-after"),
    c("megatron", {"stages.commands[0].name": "train"}, "stages.commands[0].name", "built-in stage name",
      "command-named-train"),
    c("megatron", {"stages.commands[0].after": "evaluate"}, "stages.commands[0].after", "checkpoint",
      "command-unknown-anchor"),
    # values that cannot work (issue 15; many more in test_hostile_specs.py)
    c("megatron", {"training.lr": float("inf")}, "training.lr", "finite number", "lr-inf"),
    c("megatron", {"training.iterations": 99999999999999999999999}, "training.iterations",
      "less than or equal to 1000000000000", "iterations-huge"),
    c("megatron", {"training.iterations": True}, "training.iterations", "valid integer", "iterations-bool"),
    c("megatron", {"cluster.stages.train.time": "99999-00:00:00"}, "cluster.stages.train.time",
      "more than Slurm can hold", "time-99999-days"),
    c("megatron", {"env.PATH": "/opt/bin"}, "env.PATH", "env would replace PATH", "env-replaces-path"),
    c("megatron", {"env.LD_LIBRARY_PATH": "/opt/lib"}, "env.LD_LIBRARY_PATH", "which the stages need",
      "env-replaces-ld-library-path"),
]


@pytest.mark.parametrize("base", sorted(BASES))
def test_bases_are_valid(base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(BASES[base](), sort_keys=False, width=1000))
    main(["validate", str(path)])
    assert ": valid; stages:" in capsys.readouterr().out


@pytest.mark.parametrize("case", CASES)
def test_invalid_spec(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = copy.deepcopy(BASES[case.base]())
    for dotted_path, value in case.mutations.items():
        mutate(data, dotted_path, value)
    text = yaml.safe_dump(data, sort_keys=False, width=1000)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    code, err = run_validate(path, capsys)
    assert code == 2, err
    assert "invalid spec" in err
    assert_issue(err, path, expected_line(text, case.field), case.field, case.expect)


def test_expected_line_helper() -> None:
    text = "a:\n  b: 1\n  z: 1\n  l:\n  - x: 1\n    y: 2\n  - x: 3\nz: 0\n"
    paths = ("a.b", "a.l[0]", "a.l[0].y", "a.l[1].x", "a.l[1].y", "z", "a.q", "q")
    assert [expected_line(text, p) for p in paths] == [2, 5, 6, 7, 7, 8, 1, 1]


HANDWRITTEN = [
    pytest.param("run:\n  name: a\n  workdir: /w\nrun:\n  name: b\n", 4, "run", "duplicate key", id="dup-top"),
    pytest.param("run:\n  name: a\n  workdir: /w\n  name: b\n", 4, "run.name", "duplicate key", id="dup-nested"),
    pytest.param("run:\n  name: a\n  workdir: /w: x\n", 3, "<root>", "YAML syntax error", id="syntax"),
    pytest.param("run:\n  name: [a, b\n  workdir: /w\n", None, "<root>", "YAML syntax error", id="unclosed"),
    pytest.param("- run: {name: a}\n- cluster: {}\n", 1, "<root>", "must be a YAML mapping", id="top-level-list"),
    pytest.param("just a string\n", 1, "<root>", "must be a YAML mapping", id="top-level-scalar"),
]


@pytest.mark.parametrize(("text", "line", "field", "expect"), HANDWRITTEN)
def test_handwritten_yaml(text: str, line: int | None, field: str, expect: str, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    code, err = run_validate(path, capsys)
    assert code == 2, err
    if line is None:
        assert re.search(rf"{re.escape(str(path))}:\d+: {re.escape(field)}: .*{re.escape(expect)}", err), err
    else:
        assert_issue(err, path, line, field, expect)


def test_recursive_alias_is_a_spec_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("run: &r\n  name: a\n  workdir: /w\n  again: *r\n")
    code, err = run_validate(path, capsys)
    assert code == 2, err
    assert f"{path}:" in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.yaml"
    code, err = run_validate(path, capsys)
    assert code == 2
    assert f"{path}: <root>: no such file" in err


@pytest.mark.parametrize(("mutations", "fields"), [
    pytest.param({"training.min_lr": 1.0, "checkpoint.copy_to": "rel/dir", "env.RANK": "0"},
                 ["training.min_lr", "checkpoint.copy_to", "env.RANK"], id="cross-field"),
    pytest.param({"stages.commands[0].name": "bad name", "run.workdir": "rel", "training.iterations": 0},
                 ["run.workdir", "training.iterations", "stages.commands[0].name"], id="per-field"),
])
def test_all_errors_reported_sorted(mutations: dict[str, Any], fields: list[str], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = megatron_base()
    for dotted_path, value in mutations.items():
        mutate(data, dotted_path, value)
    text = yaml.safe_dump(data, sort_keys=False, width=1000)
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    code, err = run_validate(path, capsys)
    assert code == 2
    assert "invalid spec (3 problems)" in err
    lines = [expected_line(text, f) for f in fields]
    assert lines == sorted(lines) and len(set(lines)) == 3
    issue_rows = [ln.strip() for ln in err.splitlines()[1:]]
    assert [row.split(": ")[1] for row in issue_rows] == fields
    assert [row.startswith(f"{path}:{n}: ") for row, n in zip(issue_rows, lines)] == [True] * 3
