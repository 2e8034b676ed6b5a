"""status of runs read through a non-local transport, without sshd: a LocalTransport stand-in that says it
is "ssh" and keeps "the cluster's" files under another root, so nothing is found at the same path here."""

from __future__ import annotations

import time
from pathlib import Path

from lingjun_slurm.executors.local import STATE_FILE, LocalState, TaskState
from lingjun_slurm.runs.manifest import ClusterRecord, Manifest, SpecRecord, StageRecord, TransportRecord
from lingjun_slurm.status import StatusCollector
from lingjun_slurm.transport import LocalTransport

RUN = "onhost-20261130-010101-abcdef"
RUN_DIR = f"/cluster-only/runs/{RUN}"  # exists only under the stand-in's root


class ElsewhereTransport(LocalTransport):
    kind = "ssh"

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    @property
    def host(self) -> str:
        return "login"

    def read_bytes(self, path: str) -> bytes:
        return super().read_bytes(str(self.root) + path)

    def exists(self, path: str) -> bool:
        return super().exists(str(self.root) + path)


def test_a_local_executor_run_on_another_host_is_read_over_its_transport(tmp_path: Path) -> None:
    """A run the local executor ran on the login node (adopted here with `status DIR --host H`): its
    local-state.json is read over the transport, and its process ids are not looked up on this machine."""
    now = time.time()
    m = Manifest(run_id=RUN, name="onhost", created_at=now, updated_at=now, tool_version="0", user="u",
                 executor="local", transport=TransportRecord(kind="local", host="login"),
                 cluster=ClusterRecord(name="local"), spec=SpecRecord(source="s.yaml", sha256="0"),
                 run_dir=RUN_DIR, log_dir=f"{RUN_DIR}/logs", state="submitted",
                 stages=[StageRecord(name=n, kind="command", script=f"{n}.sbatch", job_name=f"{RUN}-{n}",
                                     job_ids=[j]) for n, j in (("a", "1"), ("b", "2"))])
    state = LocalState(run_id=RUN, runner_pid=1, host="login", finished=False, tasks=[
        TaskState(key="1", stage="a", job_id="1", task=None, state="COMPLETED", reason=None, start=now - 9,
                  end=now - 5, exit_code=0),
        TaskState(key="2", stage="b", job_id="2", task=None, state="RUNNING", reason=None, pid=1, start=now - 5)])
    where = tmp_path / RUN_DIR.lstrip("/")
    where.mkdir(parents=True)
    (where / STATE_FILE).write_text(state.to_json())
    assert not Path(RUN_DIR).exists()
    (run,) = StatusCollector(ElsewhereTransport(tmp_path)).collect([m])
    got = {s.name: s.state for s in run.stages}
    # Not "PENDING, not started" (the file looked for on this machine), and pid 1 here is not its runner.
    assert got == {"a": "COMPLETED", "b": "RUNNING"}, run.stages
