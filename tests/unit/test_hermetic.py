"""The hermetic guard itself (tests/hermetic.py): it must see every kind of change it exists to catch."""

from __future__ import annotations

import os
from pathlib import Path

from tests import hermetic


def test_guard_sees_created_modified_and_removed_files(tmp_path: Path) -> None:
    root = tmp_path / "lingjun-slurm"
    (root / "tiny-gpt" / "checkpoints").mkdir(parents=True)
    tracker = root / "tiny-gpt" / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_text("300\n")
    missing = tmp_path / "state"
    before = hermetic.snapshot([root, missing])
    assert hermetic.changes(before, hermetic.snapshot([root, missing])) == []

    os.utime(tracker, ns=(1, 1))
    assert hermetic.changes(before, hermetic.snapshot([root, missing])) == [f"modified {tracker}"]
    tracker.unlink()
    assert f"removed {tracker}" in hermetic.changes(before, hermetic.snapshot([root, missing]))
    missing.mkdir()
    assert f"created {missing}" in hermetic.changes(before, hermetic.snapshot([root, missing]))


def test_guard_sees_a_same_size_rewrite(tmp_path: Path) -> None:
    """A rewrite with the same size and a restored mtime still changes the inode (atomic replace)."""
    path = tmp_path / "runs.json"
    path.write_text("[1]")
    st = path.stat()
    before = hermetic.snapshot([tmp_path])
    tmp = tmp_path / "runs.json.tmp"
    tmp.write_text("[2]")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    tmp.replace(path)
    assert f"modified {path}" in hermetic.changes(before, hermetic.snapshot([tmp_path]))


def test_guarded_roots_cover_the_main_job_and_the_real_state_dir(tmp_path: Path) -> None:
    roots = hermetic.guarded_roots({"XDG_STATE_HOME": str(tmp_path)})
    assert Path("/tmp/lingjun-slurm") in roots
    assert tmp_path / "lingjun-slurm" in roots
    assert hermetic.guarded_roots({"LINGJUN_STATE_DIR": "/srv/s"})[1] == Path("/srv/s")
    assert hermetic.real_state_dir({}) == Path.home() / ".local" / "state" / "lingjun-slurm"


def test_every_test_gets_its_own_state_dir(tmp_path_factory) -> None:
    state = Path(os.environ["LINGJUN_STATE_DIR"])
    assert state.is_relative_to(tmp_path_factory.getbasetemp())
