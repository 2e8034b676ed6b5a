"""Resume markers, the merge's checks, and clear one-line errors (file and line, exit 1)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lingjun_slurm.injob.stages import merge, preprocess
from tests.data.helpers import TOKENIZERS, make_plan

NULL = TOKENIZERS["null"]


def _corpus(tmp_path: Path, lines: list[str], name: str = "c.jsonl") -> str:
    path = tmp_path / "in" / name
    path.parent.mkdir(exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return str(path)


def _ok_lines(n: int) -> list[str]:
    return [json.dumps({"text": f"{i} {i + 1} 3"}) for i in range(n)]


def test_finished_shards_are_skipped_and_changed_ones_redone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _corpus(tmp_path, _ok_lines(20))
    plan = make_plan(tmp_path / "out", NULL, ["text"], inputs=[src], shards=2)
    shard_dir = tmp_path / "out" / "corpus.shards"
    assert preprocess.main(plan, 0) == 0 and preprocess.main(plan, 1) == 0
    done = shard_dir / "shard_00000.done"
    binary = shard_dir / "shard_00000_text_document.bin"
    stamp = binary.stat().st_mtime_ns
    capsys.readouterr()
    assert preprocess.main(plan, 0) == 0
    assert "already done" in capsys.readouterr().err and binary.stat().st_mtime_ns == stamp
    # other flags (append_eod) -> another fingerprint -> redone
    plan2 = make_plan(tmp_path / "out", NULL, ["text"], inputs=[src], shards=2, append_eod=False)
    assert preprocess.main(plan2, 0) == 0
    assert "already done" not in capsys.readouterr().err
    assert json.loads(done.read_text())["fingerprint"]["tokenizer"]["append_eod"] is False
    # an input that changed (size/mtime) -> redone
    with open(src, "a") as fh:
        fh.write(json.dumps({"text": "9 9"}) + "\n")
    assert preprocess.main(plan2, 1) == 0
    assert "already done" not in capsys.readouterr().err


def test_a_half_written_shard_is_redone_from_scratch(tmp_path: Path) -> None:
    src = _corpus(tmp_path, _ok_lines(10))
    plan = make_plan(tmp_path / "out", NULL, ["text"], inputs=[src])
    assert preprocess.main(plan, 0) == 0
    shard_dir = tmp_path / "out" / "corpus.shards"
    good = (shard_dir / "shard_00000_text_document.bin").read_bytes()
    (shard_dir / "shard_00000.done").unlink()  # as if killed before the marker
    (shard_dir / "shard_00000_text_document.bin").write_bytes(b"garbage")
    (shard_dir / "shard_00000_text_document.bin.tmp").write_bytes(b"partial")
    assert preprocess.main(plan, 0) == 0
    assert (shard_dir / "shard_00000_text_document.bin").read_bytes() == good
    assert not list(shard_dir.glob("*.tmp"))
    (shard_dir / "shard_00000.done").write_text("{not json")  # a corrupt marker is no marker
    assert preprocess.main(plan, 0) == 0 and json.loads((shard_dir / "shard_00000.done").read_text())


def test_merge_refuses_missing_or_stale_shards(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _corpus(tmp_path, _ok_lines(30))
    plan = make_plan(tmp_path / "out", NULL, ["text"], inputs=[src], shards=3)
    assert preprocess.main(plan, 0) == 0 and preprocess.main(plan, 2) == 0
    capsys.readouterr()
    assert merge.main(plan) == 1
    err = capsys.readouterr().err
    assert "shard 1 is missing or unfinished" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "corpus_text_document.bin").exists()
    assert preprocess.main(plan, 1) == 0
    other = make_plan(tmp_path / "out", dict(NULL, vocab_size=600), ["text"], inputs=[src], shards=3)
    assert merge.main(other) == 1
    assert "other inputs, tokenizer or flags" in capsys.readouterr().err
    assert merge.main(plan) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["corpus.shards", "corpus_text_document.bin",
                                                     "corpus_text_document.idx"]


@pytest.mark.parametrize("line, message", [
    ('{"text": "1 2"', "invalid JSON: Expecting ',' delimiter"),
    ('{"title": "1 2"}', "no key 'text' (the object has 'title')"),
    ('{"text": 12}', "key 'text' is int; expected a string or a list of strings"),
    ('[1, 2]', "expected a JSON object, got list"),
    ('{"text": "1  2"}', "the null tokenizer needs space-separated integers"),
    ('{"text": "70000"}', "token id 70000 does not fit the uint16 dataset"),
    ('{"text": "\\ud800"}', "the null tokenizer needs space-separated integers"),
])
def test_bad_lines_name_the_file_and_line(line: str, message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    lines = _ok_lines(5)
    lines.insert(3, "")  # a blank line still counts as a line
    lines.insert(4, line)
    src = _corpus(tmp_path, lines, "bad.jsonl.gz")
    plan = make_plan(tmp_path / "out", NULL, ["text"], inputs=[src])
    assert preprocess.main(plan, 0) == 1
    err = capsys.readouterr().err
    assert f"{src}:5: {message}" in err, err
    assert "Traceback" not in err
    assert not list((tmp_path / "out" / "corpus.shards").iterdir())  # temp files removed, no marker


def test_errors_in_a_byte_range_shard_have_the_absolute_line_number(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    lines = _ok_lines(200)
    lines[150] = "{oops"
    src = _corpus(tmp_path, lines)
    plan = make_plan(tmp_path / "out", NULL, ["text"], inputs=[src], shards=4, workers=2)
    codes = [preprocess.main(plan, s) for s in range(4)]
    assert sorted(codes) == [0, 0, 0, 1] and codes[0] == 0  # the failing shard starts mid-file
    assert f"{src}:151: invalid JSON" in capsys.readouterr().err


def test_invalid_utf8_and_lone_surrogates(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    plan = make_plan(tmp_path / "out", TOKENIZERS["gpt2"], ["text"], inputs=[str(path)])
    assert preprocess.main(plan, 0) == 1
    assert f"{path}:2: not valid UTF-8" in capsys.readouterr().err
    path.write_bytes(b'{"text": "ok"}\n{"text": "a\\udc80b"}\n')
    for tok in ("gpt2", "hf", "sp"):
        plan = make_plan(tmp_path / f"out-{tok}", TOKENIZERS[tok], ["text"], inputs=[str(path)])
        assert preprocess.main(plan, 0) == 1
        assert f"{path}:2: the text has a lone surrogate" in capsys.readouterr().err


@pytest.mark.parametrize("inputs, message", [
    (["/nonexistent/dir/*.jsonl"], "input '/nonexistent/dir/*.jsonl' matches no file"),
    (["/nonexistent/file.jsonl"], "input '/nonexistent/file.jsonl' does not exist"),
    ([], "data.inputs is empty"),
])
def test_missing_inputs_are_clear_errors(inputs: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    plan = make_plan(tmp_path / "out", NULL, ["text"])
    plan["settings"]["data"]["inputs"] = inputs
    assert preprocess.main(plan, 0) == 1
    assert message in capsys.readouterr().err


def test_settings_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plan = make_plan(tmp_path / "out", NULL, ["text"])
    assert preprocess.main(plan, 3) == 1
    assert "--shard 3 is outside 0..0" in capsys.readouterr().err
    plan["settings"]["data"]["tokenizer"] = {"type": "sentencepiece", "path": str(tmp_path / "none.model")}
    assert preprocess.main(plan, 0) == 1
    assert "does not exist" in capsys.readouterr().err
    plan["settings"]["data"]["tokenizer"] = None
    assert preprocess.main(plan, 0) == 1
    assert "data.tokenizer is not set" in capsys.readouterr().err
    plan["settings"]["data"]["tool"] = "megatron-lm"
    assert merge.main(plan) == 1
    assert "only runs for tool builtin" in capsys.readouterr().err


def test_progress_lines_without_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGJUN_PROGRESS_INTERVAL_S", "0")
    src = _corpus(tmp_path, _ok_lines(3000))
    assert preprocess.main(make_plan(tmp_path / "out", NULL, ["text"], inputs=[src]), 0) == 0
    err = capsys.readouterr().err.splitlines()
    ticks = [ln for ln in err if "%" in ln and "docs/s" in ln and "MB/s" in ln and "tokens/s" in ln]
    assert len(ticks) >= 2, err
    assert "done, 3,000 docs" in err[-1] and "tokens/s" in err[-1]


def test_rich_progress_on_a_terminal() -> None:
    import io

    from lingjun_slurm.injob.data.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    bar = Progress("preprocess shard 0/1", 1000, stream=stream)
    bar.update(10, 500, 100, 500)
    line = bar.close()
    assert bar._bar is not None and "done, 10 docs" in line and "tokens/s" in stream.getvalue()
