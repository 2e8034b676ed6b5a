"""Pure pieces: time limits, Megatron versions and flags, pyxis lint, plan dependencies."""

from __future__ import annotations

import copy

import pytest
import yaml

from lingjun_slurm.container import lint_image, parse_mount
from lingjun_slurm.megatron import args as margs
from lingjun_slurm.megatron import versions
from lingjun_slurm.plan import Dependency, build_plan
from lingjun_slurm.common.shell import Shell, quote
from lingjun_slurm.spec import parse_spec
from lingjun_slurm.common.timefmt import format_time, parse_time
from tests.conftest import REPO


@pytest.mark.parametrize("text,seconds", [("30", 1800), ("1:30", 90), ("01:00:00", 3600), ("2-0", 172800),
                                          ("1-12:30", 131400), ("1-00:00:05", 86405), (90, 5400)])
def test_time_forms(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds
    assert parse_time(format_time(seconds)) == seconds


@pytest.mark.parametrize("bad", ["abc", "1:2:3:4", "-5", "0", "", True, "1-"])
def test_bad_times(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_time(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("text,parsed", [("0.16.1", (0, 16, 1)), ("core_v0.16.1", (0, 16, 1)), ("0.16", (0, 16, 0)),
                                         ("core_r0.17.0", (0, 17, 0)), ("0.19.2rc1", (0, 19, 2))])
def test_versions_parse(text: str, parsed: tuple[int, int, int]) -> None:
    assert versions.parse_version(text) == parsed


@pytest.mark.parametrize("old", ["23.06", "24.09", "0.15.3", "core_v0.9.0"])
def test_versions_below_floor_name_it(old: str) -> None:
    with pytest.raises(ValueError, match="core_v0.16"):
        versions.parse_version(old)


def test_flag_gating_follows_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"pretrain_gpt.py": {"--new-flag": ((0, 17, 0), None), "--old-flag": ((0, 16, 0), (0, 18, 0))}}
    monkeypatch.setattr(versions, "_table", lambda: table)
    assert not versions.has_flag("pretrain_gpt.py", "--new-flag", (0, 16, 1))
    assert versions.has_flag("pretrain_gpt.py", "--new-flag", (0, 17, 0))
    assert versions.has_flag("pretrain_gpt.py", "--old-flag", (0, 17, 5))
    assert not versions.has_flag("pretrain_gpt.py", "--old-flag", (0, 18, 0))
    args = margs.ArgList("pretrain_gpt.py", (0, 16, 1))
    with pytest.raises(ValueError, match="has no --new-flag"):
        args.add("--new-flag", 1)
    with pytest.raises(KeyError):
        versions.has_flag("pretrain_gpt.py", "--unlisted", (0, 16, 0))


def test_every_emitted_megatron_flag_is_in_the_table() -> None:
    """Render every golden scenario: ArgList raises KeyError on a flag missing from the table."""
    from tests.conftest import render_scenario, scenario_files

    for name, path in scenario_files().items():
        render_scenario(name, path)
    assert "--use-mcore-models" in versions.known_flags("pretrain_gpt.py")


@pytest.mark.parametrize("image,ok", [
    ("nvcr.io#nvidia/pytorch:25.04-py3", True), ("ubuntu:22.04", True), ("nvidia/cuda:12.4.1-base", True),
    ("user@nvcr.io#nvidia/pytorch:25.04-py3", True), ("/shared/img.sqsh", True), ("./img.sqsh", True),
    # Docker-style REGISTRY/IMAGE: enroot >= 4.0 (docker::_parse_uri, src/docker.sh v4.1.2)
    ("nvcr.io/nvidia/pytorch:25.04-py3", True), ("localhost:5000/img", True), ("localhost/img", False),
    ("img.sqsh", False),
    ("images/img.sqsh", False), ("a b", False), ("reg#", False)])
def test_image_lint(image: str, ok: bool) -> None:
    assert (lint_image(image) is None) == ok


def test_image_lint_gives_the_fix() -> None:
    msg = lint_image("nvcr.io/nvidia/pytorch:25.04-py3", enroot_version=(3, 5, 0))
    assert msg and "'nvcr.io#nvidia/pytorch:25.04-py3'" in msg and "REGISTRY#IMAGE" in msg


def test_mount_parsing() -> None:
    m = parse_mount("/a:/b:ro+nosuid")
    assert (m.src, m.dst, m.flags) == ("/a", "/b", ["ro", "nosuid"])
    for bad in ("/a", "/a:/b:c:d", "a:/b", "/a:/b:bogus", "/a,/c:/b"):
        with pytest.raises(ValueError):
            parse_mount(bad)


def test_quote() -> None:
    assert quote("plain/path-1.0") == "plain/path-1.0"
    assert quote("=mlx5_0") == "'=mlx5_0'"
    assert quote("it's") == "'it'\"'\"'s'"
    assert quote("") == "''"
    assert quote(Shell('"$PLAN"')) == '"$PLAN"'


def _spec() -> dict:
    return yaml.safe_load((REPO / "examples" / "megatron-gpt.yaml").read_text())


def test_command_stages_hang_off_their_anchor_not_the_chain() -> None:
    raw = _spec()
    raw["stages"]["commands"] = [
        {"name": "fetch", "before": "preprocess", "command": "true"},
        {"name": "eval", "after": "train", "command": "true"},
        {"name": "notify", "after": "checkpoint", "dependency": "afterany", "command": "true"},
    ]
    plan = build_plan(parse_spec(yaml.safe_dump(raw), "x").spec)
    deps = {s.name: [(d.stage, d.type) for d in s.depends_on] for s in plan.stages}
    assert [s.name for s in plan.stages] == ["image", "fetch", "preprocess", "merge", "train", "eval", "checkpoint", "notify"]
    assert deps["preprocess"] == [("fetch", "afterok")]
    assert deps["eval"] == [("train", "afterok")]
    assert deps["checkpoint"] == [("train", "afterok")]  # not on eval
    assert deps["notify"] == [("checkpoint", "afterany")]


def test_skipped_stages_and_dependency_rewiring() -> None:
    raw = _spec()
    raw["stages"] = {"preprocess": {"skip": True}, "merge": {"skip": True},
                     "commands": [{"name": "fetch", "before": "train", "command": "true"}]}
    raw["data"]["prefix"] = "/mnt/data/ready_text_document"
    plan = build_plan(parse_spec(yaml.safe_dump(raw), "x").spec)
    assert [s.name for s in plan.stages] == ["image", "fetch", "train", "checkpoint"]
    assert plan.stage("fetch").depends_on == (Dependency("image", "afterok"),)  # its container needs the image
    assert [d.stage for d in plan.stage("train").depends_on] == ["fetch"]
    assert "--data-path" in [w for w in plan.stage("train").commands[0] if isinstance(w, str)]
    train_cmd = plan.stage("train").commands[0]
    assert train_cmd[train_cmd.index("--data-path") + 1] == "/mnt/data/ready_text_document"


def test_train_env_follows_parallelism() -> None:
    raw = _spec()
    plan = build_plan(parse_spec(yaml.safe_dump(raw), "x").spec)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in [v.name for v in plan.stage("train").env]
    raw2 = copy.deepcopy(raw)
    raw2["parallelism"].update({"tensor": 1, "sequence_parallel": False, "global_batch": 256})
    plan2 = build_plan(parse_spec(yaml.safe_dump(raw2), "x").spec)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in [v.name for v in plan2.stage("train").env]


def test_azure_profile_mounts_topology_into_the_container() -> None:
    raw = _spec()
    raw["cluster"]["network"] = {"profile": "azure-nd-h100-v5"}
    plan = build_plan(parse_spec(yaml.safe_dump(raw), "x").spec)
    flags = [w for w in plan.stage("train").launcher if isinstance(w, str)]
    mounts = next(f for f in flags if f.startswith("--container-mounts="))
    assert "/opt/microsoft:/opt/microsoft:ro" in mounts


def test_unquoted_version_float_asks_for_quotes() -> None:
    raw = _spec()
    raw["megatron_lm"]["version"] = 0.2  # what YAML makes of an unquoted 0.20
    from lingjun_slurm.common.errors import SpecError

    with pytest.raises(SpecError, match="in quotes"):
        parse_spec(yaml.safe_dump(raw), "x")


@pytest.mark.parametrize("mutate,field,text", [
    (lambda r: r["training"].update(lr_decay_iters=1000), "training.lr_decay_iters", "must exceed lr_warmup_iters"),
    (lambda r: r["training"].update(lr_decay_style="WSD"), "training.lr_decay_style", "WSD"),
    (lambda r: r["parallelism"].update(overlap_grad_reduce=False), "parallelism.overlap_param_gather",
     "overlap_grad_reduce"),
    (lambda r: r["cluster"]["stages"]["train"].update(gpus_per_node=0, tasks_per_node=8),
     "cluster.stages.train.gpus_per_node", "needs GPUs"),
    (lambda r: r["cluster"]["stages"]["merge"].update(nodes=2), "cluster.stages.merge.nodes", "one task on one node"),
    (lambda r: r["data"]["tokenizer"].update(path="/t/tokenizer.json"), "data.tokenizer.path", "directory"),
])
def test_megatron_lm_would_reject_these(mutate, field: str, text: str) -> None:
    from lingjun_slurm.common.errors import SpecError

    raw = _spec()
    mutate(raw)
    with pytest.raises(SpecError) as info:
        parse_spec(yaml.safe_dump(raw), "x")
    assert any(field in line and text in line for line in str(info.value).splitlines()), str(info.value)


def test_non_train_builtins_are_one_task_on_one_node() -> None:
    raw = _spec()
    raw["cluster"]["defaults"].update(nodes=4, gpus_per_node=8)
    plan = build_plan(parse_spec(yaml.safe_dump(raw), "x").spec)
    for name in ("preprocess", "merge", "checkpoint"):
        res = plan.stage(name).resources
        assert (res.nodes, res.tasks_per_node) == (1, 1), name
    assert plan.stage("eval").resources.tasks_per_node == 1  # a command runs once per node by default
