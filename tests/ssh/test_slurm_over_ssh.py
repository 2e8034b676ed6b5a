"""The `ssh_slurm` fixture: Slurm's commands run over SSH reach the test cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from lingjun_slurm.devcluster import DevCluster
from lingjun_slurm.slurm.client import SlurmCLI
from tests.cluster.fixtures import wait_job
from tests.ssh.fixtures import SSHServer

pytestmark = pytest.mark.slurm


def test_slurm_commands_over_ssh_reach_the_test_cluster(ssh_slurm: SSHServer, slurm_cluster: DevCluster,
                                                        tmp_path: Path) -> None:
    with ssh_slurm.transport() as t:
        slurm = SlurmCLI(t)
        assert slurm.available() and t.which("slurmctld")  # PATH has the sbin directories
        assert slurm.cluster_info().name == "lingjun-test"
        t.mkdir(str(tmp_path / "remote"))
        t.write_atomic(str(tmp_path / "remote" / "job.sh"), "#!/bin/bash\n#SBATCH -o out.txt\necho over-ssh\n", 0o755)
        job = slurm.submit(str(tmp_path / "remote" / "job.sh"), cwd=str(tmp_path / "remote"), hold=False)
        assert wait_job(slurm_cluster.env, job) == "COMPLETED"
        assert t.read_text(str(tmp_path / "remote" / "out.txt")) == "over-ssh\n"
        assert job in {j.job_id for j in slurm.accounting([job]) or []}
        assert t.connections == 1
