"""status when Slurm does not answer (issue 15, item 4): every run shown, Slurm's stages UNKNOWN
with Slurm's own message, never "internal error". The real squeue here, pointed at a controller
port nothing listens on (no daemon needed: the connection is refused before any authentication);
the whole command against the real test cluster is tests/cluster/test_slurm_down.py."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from lingjun_slurm.common.errors import SlurmUnavailable
from lingjun_slurm.runs.index import RunIndex
from lingjun_slurm.runs.manifest import ClusterRecord, save_manifest
from lingjun_slurm.spec import load_spec
from lingjun_slurm.status import StatusCollector, document, format_table
from lingjun_slurm.submit import new_manifest, prepare, prepare_local, write_run_dir
from lingjun_slurm.transport.local import LocalTransport
from tests.integration.helpers import chain_spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_slurm(tmp_path: Path, monkeypatch) -> Path:
    if not shutil.which("squeue"):
        pytest.skip("the Slurm client (squeue) is not installed")
    conf = tmp_path / "slurm.conf"
    # MessageTimeout=2: the client retries the refused connection twice, 1 s apart, not 10 times
    # (tests/cluster/test_slurm_down.py cites slurm_open_controller_conn)
    conf.write_text("\n".join([
        "ClusterName=gone", f"SlurmctldHost={socket.gethostname().split('.')[0]}(127.0.0.1)",
        f"SlurmctldPort={free_port()}", "MessageTimeout=2", "AuthType=auth/munge", f"AuthInfo=socket={tmp_path}/munge.sock",
        "NodeName=node1 NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN", "PartitionName=cpu Nodes=node1 Default=YES"]) + "\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("LINGJUN_SCHEDULER", "cli")
    return conf


class DeadReader:
    name = "dead"

    def queue(self):
        raise SlurmUnavailable("login1", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")

    def accounting(self, job_ids):
        raise AssertionError("no sacct once the queue could not be read")


def slurm_and_local_runs(tmp_path: Path):
    t = LocalTransport()
    spec = chain_spec(tmp_path / "s.yaml", tmp_path / "work", [{"name": "a", "command": "true"},
                                                               {"name": "b", "command": "true"}])
    prep = prepare(load_spec(spec), run_id="sl-1", executor="slurm")
    write_run_dir(t, prep, new=True)
    m = new_manifest(t, prep, "slurm", ClusterRecord(name="c", slurm_version="22.05.8", accounting=True))
    for i, rec in enumerate(m.stages):
        rec.job_ids = [str(100 + i)]
    m.state = "submitted"
    save_manifest(t, m)
    lspec = chain_spec(tmp_path / "l.yaml", tmp_path / "lwork", [{"name": "x", "command": "true"}], name="loc")
    lm = prepare_local(t, prepare(load_spec(lspec), run_id="lo-1", executor="local"), RunIndex())
    return t, m, lm


def test_unreachable_queue_marks_slurm_stages_unknown_and_keeps_local_runs(tmp_path: Path) -> None:
    t, m, lm = slurm_and_local_runs(tmp_path)
    collector = StatusCollector(t, reader=DeadReader())
    runs = collector.collect([m, lm])
    assert collector.unavailable is not None
    slurm_run, local_run = runs
    assert [s.state for s in slurm_run.stages] == ["UNKNOWN", "UNKNOWN"]
    assert all(s.reason == "Slurm did not answer: slurm_load_jobs error: Unable to contact slurm controller "
               "(connect failure)" for s in slurm_run.stages)
    assert [s.job_ids for s in slurm_run.stages] == [["100"], ["101"]]
    assert local_run.run_id == "lo-1" and local_run.slurm_error is None
    doc = document(runs)
    assert doc["runs"][0]["slurm_error"].startswith("slurm_load_jobs error")
    assert "slurm_error" not in doc["runs"][1]
    table = format_table(runs)
    assert "run sl-1  (slurm on " in table and "UNKNOWN: Slurm did not answer: slurm_load_jobs error" in table
    assert "Slurm did not answer (above)" in table and "run lo-1" in table


def test_real_squeue_against_a_dead_controller(dead_slurm: Path, tmp_path: Path) -> None:
    """What squeue 22.05 really does (exit 0, an "errors" list) becomes SlurmUnavailable with its
    words and scontrol ping's; the collector turns it into UNKNOWN stages instead of a crash."""
    t, m, lm = slurm_and_local_runs(tmp_path)
    collector = StatusCollector(t)
    slurm_run, local_run = collector.collect([m, lm])
    msg = collector.unavailable.message
    assert "slurm_load_jobs" in msg and "is DOWN" in msg, msg
    assert {s.state for s in slurm_run.stages} == {"UNKNOWN"} and slurm_run.slurm_error == msg
    assert [a[0] for a in t.history] == ["squeue", "scontrol"]  # no sacct, no retry of our own
    assert str(collector.unavailable).startswith(f"Slurm did not answer on {t.host}: squeue: ")
    json.dumps(document([slurm_run, local_run]))


def test_watch_waits_for_slurm_to_answer_again(monkeypatch) -> None:
    """status --watch: a refresh Slurm did not answer is said on stderr and the watch goes on."""
    from click.testing import CliRunner

    from lingjun_slurm.cli import runs as cli_runs

    answers = [SlurmUnavailable("login1", "slurm_load_jobs error: Unable to contact slurm controller "
                                "(connect failure)"), []]

    def fake(refs, as_json, conns=None, verbose=False):
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    monkeypatch.setattr(cli_runs, "_print_status", fake)
    monkeypatch.setattr(cli_runs.time, "sleep", lambda s: None)
    result = CliRunner().invoke(cli_runs.status, ["--watch", "--interval", "1"])
    assert result.exit_code == 0, result.output
    assert "Slurm did not answer on login1" in result.output and "watching on" in result.output
    assert answers == []
    answers[:] = [SlurmUnavailable("login1", "down")]
    result = CliRunner().invoke(cli_runs.status, [])  # without --watch: exit 1 after showing
    assert result.exit_code == 1 and isinstance(result.exception, SlurmUnavailable)
