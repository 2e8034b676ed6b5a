"""`lingjun-slurm doctor --host`: rendered on "the laptop" (no Slurm there), submitted and waited for
over one SSH connection to the test Slurm cluster, the verdict read back (tests/remote/test_remote_slurm.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.integration.faults import train_spec
from tests.remote.test_remote_slurm import Laptop, laptop  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slurm


def test_doctor_over_ssh_one_connection(laptop: Laptop) -> None:  # noqa: F811
    path = train_spec(laptop.root, "rdoc", data_prefix=str(laptop.workdir / "corpus"), preflight=False)
    doc = yaml.safe_load(path.read_text())
    doc["run"]["workdir"] = str(laptop.workdir)
    # This machine's own interfaces are not what is tested here (tests/integration/test_doctor_slurm.py is).
    doc["cluster"]["network"]["overrides"] = {"NCCL_SOCKET_IFNAME": None}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc, logins = laptop.counted("doctor", str(path), "--host", "lingjun-test", "--poll-interval", "0.5",
                                  "--json", timeout=90)
    assert logins == 1, f"doctor opened {logins} SSH connections"
    verdict = json.loads(proc.stdout)
    assert verdict["ok"] and len(verdict["nodes"]) == 2, verdict
    assert laptop.local_slurm_calls() == ""  # sbatch and squeue ran over SSH
    (run_dir,) = (laptop.workdir / "runs").iterdir()
    assert (run_dir / "site" / "lingjun_slurm" / "injob" / "preflight" / "judge.py").is_file()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["transport"] == {"kind": "ssh", "host": "lingjun-test"}
    assert [s["kind"] for s in manifest["stages"]] == ["doctor"]
    assert (laptop.root / "state" / "runs" / run_dir.name / "manifest.json").is_file()  # the local copy
    assert list(laptop.cwd.iterdir()) == []
    laptop.assert_no_secrets()
