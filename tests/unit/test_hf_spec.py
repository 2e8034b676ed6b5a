"""training.init_from and checkpoint.export_hf (issue 29): validation with file:line errors, the
rendering for both entrypoints (Megatron-LM's --pretrained-checkpoint, never --finetune), the train
stage's conversion step (rank 0 converts once, the others wait, a requeue resumes from the run's own
checkpoint), and the checkpoint stage calling the exporter."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm.cli.main import main
from lingjun_slurm.injob.stages import hfinit
from tests.unit.test_invalid_specs import assert_issue, expected_line, megatron_base, tiny_base

HOSTILE = "hf:/models/it's $(touch /tmp/pwned) `id` \"q\" ;x"


def run_validate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`lingjun-slurm validate PATH` in-process: (exit code, stderr), never a traceback."""
    code: Any = 0
    try:
        main(["validate", str(path)])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return (code if isinstance(code, int) else 1), err


def _write(tmp_path: Path, data: dict[str, Any], name: str = "spec.yaml") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _tiny(tmp_path: Path, **training: Any) -> dict[str, Any]:
    data = tiny_base()
    data["run"]["workdir"] = str(tmp_path / "run")
    data["training"].update(training)
    return data


# ---- validation ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, expect", [
    ("/models/llama", "write hf:/ABSOLUTE/PATH"),
    ("megatron:/ckpt", "megatron: is not a known prefix"),
    ("hf:models/llama", "must be absolute"),
    ("hf:/", "/ is not a model directory"),
    ("hf:/" + "x" * 300, "NAME_MAX"),
])
def test_init_from_refused_with_file_line(value: str, expect: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _tiny(tmp_path, init_from=value))
    code, err = run_validate(path, capsys)
    assert code != 0
    assert_issue(err, path, expected_line(path.read_text(), "training.init_from"), "training.init_from", expect)


def test_init_from_accepted_and_missing_config_is_a_warning(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _tiny(tmp_path, init_from=HOSTILE))
    code, err = run_validate(path, capsys)
    assert code == 0, err
    line = expected_line(path.read_text(), "training.init_from")
    assert f"warning: {path}:{line}: training.init_from: " in err and "config.json does not exist" in err


def _gpt2_config(tmp_path: Path, **over: Any) -> Path:
    """A GPT-2 config.json with the tiny preset's shape (transformers' GPT2Config field names)."""
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
           "n_inner": 256, "n_positions": 64, "vocab_size": 512, "activation_function": "gelu",
           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    cfg.update(over)
    d = tmp_path / "hf"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return d


def test_init_from_shape_checked_against_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = _gpt2_config(tmp_path, n_embd=128)
    data = _tiny(tmp_path, init_from=f"hf:{hf}")
    data["model"]["hidden_size"] = 64
    path = _write(tmp_path, data)
    code, err = run_validate(path, capsys)
    assert code != 0
    assert_issue(err, path, expected_line(path.read_text(), "model.hidden_size"), "model.hidden_size",
                 "but 128 in")


def test_init_from_matching_config_json_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hf = _gpt2_config(tmp_path)
    path = _write(tmp_path, _tiny(tmp_path, init_from=f"hf:{hf}"))
    code, err = run_validate(path, capsys)
    assert code == 0, err
    assert "training.init_from" not in err


@pytest.mark.parametrize("mutate, field, expect", [
    (lambda d: d["stages"].update(train={"skip": True}), "training.init_from", "stages.train.skip"),
    (lambda d: d["model"].update(normalization="RMSNorm"), "training.init_from",
     "no Hugging Face model class matches normalization=RMSNorm"),
], ids=["train-skipped", "unsupported-family"])
def test_init_from_cross_field(mutate: Any, field: str, expect: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny(tmp_path, init_from="hf:/models/m")
    data.setdefault("stages", {})
    mutate(data)
    path = _write(tmp_path, data)
    code, err = run_validate(path, capsys)
    assert code != 0
    assert_issue(err, path, expected_line(path.read_text(), field), field, expect)


def test_init_from_megatron_needs_ship_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = megatron_base()
    data["training"]["init_from"] = "hf:/models/llama3-8b"
    data["run"]["ship_code"] = False
    data["training"]["preflight"] = False
    path = _write(tmp_path, data)
    code, err = run_validate(path, capsys)
    assert code != 0
    assert_issue(err, path, expected_line(path.read_text(), "training.init_from"), "training.init_from",
                 "needs run.ship_code: true")


def test_init_from_refuses_finetune_in_extra_args(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = megatron_base()
    data["training"]["init_from"] = "hf:/models/llama3-8b"
    data["training"]["extra_args"] = ["--finetune"]
    path = _write(tmp_path, data)
    code, err = run_validate(path, capsys)
    assert code != 0
    assert_issue(err, path, expected_line(path.read_text(), "training.extra_args"), "training.extra_args",
                 "every requeue")


@pytest.mark.parametrize("export, field, expect", [
    ({"dtype": "fp16"}, "checkpoint.export_hf.dtype", "'bf16' or 'fp32'"),
    ({"dir": "relative/out"}, "checkpoint.export_hf.dir", "expected an absolute path"),
    ({"check": "yes"}, "checkpoint.export_hf.check", "valid boolean"),
    ({"to": "/x"}, "checkpoint.export_hf.to", "unknown field; expected one of: check, dir, dtype"),
])
def test_export_hf_fields(export: dict[str, Any], field: str, expect: str, tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny(tmp_path)
    data["checkpoint"]["export_hf"] = export
    path = _write(tmp_path, data)
    code, err = run_validate(path, capsys)
    assert code != 0
    assert_issue(err, path, expected_line(path.read_text(), field), field, expect)


def test_export_hf_needs_a_supported_family_and_the_stage(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = _tiny(tmp_path)
    data["checkpoint"]["export_hf"] = {"dtype": "fp32"}
    data["model"]["activation"] = "swiglu"
    data["stages"] = {"checkpoint": {"skip": True}}
    path = _write(tmp_path, data)
    code, err = run_validate(path, capsys)
    assert code != 0
    line = expected_line(path.read_text(), "checkpoint.export_hf")
    assert_issue(err, path, line, "checkpoint.export_hf", "activation=swiglu")
    assert_issue(err, path, line, "checkpoint.export_hf", "stages.checkpoint.skip")


# ---- rendering -------------------------------------------------------------------------------------

def _render(tmp_path: Path, data: dict[str, Any], *extra: str) -> Path:
    path = _write(tmp_path, data)
    out = Path(data["run"]["workdir"]) / "rendered"
    try:
        main(["render", str(path), "-o", str(out), *extra])
    except SystemExit as exc:
        assert exc.code in (0, None)
    return out


def _words(script: str) -> list[str]:
    """The rendered script's words (continuation lines joined), as bash would split them."""
    return shlex.split(script.replace("\\\n", " "), comments=True)


def test_render_megatron_pretrained_checkpoint_not_finetune(tmp_path: Path) -> None:
    data = megatron_base()
    data["run"]["workdir"] = str(tmp_path / "run")
    data["training"]["init_from"] = HOSTILE
    out = _render(tmp_path, data)
    script = (out / "train.sbatch").read_text()
    words = _words(script)
    init_dir = f"{tmp_path}/run/hf-init"
    at = words.index("lingjun_slurm.injob.stages.hfinit")
    assert words[at - 2:at + 4] == ["python3", "-m", "lingjun_slurm.injob.stages.hfinit", "--plan", "$PLAN", "--"]
    assert words[words.index("--pretrained-checkpoint") + 1] == init_dir
    assert words[words.index("--load") + 1] == words[words.index("--save") + 1]
    # --finetune / --no-load-* would apply to every requeue's resume too: never emitted.
    for flag in ("--finetune", "--no-load-optim", "--no-load-rng"):
        assert flag not in words
    # The hostile path reaches the job only through plan.json, never the shell.
    assert "pwned" not in script
    plan = json.loads((out / "plan.json").read_text())
    assert plan["settings"]["training"]["init_hf"] == HOSTILE[3:]
    assert plan["settings"]["training"]["init_dir"] == init_dir
    subprocess.run(["shellcheck", "--severity=style", str(out / "train.sbatch")], check=True)


def test_render_builtin_init_from(tmp_path: Path) -> None:
    data = _tiny(tmp_path, init_from=HOSTILE)
    data["checkpoint"]["export_hf"] = {"dtype": "fp32"}
    out = _render(tmp_path, data, "--executor", "local")
    plain = _render(tmp_path / "plain", _tiny(tmp_path / "plain"), "--executor", "local")
    # The builtin trainer converts inside its own stage: the train script is the same as without it.
    def body(p: Path, root: Path) -> list[str]:
        return [ln.replace(str(root), "T") for ln in (p / "train.sbatch").read_text().splitlines() if "sha256" not in ln]

    assert body(out, tmp_path) == body(plain, tmp_path / "plain")
    settings = json.loads((out / "plan.json").read_text())["settings"]
    assert settings["training"]["init_from"] == HOSTILE
    assert settings["training"]["init_dir"] == f"{tmp_path}/run/hf-init"
    assert settings["checkpoint"]["export_hf"] == {"dir": f"{tmp_path}/run/hf", "dtype": "fp32", "check": True,
                                                   "tokenizer_dir": None, "tokenizer_type": "null"}
    plain_settings = json.loads((plain / "plan.json").read_text())["settings"]
    assert "init_from" not in plain_settings["training"] and "export_hf" not in plain_settings["checkpoint"]


# ---- the train stage's conversion step -------------------------------------------------------------

def _plan(tmp_path: Path) -> dict[str, Any]:
    return {"run_id": "r", "settings": {
        "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 512},
        "parallelism": {"tensor": 1, "pipeline": 1},
        "training": {"init_from": "hf:/m", "init_hf": "/m", "init_dir": str(tmp_path / "hf-init")},
        "checkpoint": {"dir": str(tmp_path / "ckpt")}}}


class FakeImport:
    """import_checkpoint's stand-in: an iteration-0 torch_dist layout (iter_0000000 + tracker)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def __call__(self, hf_dir: str, out: str, **kw: Any) -> Any:
        self.calls.append((hf_dir, out, kw))
        it = Path(out) / "iter_0000000"
        it.mkdir(parents=True)
        (it / "__0_0.distcp").write_bytes(b"x" * 16)
        (it / "common.pt").write_bytes(b"c")
        (it / "metadata.json").write_text("{}")
        (Path(out) / "latest_checkpointed_iteration.txt").write_text("0")
        return types.SimpleNamespace(lines=lambda: ["converted (fake)"])


@pytest.fixture
def fake_import(monkeypatch: pytest.MonkeyPatch) -> FakeImport:
    fake = FakeImport()
    mod = types.ModuleType("lingjun_slurm.injob.checkpoint.hf.importer")
    mod.import_checkpoint = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lingjun_slurm.injob.checkpoint.hf.importer", mod)
    import lingjun_slurm.injob.checkpoint as ck

    monkeypatch.setattr(ck, "verify", lambda *a, **k: types.SimpleNamespace(summary=lambda: "verified (fake)"))
    return fake


def test_rank0_converts_once_and_installs_for_builtin(tmp_path: Path, fake_import: FakeImport) -> None:
    plan = _plan(tmp_path)
    hfinit.ensure(plan, builtin=True, rank=0)
    assert len(fake_import.calls) == 1
    hf_dir, out, kw = fake_import.calls[0]
    assert (hf_dir, out) == ("/m", str(tmp_path / "hf-init")) and kw["tensor"] == 1 and kw["check"] is True
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "0"
    assert (ckpt / "iter_0000000" / "__0_0.distcp").read_bytes() == b"x" * 16
    # A requeue: the run has its own checkpoint now (say iteration 20): nothing is converted again.
    (ckpt / "latest_checkpointed_iteration.txt").write_text("20")
    hfinit.ensure(plan, builtin=True, rank=0)
    assert len(fake_import.calls) == 1


def test_requeue_with_own_checkpoint_never_converts(tmp_path: Path, fake_import: FakeImport) -> None:
    plan = _plan(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("100")
    for builtin in (True, False):
        hfinit.ensure(plan, builtin=builtin, rank=0)
        hfinit.ensure(plan, builtin=builtin, rank=1, timeout_s=0)
    assert fake_import.calls == []


def test_megatron_conversion_reused_when_it_matches(tmp_path: Path, fake_import: FakeImport) -> None:
    plan = _plan(tmp_path)
    hfinit.ensure(plan, builtin=False, rank=0)
    hfinit.ensure(plan, builtin=False, rank=0)  # a requeue before the first save: the same conversion
    assert len(fake_import.calls) == 1
    assert not (tmp_path / "ckpt").exists()  # Megatron-LM reads it through --pretrained-checkpoint
    plan["settings"]["parallelism"]["tensor"] = 2  # another layout: converted again
    hfinit.ensure(plan, builtin=False, rank=0)
    assert len(fake_import.calls) == 2 and fake_import.calls[1][2]["tensor"] == 2


def test_other_ranks_wait_for_rank0(tmp_path: Path, fake_import: FakeImport) -> None:
    plan = _plan(tmp_path)
    polls: list[float] = []

    def sleep(s: float) -> None:  # rank 0 finishes while rank 1 waits
        polls.append(s)
        hfinit.ensure(plan, builtin=True, rank=0)

    hfinit.ensure(plan, builtin=True, rank=1, sleep=sleep)
    assert len(polls) == 1 and len(fake_import.calls) == 1


def test_failed_conversion_fails_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from lingjun_slurm.injob.checkpoint.errors import CheckpointError

    def broken(*a: Any, **k: Any) -> Any:
        raise CheckpointError("logits differ: max abs diff 0.5 > 1e-4")

    mod = types.ModuleType("lingjun_slurm.injob.checkpoint.hf.importer")
    mod.import_checkpoint = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lingjun_slurm.injob.checkpoint.hf.importer", mod)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    plan = _plan(tmp_path)
    with pytest.raises(hfinit.InitError, match="logits differ"):
        hfinit.ensure(plan, builtin=True, rank=0)
    with pytest.raises(hfinit.InitError, match="rank 0's conversion failed: logits differ"):
        hfinit.ensure(plan, builtin=True, rank=1, sleep=lambda s: None, timeout_s=5)
    assert not (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").exists()
    # A later attempt (a requeue) does not take the old failure for its own.
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(hfinit.InitError, match="did not convert"):
        hfinit.ensure(plan, builtin=True, rank=1, sleep=lambda s: None, timeout_s=0)
    # The wrapper (Megatron-LM): exit 1 with one line, no traceback, the command not run.
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.setenv("RANK", "0")
    assert hfinit.main(["--plan", str(plan_path), "--", "false"]) == 1
    err = capsys.readouterr().err
    assert "lingjun-slurm: train: init_from: logits differ" in err and "Traceback" not in err


def test_vocabulary_must_pad_alike(tmp_path: Path, fake_import: FakeImport) -> None:
    plan = _plan(tmp_path)
    hf = tmp_path / "m"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"vocab_size": 513}))
    plan["settings"]["training"]["init_hf"] = str(hf)
    with pytest.raises(hfinit.InitError, match="vocab_size 513, padded to 640 for TP 1, but this run's tokenizer "
                                               "gives a vocabulary padded to 128"):
        hfinit.ensure(plan, builtin=True, rank=0, padded_vocab=lambda: 128)
    assert fake_import.calls == []
    hfinit.ensure(plan, builtin=True, rank=0, padded_vocab=lambda: 640)
    assert len(fake_import.calls) == 1
    assert "vocab_size" not in fake_import.calls[0][2]["model"]  # the tokenizer's business, checked above


def test_wrapper_execs_the_command(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("5")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.stages.hfinit", "--plan",
                           str(tmp_path / "plan.json"), "--", sys.executable, "-c", "print('trained')"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "trained"


# ---- the checkpoint stage's export ------------------------------------------------------------------

def test_checkpoint_stage_exports_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from lingjun_slurm.injob.stages import checkpoint as stage

    ckpt = tmp_path / "ckpt"
    (ckpt / "iter_0000040").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("40")
    calls: list[tuple[str, str, dict]] = []

    def export_checkpoint(ckpt_dir: str, out: str, **kw: Any) -> Any:
        calls.append((ckpt_dir, out, kw))
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")
        (Path(out) / "model.safetensors").write_bytes(b"")
        return types.SimpleNamespace(lines=lambda: ["max abs diff 0 (fake)"])

    mod = types.ModuleType("lingjun_slurm.injob.checkpoint.hf.export")
    mod.export_checkpoint = export_checkpoint  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lingjun_slurm.injob.checkpoint.hf.export", mod)
    cfg = {"dir": str(ckpt), "verify": False, "keep_last": None,
           "export_hf": {"dir": str(tmp_path / "hf"), "dtype": "fp32", "check": True, "tokenizer_dir": None}}
    stage.run(cfg)
    assert calls == [(str(ckpt), str(tmp_path / "hf" / "iter_0000040"),
                      {"iteration": 40, "dtype": "fp32", "tokenizer_dir": None, "model": None, "check": True})]
    assert "checkpoint: export: max abs diff 0 (fake)" in capsys.readouterr().out
    stage.run(cfg)  # the stage again (a rerun): the iteration is exported already
    assert len(calls) == 1
    assert "already" in capsys.readouterr().out
    cfg.pop("export_hf")
    stage.run(cfg)
    assert len(calls) == 1


# ---- docs ------------------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "checkpoints.md"
TABLE_BEGIN, TABLE_END = "<!-- hf-mapping-table: begin -->", "<!-- hf-mapping-table: end -->"


def mapping_table() -> str:
    """docs/checkpoints.md's mapping table, from hf/mapping.py's name tables."""
    from lingjun_slurm.injob.checkpoint.hf.mapping import GLOBAL_NAMES, LAYER_NAMES

    def cell(v: object) -> str:
        return "<br>".join(f"`{x}`" for x in (v if isinstance(v, tuple) else (v,)))

    rows = ["| Megatron (torch_dist key) | Llama (`LlamaForCausalLM`) | GPT-2 (`GPT2LMHeadModel`) |",
            "|---|---|---|"]
    for names, prefix in ((GLOBAL_NAMES, ""), (LAYER_NAMES, "decoder.layers.")):
        keys = list(dict.fromkeys([*names["llama"], *names["gpt2"]]))
        for k in keys:
            rows.append(f"| `{prefix}{k}` | {cell(names['llama'][k]) if k in names['llama'] else '-'} | "
                        f"{cell(names['gpt2'][k]) if k in names['gpt2'] else '-'} |")
    return "\n".join(rows)


def test_docs_mapping_table_matches_the_data() -> None:
    text = DOCS.read_text(encoding="utf-8")
    table = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()
    assert table == mapping_table(), "regenerate: python -c 'from tests.unit.test_hf_spec import mapping_table; print(mapping_table())'"
