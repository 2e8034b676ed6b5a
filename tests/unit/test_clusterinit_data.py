"""The files the cluster-init scripts read are generated from the package's data and never drift."""

from __future__ import annotations

from pathlib import Path

from lingjun_slurm import clusterinit_gen, network
from lingjun_slurm.cli import main

REPO = Path(__file__).resolve().parents[2]
NCCL = REPO / "cluster_init" / clusterinit_gen.NCCL_DIR


def test_generated_files_are_current() -> None:
    assert clusterinit_gen.main(["--check", str(REPO / "cluster_init")]) == 0, \
        "stale: run python -m lingjun_slurm.clusterinit_gen cluster_init/"


def test_check_fails_on_drift(tmp_path: Path) -> None:
    assert clusterinit_gen.main([str(tmp_path)]) == 0
    conf = tmp_path / clusterinit_gen.NCCL_DIR / "lingjun.conf"
    conf.write_text(conf.read_text().replace("NCCL_IB_TC=136", "NCCL_IB_TC=106"))
    assert clusterinit_gen.main(["--check", str(tmp_path)]) == 1


def test_each_conf_is_what_nccl_env_prints(capsys) -> None:
    for name in network.profiles():
        try:
            main(["nccl-env", "--profile", name, "--format", "nccl.conf"])
        except SystemExit as exc:
            assert not exc.code
        assert (NCCL / f"{name}.conf").read_text() == capsys.readouterr().out


def test_instance_type_map_matches_profile_selection() -> None:
    rows = [line.split("\t") for line in (NCCL / "instance-types.tsv").read_text().splitlines()
            if not line.startswith("#")]
    assert rows, "no instance types"
    for itype, profile in rows:
        assert network.profile_for_instance(itype).name == profile
