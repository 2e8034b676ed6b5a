"""The files the cluster-init scripts read are generated from the package's data and never drift."""

from __future__ import annotations

from pathlib import Path

from lingjun_slurm.nodes import clusterinit_gen
from lingjun_slurm import network
from lingjun_slurm.cli.main import main

REPO = Path(__file__).resolve().parents[2]
NCCL = REPO / "cluster_init" / clusterinit_gen.NCCL_DIR


def test_generated_files_are_current() -> None:
    assert clusterinit_gen.main(["--check", str(REPO / "cluster_init")]) == 0, \
        "stale: run python -m lingjun_slurm.nodes.clusterinit_gen cluster_init/"


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


HEALTH = REPO / "cluster_init" / clusterinit_gen.HEALTH_DIR


def test_health_checks_are_copied_verbatim_and_executable() -> None:
    from lingjun_slurm.nodes import health

    program = HEALTH / health.PROGRAM
    assert program.read_text() == health.program_text()
    assert program.stat().st_mode & 0o777 == 0o755, "lingjun-health must keep mode 0755 in cluster_init/"
    copied = {p.name: p.read_text() for p in (HEALTH / health.THRESHOLDS).glob("*") if p.suffix in (".conf", ".tsv")}
    assert copied == health.threshold_texts() and copied


def test_check_fails_on_health_drift_and_mode(tmp_path: Path) -> None:
    assert clusterinit_gen.main([str(tmp_path)]) == 0
    program = tmp_path / clusterinit_gen.HEALTH_DIR / "lingjun-health"
    assert program.stat().st_mode & 0o777 == 0o755
    program.chmod(0o644)
    assert clusterinit_gen.main(["--check", str(tmp_path)]) == 1
    assert clusterinit_gen.main([str(tmp_path)]) == 0 and program.stat().st_mode & 0o777 == 0o755
    conf = tmp_path / clusterinit_gen.HEALTH_DIR / "thresholds" / "azure-nd-h100-v5.conf"
    conf.write_text(conf.read_text().replace("IB_RATE_GBPS=400", "IB_RATE_GBPS=200"))
    assert clusterinit_gen.main(["--check", str(tmp_path)]) == 1
