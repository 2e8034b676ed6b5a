"""Status and cancel when Slurm does not answer (issue 15, item 4), with the real Slurm 22.05 client.

The runs are submitted to the real test cluster; then the commands run with SLURM_CONF pointing
at a copy of its slurm.conf whose SlurmctldPort nothing listens on: what squeue, scontrol and
scancel meet when slurmctld is down (connection refused), without stopping the session's cluster
for the other tests. Slurm's clients retry the connection MessageTimeout times 1 s apart
(slurm-22-05-9-1 src/common/slurm_protocol_api.c:884-888, slurm_open_controller_conn: "for
(retry = 0; retry < max_retry_period; retry++)", max_retry_period = msg_timeout): about 9 s per
command at the default 10. The dead copy sets MessageTimeout=2, the same failure path in about
1 s, so these tests do not spend minutes waiting (our code has no timeout of its own below it).
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from lingjun_slurm.common.errors import SlurmUnavailable
from lingjun_slurm.slurm.client import SlurmCLI
from lingjun_slurm.transport.local import LocalTransport
from tests.integration.helpers import all_ended, chain_spec, cli, status, submitted_run_id, wait_for

pytestmark = pytest.mark.slurm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_conf(slurm_cluster: Any, tmp_path: Path) -> Path:
    """The cluster's slurm.conf with a SlurmctldPort nobody listens on."""
    text = Path(slurm_cluster.slurm_conf).read_text()
    text, n = re.subn(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={free_port()}", text)
    assert n == 1 and not re.search(r"(?mi)^MessageTimeout=", text)
    text += "MessageTimeout=2\n"
    path = tmp_path / "dead" / "slurm.conf"
    path.parent.mkdir()
    path.write_text(text)
    return path


@pytest.fixture
def env(slurm_cluster: Any, tmp_path: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state"), "LINGJUN_SCHEDULER": "cli"}


def test_queue_reader_raises_slurms_own_words(slurm_cluster: Any, tmp_path: Path, monkeypatch) -> None:
    """The text reader (`squeue --me ... --Format`) exits 1 with slurm_load_jobs' error; 22.05's
    `squeue --json` (the fallback) exits 0 with only "Failed while looking for jobs" in its errors.
    Either way `scontrol ping` adds the controller's state, in Slurm's words."""
    monkeypatch.setenv("SLURM_CONF", str(dead_conf(slurm_cluster, tmp_path)))
    t = LocalTransport()
    started = time.monotonic()
    with pytest.raises(SlurmUnavailable) as info:
        SlurmCLI(t).queue()
    took = time.monotonic() - started
    print(f"squeue + scontrol ping against a dead slurmctld: {took:.1f} s")
    msg = info.value.message
    assert "slurm_load_jobs error: Unable to contact slurm controller" in msg, msg
    assert re.search(r"scontrol ping: Slurmctld\(primary\) at \S+ is DOWN", msg), msg
    assert [argv[:2] for argv in t.history] == [("squeue", "--me"), ("scontrol", "ping")]
    t.history.clear()
    with pytest.raises(SlurmUnavailable) as info:
        SlurmCLI(t)._queue_json()
    msg = info.value.message
    assert "slurm_load_jobs: Failed while looking for jobs" in msg, msg
    assert re.search(r"scontrol ping: Slurmctld\(primary\) at \S+ is DOWN", msg), msg
    assert [argv[:2] for argv in t.history] == [("squeue", "--json"), ("scontrol", "ping")]


def test_status_and_cancel_with_slurmctld_unreachable(slurm_cluster: Any, tmp_path: Path,
                                                      env: dict[str, str]) -> None:
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "slow", "command": "sleep 120"},
                                                               {"name": "after", "command": "true"}])
    slurm_run = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    local_spec = chain_spec(tmp_path / "l.yaml", tmp_path / "local-work", [{"name": "a", "command": "true"}],
                            name="localchain")
    local_run = submitted_run_id(cli("submit", str(local_spec), "--executor", "local", env=env).stdout)
    down = {**env, "SLURM_CONF": str(dead_conf(slurm_cluster, tmp_path))}
    try:
        started = time.monotonic()
        proc = cli("status", "--json", env=down, check=1)
        took = time.monotonic() - started
        print(f"status --json with slurmctld unreachable: {took:.1f} s")
        assert "internal error" not in proc.stderr
        assert "Slurm did not answer" in proc.stderr and "slurm_load_jobs" in proc.stderr
        runs = {r["run_id"]: r for r in json.loads(proc.stdout)["runs"]}
        assert set(runs) == {slurm_run, local_run}  # every run, the local one included
        assert [s["state"] for s in runs[local_run]["stages"]] == ["COMPLETED"]
        assert "slurm_error" not in runs[local_run]
        assert "is DOWN" in runs[slurm_run]["slurm_error"]
        for stage in runs[slurm_run]["stages"]:
            assert stage["state"] == "UNKNOWN" and stage["job_ids"], stage
            assert stage["reason"] == f"Slurm did not answer: {runs[slurm_run]['slurm_error']}"
        table = cli("status", env=down, check=1).stdout
        assert f"run {slurm_run}" in table and "UNKNOWN: Slurm did not answer" in table
        assert f"run {local_run}" in table and "COMPLETED" in table

        started = time.monotonic()
        proc = cli("cancel", slurm_run, env=down, check=1)
        print(f"cancel with slurmctld unreachable: {time.monotonic() - started:.1f} s")
        assert "internal error" not in proc.stderr
        assert f"cannot cancel run {slurm_run}: nothing was cancelled: Slurm did not answer" in proc.stderr
        manifest = json.loads((tmp_path / "work" / "runs" / slurm_run / "manifest.json").read_text())
        assert not any(e["event"] == "cancel" for e in manifest["events"])
        proc = cli("resubmit", slurm_run, "--from", "after", env=down, check=1)
        assert "cannot resubmit" in proc.stderr and "internal error" not in proc.stderr
        cli("cancel", local_run, env=down)  # a local run needs no Slurm
        # Nothing was cancelled: the live cluster still runs the job.
        assert status(slurm_run, env)["slow"]["state"] in ("PENDING", "RUNNING")
    finally:
        cli("cancel", slurm_run, env=env)
    wait_for(slurm_run, env, all_ended)
