"""The `checkpoint` command group: in-process through click's CliRunner, and exit codes and
imports through one subprocess that runs the group several times (torch is imported once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from lingjun_slurm.cli.checkpoint import checkpoint
from lingjun_slurm.common.errors import LingjunError

from .helpers import TRACKER, flip_byte

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(checkpoint, [str(a) for a in args])
    if isinstance(result.exception, LingjunError):
        return result.exception.exit_code, str(result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_list_text_and_json(ckpt: Path) -> None:
    assert run("pin", ckpt, "iter_0000010") == (0, f"pinned: {ckpt / 'iter_0000010'}\n")
    code, out = run("list", ckpt)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"{ckpt}  tracker: iter_0000030"
    from lingjun_slurm.injob.checkpoint.layout import dir_size, human_size

    size = human_size(dir_size(ckpt / "iter_0000010")[1])
    assert lines[1].split() == ["ITERATION", "STATE", "CHECK", "SIZE"]
    assert lines[2].split() == ["iter_0000010", "complete", "no", "manifest", *size.split(), "pinned"]
    assert lines[4].split()[-1] == "latest"
    code, out = run("list", ckpt, "--json")
    data = json.loads(out)
    assert data["tracker"] == {"value": "30", "iteration": 30, "release": False, "problem": None}
    assert [(i["name"], i["state"], i["check"], i["verified_at"], i["pinned"], i["latest"])
            for i in data["iterations"]] == [
        ("iter_0000010", "complete", "no manifest", None, True, False),
        ("iter_0000020", "complete", "no manifest", None, False, False),
        ("iter_0000030", "complete", "no manifest", None, False, True)]
    assert run("unpin", ckpt, "10") == (0, "unpinned: iter_0000010\n")


def test_prune_dry_run_then_for_real(ckpt: Path) -> None:
    code, out = run("prune", ckpt, "--keep", "1", "--pin", "20", "--dry-run")
    assert code == 0 and out.splitlines()[0] == "would pin iter_0000020"
    assert "would delete iter_0000010" in out and (ckpt / "iter_0000010").exists()
    code, out = run("prune", ckpt, "--keep", "1")
    assert code == 0 and "deleted      iter_0000010" in out and "deleted      iter_0000020" in out
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000030"]
    assert run("prune", ckpt, "--keep", "0")[0] == 2


def test_verify_and_copy_json(ckpt: Path, tmp_path: Path) -> None:
    code, out = run("verify", ckpt, "--write-manifest", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["manifest"] == "written" and report["iteration"] == 30
    code, out = run("copy", ckpt, tmp_path / "backup", "--iteration", "20", "--json")
    assert code == 0 and json.loads(out)["tracker"] == f"{TRACKER} = 20"
    flip_byte(ckpt / "iter_0000030" / "__0_0.distcp")
    result = CliRunner().invoke(checkpoint, ["verify", str(ckpt), "--json"])
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["problems"][0].startswith("hash mismatch in __0_0.distcp")
    assert isinstance(result.exception, LingjunError) and result.exception.exit_code == 1


SCRIPT = """
import contextlib, io, json, sys
from lingjun_slurm.cli.checkpoint import main
results = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code
    results.append({"code": code, "out": out.getvalue(), "err": err.getvalue(),
                    "torch": "torch" in sys.modules, "megatron": "megatron" in sys.modules})
print(json.dumps(results))
"""


def test_exit_codes_messages_and_imports(ckpt: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / TRACKER).write_text("40")
    calls = [["list", str(ckpt)], ["prune", str(ckpt), "--keep", "2", "--dry-run"], ["pin", str(ckpt), "30"],
             ["list", str(tmp_path / "nope")], ["verify", str(tmp_path / "nope")], ["pin", str(ckpt), "x"],
             ["verify", str(ckpt)], ["verify", str(damaged)], ["copy", str(ckpt), "s3://bucket/x"]]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(calls)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    # list, prune and pin never import torch or megatron
    assert [(x["code"], x["torch"], x["megatron"]) for x in r[:3]] == [(0, False, False)] * 3
    assert r[3] == {"code": 2, "out": "", "err": f"checkpoint directory {tmp_path / 'nope'} does not exist\n",
                    "torch": False, "megatron": False}
    assert (r[4]["code"], r[4]["torch"]) == (2, False)
    assert r[5]["code"] == 2 and "'x' is not an iteration" in r[5]["err"]
    assert r[6]["code"] == 0 and r[6]["out"].startswith(f"{ckpt / 'iter_0000030'}: OK (torch_dist, 5 files")
    assert r[6]["torch"] and r[6]["megatron"]
    assert r[7]["code"] == 1 and r[7]["err"] == (
        f"checkpoint {damaged} is damaged (1 problem):\n"
        "  tracker points at iter_0000040, which does not exist (iterations present: none)\n")
    assert r[8]["code"] == 2 and "pip install s3fs" in r[8]["err"]
    assert not any("Traceback" in x["err"] for x in r)
