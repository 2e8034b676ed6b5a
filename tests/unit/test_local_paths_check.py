"""Issue 26 item 6: the files the built-in stages read, looked up before submitting
(lingjun_slurm/spec/checks.py check_local_paths): an error where the chain runs on this machine,
a warning where it runs on a cluster, a warning for what an earlier command stage may write."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from lingjun_slurm.spec import load_spec
from lingjun_slurm.spec.checks import check_local_paths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _spec(tmp_path: Path, data: dict[str, Any], stages: dict[str, Any] | None = None,
          **extra: Any):  # type: ignore[no-untyped-def]
    doc = {"version": 1, "run": {"name": "p", "workdir": str(tmp_path / "work")},
           "cluster": {"network": {"profile": "tcp"}, "defaults": {"partition": "cpu", "time": "00:05:00"}},
           "container": {"runtime": "none"}, "data": data,
           "stages": stages or {"train": {"skip": True}, "checkpoint": {"skip": True}}, **extra}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_spec(path).spec


def _where(issues) -> list[tuple[tuple[Any, ...], str]]:  # type: ignore[no-untyped-def]
    return [(tuple(i.loc), i.message) for i in issues]


def test_missing_input_and_tokenizer_are_errors_here_and_warnings_for_a_cluster(tmp_path: Path) -> None:
    glob_ = str(tmp_path / "none" / "*.jsonl")
    tok = str(tmp_path / "tok" / "tokenizer.json")
    spec = _spec(tmp_path, {"inputs": [glob_, str(tmp_path / "a.jsonl")],
                            "tokenizer": {"type": "huggingface", "path": tok}})
    errors, warnings = check_local_paths(spec, runs_here=True)
    assert warnings == []
    assert _where(errors) == [
        (("data", "inputs", 0), f"input {glob_!r} matches no file on this machine"),
        (("data", "inputs", 1), f"input {str(tmp_path / 'a.jsonl')!r} does not exist on this machine"),
        (("data", "tokenizer", "path"), f"tokenizer file {tok!r} does not exist on this machine")]
    errors, warnings = check_local_paths(spec, runs_here=False)
    assert errors == [] and len(warnings) == 3
    assert all(w.message.endswith("on this machine (it must exist on the cluster's nodes)") for w in warnings)


def test_present_files_say_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(FIXTURES / "corpus", corpus)
    spec = _spec(tmp_path, {"inputs": [str(corpus / "*.jsonl")], "tokenizer": {
        "type": "huggingface", "path": str(FIXTURES / "tokenizers" / "hf")}})  # a directory: its tokenizer.json
    assert check_local_paths(spec, runs_here=True) == ([], [])


def test_what_a_command_before_preprocess_may_write_is_a_warning(tmp_path: Path) -> None:
    """examples/tiny-gpt.yaml: make-corpus writes the corpus the inputs glob names."""
    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "tiny-gpt.yaml").spec
    errors, warnings = check_local_paths(spec, runs_here=True)
    assert errors == []
    assert [w.message for w in warnings if w.loc[:2] == ("data", "inputs")] in (
        [], ["input '/tmp/lingjun-slurm/tiny-gpt/corpus/*.jsonl' matches no file on this machine yet; stage "
             "make-corpus runs before and may write it"])


def test_a_missing_dataset_prefix_when_preprocess_is_skipped(tmp_path: Path) -> None:
    prefix = str(tmp_path / "data" / "corpus_text_document")
    spec = _spec(tmp_path, {"prefix": prefix, "tokenizer": {"type": "null", "vocab_size": 128}},
                 {"preprocess": {"skip": True}, "merge": {"skip": True}, "checkpoint": {"skip": True}},
                 model={"preset": "tiny", "vocab_size": 128}, training={"entrypoint": "builtin", "save_grace_s": 60})
    errors, _ = check_local_paths(spec, runs_here=True)
    assert _where(errors) == [(("data", "prefix"), f"dataset file {prefix + '.bin'!r} does not exist on this machine")]


def test_local_submit_refuses_a_missing_tokenizer_and_validate_warns(tmp_path: Path) -> None:
    """`submit --executor local` runs the chain here: a missing file is refused with file, line and
    field, exit 2, before anything is written. `validate` cannot know where the chain will run
    (a spec for --host is validated on a laptop): a warning with the same words, exit 0."""
    import subprocess
    import sys

    _spec(tmp_path, {"inputs": [str(tmp_path / "a.jsonl")],
                     "tokenizer": {"type": "huggingface", "path": str(tmp_path / "tok.json")}})
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    spec = str(tmp_path / "p.yaml")
    env = {"PATH": "/usr/bin:/bin", "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    here = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "submit", spec, "--executor", "local"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert here.returncode == 2, (here.stdout, here.stderr)
    assert "p.yaml:" in here.stderr and "data.tokenizer.path: tokenizer file" in here.stderr, here.stderr
    assert "Traceback" not in here.stderr and not (tmp_path / "work").exists()
    checked = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "validate", spec],
                             capture_output=True, text=True, env=env, timeout=60)
    assert checked.returncode == 0, (checked.stdout, checked.stderr)
    assert "warning: " in checked.stderr and "data.tokenizer.path" in checked.stderr, checked.stderr
