"""Launch details of the plan (issue 12, item 4): whole-node memory with --exclusive."""

from __future__ import annotations

from pathlib import Path

from lingjun_slurm.plan import build_plan
from lingjun_slurm.spec import load_spec

REPO = Path(__file__).resolve().parents[2]


def train_sbatch(tmp_path: Path, edit) -> dict[str, str | None]:
    text = edit((REPO / "examples" / "megatron-gpt.yaml").read_text())
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return dict(build_plan(load_spec(path).spec).stage("train").sbatch)


def test_exclusive_without_mem_asks_for_the_whole_node(tmp_path: Path) -> None:
    opts = train_sbatch(tmp_path, lambda t: t)
    assert "exclusive" in opts and opts["mem"] == "0"


def test_an_explicit_mem_wins(tmp_path: Path) -> None:
    opts = train_sbatch(tmp_path, lambda t: t.replace("cpus_per_task: 12,", "cpus_per_task: 12, mem: 1500G,"))
    assert opts["mem"] == "1500G"


def test_no_mem_beside_another_memory_option(tmp_path: Path) -> None:
    option = "mem-per-gpu"  # sbatch refuses --mem together with --mem-per-gpu
    opts = train_sbatch(tmp_path, lambda t: t.replace("    mail-type: FAIL\n", f"    mail-type: FAIL\n    {option}: 200G\n"))
    assert "mem" not in opts and opts[option] == "200G"


def test_not_exclusive_leaves_mem_to_slurm(tmp_path: Path) -> None:
    opts = train_sbatch(tmp_path, lambda t: t.replace("  exclusive: true\n", ""))
    assert "mem" not in opts and "exclusive" not in opts
