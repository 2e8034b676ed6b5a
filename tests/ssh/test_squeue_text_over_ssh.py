"""The queue's text form over SSH (issue 31): SLURM_TIME_FORMAT=%s reaches the remote squeue on
the command line (sshcommands.command_line: `env -- NAME=VALUE`), so times come back as epoch
seconds and the text reader gives what the JSON reader gives, through one SSH connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.devcluster import DevCluster
from lingjun_slurm.slurm.client import SlurmCLI
from tests.cluster.fixtures import wait_job
from tests.ssh.fixtures import SSHServer

pytestmark = pytest.mark.slurm


def test_queue_over_ssh_reads_epoch_times_and_matches_the_json(ssh_slurm: SSHServer, slurm_cluster: DevCluster,
                                                              tmp_path: Path) -> None:
    with ssh_slurm.transport() as t:
        slurm = SlurmCLI(t)
        t.mkdir(str(tmp_path / "remote"))
        t.write_atomic(str(tmp_path / "remote" / "job.sh"), "#!/bin/bash\n#SBATCH -o /dev/null\nexit 4\n", 0o755)
        job = slurm.submit(str(tmp_path / "remote" / "job.sh"), cwd=str(tmp_path / "remote"), hold=False)
        assert wait_job(slurm_cluster.env, job) == "FAILED"
        text = {j.job_id: j for j in slurm.queue()}
        assert slurm.failed is None and t.history[-1][0] == "squeue" and "--json" not in t.history[-1]
        mine = text[job]
        assert (mine.state, mine.exit_code) == ("FAILED", 4)
        assert isinstance(mine.start, float) and mine.end is not None and mine.end >= mine.start > 1e9
        from_json = {j.job_id: j for j in slurm._queue_json()}
        assert from_json[job] == mine
        assert t.connections == 1
