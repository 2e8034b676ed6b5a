"""SSHTransport.read_dir_files against a real sshd on 127.0.0.1: a directory's small files (an
array's markers, <run_dir>/jobs/<jobid>_<task>) in ONE remote command, whatever their number;
hostile names and contents; a FIFO never blocks; the shell loop used where python3 is missing
gives the same answer; LocalTransport and the base class's file-by-file reads agree."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from lingjun_slurm.transport import LocalTransport
from lingjun_slurm.transport import ssh as sshmod
from lingjun_slurm.transport.base import Transport
from tests.ssh.fixtures import SSHServer

HOSTILE = ["7_a b", "7_a\nb", "7_$(touch pwned1)", "7_`touch pwned2`", "7_'", '7_"', "7_*", "7_-n", "7_\\",
           "7_END", "7_ ", "7_\t", "7_%s", "7_é"]


@pytest.fixture(scope="module")
def t(ssh_server: SSHServer) -> Iterator[Any]:
    with ssh_server.transport() as transport:
        yield transport


def _hostile_dir(root: Path) -> tuple[Path, dict[str, bytes]]:
    d = root / "jobs"
    d.mkdir()
    want: dict[str, bytes] = {}
    for i, name in enumerate(HOSTILE):
        data = f"start 1700000000 0 n[{i}]\nend 1700000009 0\n".encode() + (b"\0END\n\xff" if i % 2 else b"")
        (d / name).write_bytes(data)
        want[name] = data
    (d / "7_empty").write_bytes(b"")
    want["7_empty"] = b""
    (d / "7_big").write_bytes(b"x" * 5000)  # cut at max_bytes
    want["7_big"] = b"x" * 100
    (d / "7_link").symlink_to(d / "7_big")  # followed, as read_bytes follows it
    want["7_link"] = b"x" * 100
    os.mkfifo(d / "7_fifo")  # never opened for a blocking read, never returned
    (d / "7_dir").mkdir()
    (d / "7_dir" / "inner").write_text("no")
    (d / "70").write_text("start 1 0 n\n")  # another job id that merely shares the digit
    (d / "8_1").write_text("other job")
    (d / ".7_hidden").write_text("dot")
    return d, want


def test_one_remote_command_reads_every_hostile_file_and_nothing_else(t: Any, tmp_path: Path) -> None:
    d, want = _hostile_dir(tmp_path)
    before = len(t.history)
    started = time.monotonic()
    got = t.read_dir_files(str(d), prefix="7_", max_bytes=100)
    assert time.monotonic() - started < 10  # the FIFO did not block
    assert len(t.history) == before + 1 and t.history[-1][:2] == ("sh", "-c")
    assert got == want
    assert not list(tmp_path.glob("pwned*")) and not list(Path.home().glob("pwned*"))
    # no prefix: every regular file, dot files included, as listdir + read_range give them
    everything = t.read_dir_files(str(d), max_bytes=100)
    assert set(everything) == set(want) | {"70", "8_1", ".7_hidden"}
    # a prefix with pattern characters matches literally
    assert t.read_dir_files(str(d), prefix="7_*") == {"7_*": want["7_*"]}
    assert t.read_dir_files(str(d), prefix="*") == {}


def test_missing_directory_and_a_file_are_empty(t: Any, tmp_path: Path) -> None:
    assert t.read_dir_files(str(tmp_path / "nope")) == {}
    (tmp_path / "f").write_text("x")
    assert t.read_dir_files(str(tmp_path / "f")) == {}


def test_a_name_that_is_not_utf8_comes_back_with_replacement_characters(t: Any, tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    d.mkdir()
    with open(os.fsencode(str(d)) + b"/7_\xff\xfe", "wb") as f:
        f.write(b"data")
    assert t.read_dir_files(str(d), prefix="7_") == {"7_\ufffd\ufffd": b"data"}


def test_a_thousand_markers_are_one_command_not_a_thousand_reads(t: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "jobs"
    d.mkdir()
    for i in range(1024):
        (d / f"41_{i}").write_text(f"start 1700000000 0 node{i % 64}\nend 1700000005 0\n")
    (d / "41").write_text("start 1700000000 0 node1\n")

    def no_sftp(*_a: Any, **_k: Any) -> bytes:
        raise AssertionError("read file by file over SFTP")

    monkeypatch.setattr(type(t), "read_range", no_sftp)
    before = len(t.history)
    started = time.monotonic()
    got = t.read_dir_files(str(d), prefix="41_")
    took = time.monotonic() - started
    assert len(t.history) == before + 1
    assert len(got) == 1024 and got["41_1023"] == b"start 1700000000 0 node63\nend 1700000005 0\n"
    assert took < 10, took


def test_without_python3_the_shell_loop_gives_the_same_records(t: Any, tmp_path: Path) -> None:
    d, want = _hostile_dir(tmp_path)
    os.unlink(d / "7_fifo")  # the shell loop checks -f before dd: tested with regular files only
    del want["7_link"]
    os.unlink(d / "7_link")
    bin_dir = tmp_path / "bin"  # a PATH with sh and the tools the loop uses, and no python3
    bin_dir.mkdir()
    for tool in ("sh", "od", "tr", "dd"):
        found = shutil.which(tool)
        assert found
        (bin_dir / tool).symlink_to(found)
    argv = ["sh", "-c", sshmod._READ_DIR_SH, "sh", str(d), "7_", "100", sshmod._READ_DIR_PY]
    shell = t.run(argv, env={"PATH": str(bin_dir)})
    python = t.run(argv)
    assert shell.returncode == 0 and python.returncode == 0, (shell.stderr, python.stderr)
    assert sshmod.parse_dir_records(shell.stdout, "7_", 100) == want
    assert sshmod.parse_dir_records(python.stdout, "7_", 100) == want
    assert shell.stdout == python.stdout


def test_an_answer_cut_short_or_garbled_falls_back_to_file_by_file(t: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "5_0").write_text("start 1 0 n\n")
    assert sshmod.parse_dir_records("355f30 00\n", "5_", 10) is None  # no END: cut short
    assert sshmod.parse_dir_records("zz 00\nEND\n", "5_", 10) is None  # not hex
    assert sshmod.parse_dir_records("355f30\nEND\n", "5_", 10) is None  # one word
    # what the remote printed outside the directory's prefix, or over max_bytes, is dropped
    assert sshmod.parse_dir_records("2e2e 00\n2f6574632f706173737764 00\n365f30 00\n355f30 0000\nEND\n",
                                    "", 1) == {"6_0": b"\0"}
    monkeypatch.setattr(sshmod, "_READ_DIR_SH", "echo 355f30 78; exit 0")  # no END
    assert t.read_dir_files(str(d), prefix="5_") == {"5_0": b"start 1 0 n\n"}


def test_local_and_the_base_class_agree(tmp_path: Path) -> None:
    d, want = _hostile_dir(tmp_path)
    assert LocalTransport().read_dir_files(str(d), prefix="7_", max_bytes=100) == want
    assert LocalTransport().read_dir_files(str(tmp_path / "nope")) == {}
    os.unlink(d / "7_fifo")  # the base class opens each name: a FIFO would block it

    base = Transport.read_dir_files(LocalTransport(), str(d), prefix="7_", max_bytes=100)
    assert base == want


def test_the_remote_shell_loop_is_shellcheck_clean(tmp_path: Path, shellcheck: str) -> None:
    import subprocess

    script = tmp_path / "read_dir.sh"
    script.write_text("#!/bin/sh\n" + sshmod._READ_DIR_SH + "\n")
    proc = subprocess.run([shellcheck, "--severity=style", "--shell=sh", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
