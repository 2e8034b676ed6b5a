"""Issue 26 item 6: after ENOSPC during a save the user sees the tool's one line, not torch's
zip-writer error ("[enforce fail at inline_container.cc:...] . unexpected pos N vs M",
caffe2/serialize/inline_container.cc in pytorch/pytorch), in the job's stdout, stderr or the
stage note that `status` shows. Same setup as test_ckpt_damage.py's full-disk test: a real tmpfs
filled up in a private mount namespace (`unshare -rm`), so the ENOSPC comes from the kernel."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import Run, _train
from .helpers import REPO, launch_env, make_plan, stage_command, write_plan
from .test_ckpt_damage import PLAN_ARGS, TRACKER, _unshare_works


@pytest.fixture(scope="module")
def saved(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _train(tmp_path_factory.mktemp("enospc-src"), corpus, **PLAN_ARGS)


def test_no_torch_zip_writer_line_after_enospc(saved: Run, corpus: Path, tmp_path: Path) -> None:
    if shutil.which("unshare") is None or not _unshare_works(tmp_path):
        pytest.skip("needs `unshare -rm` and tmpfs mounts in a user namespace")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    ckpt = mnt / "ckpt"
    plan_doc = make_plan(tmp_path, corpus, **PLAN_ARGS, ckpt_dir=ckpt)
    plan = write_plan(tmp_path, plan_doc)
    q = {k: shlex.quote(str(v)) for k, v in dict(mnt=mnt, ckpt=ckpt, src=saved.ckpt / "iter_0000002",
                                                 tracker=ckpt / TRACKER).items()}
    script = f"""set -u
mount -t tmpfs -o size=8m tmpfs {q['mnt']}
mkdir {q['ckpt']} && cp -a {q['src']} {q['ckpt']}/ && echo 2 > {q['tracker']}
free=$(df -B1 --output=avail {q['mnt']} | tail -1)
dd if=/dev/zero of={q['mnt']}/filler bs=4096 count=$(( (free - 400000) / 4096 )) status=none
{' '.join(map(shlex.quote, stage_command(plan)))}"""
    proc = subprocess.run(["unshare", "-rm", "bash", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**launch_env(1), "SLURM_JOB_ID": "4242"}, cwd=str(REPO))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = proc.stdout + proc.stderr
    assert "unexpected pos" not in seen, seen[-4000:]
    assert "inline_container" not in seen and "PytorchStreamWriter" not in seen, seen[-4000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("lingjun-slurm: train:")]
    line = f"no space left on {mnt} writing checkpoint {ckpt / 'iter_0000004'} (iteration 4)"
    assert ours == [f"lingjun-slurm: train: {line}"]
    # The same line is the train stage's note for `status` (stagenotes.py), for this job only.
    note = json.loads((tmp_path / "runs" / "t" / "stage-notes" / "train.txt").read_text())
    assert (note["job"], note["note"]) == ("4242", line)
