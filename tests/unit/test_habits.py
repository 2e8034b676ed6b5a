"""Habits users bring (issue 15, items 5 and 7): render into a directory that cannot be written,
a run name as RUN, `forget --missing`, files other users read written 0644 under the umask, and a
merge that skips when its inputs are unchanged."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest

from tests.unit.clirun import run_cli
from lingjun_slurm.runs.index import RunIndex, entry_for
from tests.conftest import REPO

TINY = REPO / "examples" / "tiny-gpt.yaml"


# --- (a) render -o into a directory that cannot be written ------------------------------------

def test_render_into_a_path_under_a_file_is_one_clear_error(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run_cli(capsys, "render", str(TINY), "-o", str(blocker / "out"))
    assert code == 1, (out, err)  # exit 1, as every other I/O error (TransportError)
    assert err.startswith(f"cannot create the output directory {blocker / 'out'}: ")
    assert "internal error" not in err and "Traceback" not in err and err.count("\n") == 1


def test_render_into_a_read_only_directory_is_one_clear_error(tmp_path: Path, capsys,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run as root here, where chmod 0555 does not stop a write; so the write meets EACCES the way
    open(2) reports it for an unprivileged user in a read-only directory, or EROFS on a read-only mount."""
    outdir = tmp_path / "ro"
    outdir.mkdir()
    real = Path.write_text

    def write_text(self: Path, *a: object, **k: object) -> int:
        if self.parent == outdir:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", write_text)
    code, out, err = run_cli(capsys, "render", str(TINY), "-o", str(outdir))
    assert code == 1, (out, err)
    assert err.startswith(f"cannot write {outdir}/") and "Permission denied (give -o a directory you can write)" in err
    assert "internal error" not in err and "rendered run" not in out
    assert list(outdir.iterdir()) == []  # no temp file left behind


def test_render_into_a_really_read_only_directory(tmp_path: Path, capsys) -> None:
    """Without root, a real 0555 directory; as root (where permissions do not stop writes) skipped."""
    if os.geteuid() == 0:
        pytest.skip("root writes into a 0555 directory; the EACCES path is covered by the test above")
    outdir = tmp_path / "ro"
    outdir.mkdir()
    outdir.chmod(0o555)
    try:
        code, out, err = run_cli(capsys, "render", str(TINY), "-o", str(outdir))
    finally:
        outdir.chmod(0o755)
    assert code == 1 and "Permission denied" in err and "internal error" not in err


# --- (c) a run name resolves to the newest run with that name ----------------------------------

def _add(run_id: str, name: str, created: float, run_dir: str) -> None:
    RunIndex().add(entry_for(run_id, name, created, "local", "local", "localhost", run_dir, "/x.yaml"))


def test_a_run_name_is_the_newest_run_with_that_name(tmp_path: Path, capsys) -> None:
    _add("tiny-gpt-20260101-000000-aaaaaa", "tiny-gpt", 100.0, str(tmp_path / "a"))
    _add("tiny-gpt-20260102-000000-bbbbbb", "tiny-gpt", 200.0, str(tmp_path / "b"))
    _add("tiny-gpt-2-20260103-000000-cccccc", "tiny-gpt-2", 300.0, str(tmp_path / "c"))  # newer, another name
    index = RunIndex()
    chosen = index.resolve("tiny-gpt")
    assert chosen.run_id == "tiny-gpt-20260102-000000-bbbbbb"
    err = capsys.readouterr().err
    assert "2 runs are named 'tiny-gpt'; using the newest, tiny-gpt-20260102-000000-bbbbbb" in err
    # one run with that name: no note
    assert index.resolve("tiny-gpt-2").run_id == "tiny-gpt-2-20260103-000000-cccccc"
    assert capsys.readouterr().err == ""
    # run-id prefixes still work, and an ambiguous prefix that is no name is still refused
    assert index.resolve("tiny-gpt-20260101").run_id == "tiny-gpt-20260101-000000-aaaaaa"
    from lingjun_slurm.runs.index import AmbiguousRun

    with pytest.raises(AmbiguousRun, match="matches 3 runs"):
        index.resolve("tiny-")
    # an exact run id wins over a name
    _add("tiny-gpt", "other", 50.0, str(tmp_path / "d"))
    assert RunIndex().resolve("tiny-gpt").run_id == "tiny-gpt"


def test_logs_by_name_after_two_submits_is_not_ambiguous(tmp_path: Path, capsys) -> None:
    """The README's `logs tiny-gpt train` after its second submit: the newest run's log is read."""
    for i, created in ((1, 100.0), (2, 200.0)):
        run_dir = tmp_path / f"r{i}"
        run_dir.mkdir()
        _add(f"tiny-gpt-2026010{i}-000000-00000{i}", "tiny-gpt", created, str(run_dir))
    code, out, err = run_cli(capsys, "logs", "tiny-gpt", "train")
    assert "matches 2 runs" not in err
    assert "using the newest, tiny-gpt-20260102-000000-000002" in err
    assert str(tmp_path / "r2" / "manifest.json") in err  # it went on with the newest run's record


# --- (d) forget --missing -----------------------------------------------------------------------

def test_forget_missing_drops_runs_whose_directory_is_gone(tmp_path: Path, capsys) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    _add("gone-1", "gone", 100.0, str(tmp_path / "deleted"))
    _add("kept-1", "kept", 200.0, str(kept))
    RunIndex().add(entry_for("remote-1", "r", 300.0, "slurm", "ssh", "user@login", "/nowhere/here", "/x.yaml"))
    code, out, err = run_cli(capsys, "status")
    assert f"warning: skipping run gone-1: its run directory {tmp_path / 'deleted'} is gone (deleted or moved); " \
           "`lingjun-slurm forget --missing` drops every such run from the index" in err
    code, out, err = run_cli(capsys, "forget", "--missing")
    assert code == 0, err
    assert out.strip() == "forgot 1 run(s): gone-1"
    assert [e.run_id for e in RunIndex().entries()] == ["kept-1", "remote-1"]  # remote runs are not checked
    code, out, err = run_cli(capsys, "forget", "--missing")
    assert code == 0 and "nothing to forget" in out


def test_forget_needs_a_run_or_missing(capsys) -> None:
    code, out, err = run_cli(capsys, "forget")
    assert code == 2 and "--missing" in err


# --- (e) the tracker and lingjun-manifest.json: 0666 & ~umask, as Megatron-LM's open(..., 'w') ----

@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_tracker_and_manifest_modes_follow_the_umask(tmp_path: Path, mask: int) -> None:
    from lingjun_slurm.injob.checkpoint import write_tracker
    from lingjun_slurm.injob.checkpoint import manifest

    it = tmp_path / "iter_0000010"
    it.mkdir()
    (it / "model_optim_rng.pt").write_bytes(b"x" * 10)
    old = os.umask(mask)
    try:
        write_tracker(tmp_path, 10)
        manifest.write(it, 10, workers=1)
        with open(tmp_path / "plain", "w") as fh:  # what Megatron-LM's open(tracker_filename, 'w') gives
            fh.write("10\n")
    finally:
        os.umask(old)
    want = stat.S_IMODE((tmp_path / "plain").stat().st_mode)
    assert want == 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "latest_checkpointed_iteration.txt").stat().st_mode) == want
    assert stat.S_IMODE((it / "lingjun-manifest.json").stat().st_mode) == want


# --- (f) merge skips when its inputs are unchanged, as preprocess does ----------------------------

def test_merge_skips_when_the_shards_are_unchanged(tmp_path: Path, capsys) -> None:
    from lingjun_slurm.injob.stages import merge, preprocess
    from tests.data.helpers import TOKENIZERS, make_plan

    src = tmp_path / "in" / "c.jsonl"
    src.parent.mkdir()
    src.write_text("".join(json.dumps({"text": f"{i} {i + 1} 3"}) + "\n" for i in range(20)))
    plan = make_plan(tmp_path / "out", TOKENIZERS["null"], ["text"], inputs=[str(src)], shards=2)
    assert preprocess.main(plan, 0) == 0 and preprocess.main(plan, 1) == 0
    assert merge.main(plan) == 0
    out_bin = tmp_path / "out" / "corpus_text_document.bin"
    stamp = out_bin.stat().st_mtime_ns
    first = out_bin.read_bytes()
    capsys.readouterr()
    # unchanged shards: skipped, outputs untouched
    assert merge.main(plan) == 0
    err = capsys.readouterr().err
    assert "merge: already done" in err and "skipping" in err
    assert out_bin.stat().st_mtime_ns == stamp
    # an output that was changed or removed since: merged again
    out_bin.write_bytes(b"")
    assert merge.main(plan) == 0
    assert "already done" not in capsys.readouterr().err and out_bin.read_bytes() == first
    # shards redone from a changed input (the input is split over both): merged again
    with open(src, "a") as fh:
        fh.write(json.dumps({"text": "9 9"}) + "\n")
    assert preprocess.main(plan, 0) == 0 and preprocess.main(plan, 1) == 0
    capsys.readouterr()
    assert merge.main(plan) == 0
    assert "already done" not in capsys.readouterr().err and out_bin.read_bytes() != first
    # a shard whose fingerprint no longer matches the plan is still refused, never skipped
    plan2 = make_plan(tmp_path / "out", TOKENIZERS["null"], ["text"], inputs=[str(src)], shards=2, append_eod=False)
    assert merge.main(plan2) == 1
    assert "cannot merge" in capsys.readouterr().err
