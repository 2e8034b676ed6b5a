"""Which node a crashed step blames (lingjun_slurm/injob/host/crashlog.py), on real failure excerpts from
public issue threads (tests/fixtures/crashlogs/SOURCES.md) and constructed edge cases. The
srun lines added to real excerpts use srun's own formats (Slurm 22.05-25.11 src/srun/launch.c
_task_finish: "%s: %s %s: Exited with exit code %d", "%s: %s %s: %s%s")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lingjun_slurm.injob.host import crashlog

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "crashlogs"


def real(name: str) -> str:
    return (FIX / name).read_text(encoding="utf-8")


def run_on(tmp_path: Path, text: str, offset: int = 0, nodes=None, name: str = "job.out") -> dict:
    log = tmp_path / name
    log.write_bytes(text.encode("utf-8"))
    return crashlog.blame(str(log), offset, nodes)


def blamed(out: dict) -> list:
    return [f["node"] for f in out["found"]]


@pytest.fixture(autouse=True)
def no_node_config(tmp_path, monkeypatch):
    """Hermetic: the Xid verdicts come from this machine's health.conf by default (the batch host's
    SKU); every test here sees an empty node instead (NVIDIA's catalog), unless it sets one."""
    monkeypatch.setenv("LINGJUN_HEALTH_ROOT", str(tmp_path / "node"))


# ---- real excerpts, as they are -------------------------------------------------------------

@pytest.mark.parametrize("name, cls", [
    ("kohya_1434_ecc.log", "ecc"),
    ("open_gpu_kernel_modules_1151_xid79.log", "xid"),
    ("returnn_1486_nvidia_smi.log", "no-device-handle"),
    ("e3sm_8699_devices_unavailable.log", "devices-unavailable"),
])
def test_device_errors_seen_but_no_node_named(tmp_path, name, cls):
    out = run_on(tmp_path, real(name))
    assert out["evidence"] and out["evidence"][0]["class"] == cls
    assert out["evidence"][0]["node"] is None
    assert blamed(out) == []
    assert any("tying it to one node" in n["why"] for n in out["not_blamed"])


def test_e3sm_label_rank_without_srun_map(tmp_path):
    out = run_on(tmp_path, real("e3sm_8699_devices_unavailable.log"))
    assert "rank 2047 (srun label)" in out["evidence"][0]["via"]


@pytest.mark.parametrize("name, cls", [
    ("codegeex_160_illegal_memory.log", "illegal-address"),
    ("milabench_269_nccl_timeout.log", "nccl-timeout"),
    ("nccl_1029_initialization_error.log", "other-cuda"),
    ("vllm_6732_invalid_argument.log", "other-cuda"),
])
def test_program_errors_never_blame(tmp_path, name, cls):
    out = run_on(tmp_path, real(name))
    assert out["evidence"] == []
    assert blamed(out) == []
    assert [n["class"] for n in out["not_blamed"]] == [cls]


def test_nccl_hosts_are_learned_behind_a_launcher_prefix(tmp_path):
    out = run_on(tmp_path, real("nccl_1029_initialization_error.log"))
    assert out["known_nodes"] == ["rdma-test-gpu-worker-0", "rdma-test-gpu-worker-1"]


def test_srun_task_lines_parsed(tmp_path):
    out = run_on(tmp_path, real("weathergenerator_1572_srun_aborted.log"))
    assert [(t["node"], t["tasks"], t["status"]) for t in out["tasks"]] == [
        ("nid005018", "1,3", "Aborted"), ("nid005018", "2", "Terminated")]
    assert out["first_failure"]["status"] == "Aborted" and out["first_failure"]["unique"]
    assert blamed(out) == []  # no device error at all
    out = run_on(tmp_path, real("desispec_2744_srun_terminated.log"))
    assert out["tasks"][0]["tasks"] == "0-57,59-63"
    assert out["first_failure"]["unique"] is False  # killed first: a kill, not a failure


def test_unknown_error_on_the_only_node_is_not_blamed(tmp_path):
    out = run_on(tmp_path, real("nccl_1653_unknown_error.log"))
    assert out["evidence"][0]["node"] == "DESKTOP-1CE5APL"
    assert blamed(out) == []
    assert any("every node" in n["why"] for n in out["not_blamed"])


# ---- real excerpts inside a constructed multi-node job ----------------------------------------

def test_unknown_error_host_prefix_blames_that_node_of_two(tmp_path):
    out = run_on(tmp_path, real("nccl_1653_unknown_error.log"), nodes=["DESKTOP-1CE5APL", "node2"])
    assert blamed(out) == ["DESKTOP-1CE5APL"]
    assert out["found"][0]["source"] == "crash"
    assert "nccl host prefix" in out["found"][0]["reason"]


def test_ecc_without_prefix_blames_the_first_failing_node(tmp_path):
    text = real("kohya_1434_ecc.log") + ("srun: error: gpu2: task 1: Exited with exit code 1\n"
                                         "srun: Terminating StepId=7.0\n"
                                         "srun: error: gpu1: task 0: Killed\n")
    out = run_on(tmp_path, text)
    assert blamed(out) == ["gpu2"]
    assert "failed first" in out["found"][0]["reason"]


def test_ecc_without_prefix_two_nodes_exiting_blames_none(tmp_path):
    text = real("kohya_1434_ecc.log") + ("srun: error: gpu2: task 1: Exited with exit code 1\n"
                                         "srun: error: gpu1: task 0: Exited with exit code 1\n")
    out = run_on(tmp_path, text)
    assert blamed(out) == []
    assert out["first_failure"]["unique"] is False


def test_label_rank_mapped_by_srun_line(tmp_path):
    text = real("e3sm_8699_devices_unavailable.log") + (
        "srun: error: nid004069: task 2047: Exited with exit code 1\n"
        "srun: error: nid001300: tasks 0-2046: Killed\n")
    out = run_on(tmp_path, text)
    assert blamed(out) == ["nid004069"]


def test_illegal_address_with_a_unique_first_failure_still_blames_none(tmp_path):
    text = real("codegeex_160_illegal_memory.log") + ("srun: error: gpu2: task 1: Exited with exit code 1\n"
                                                      "srun: error: gpu1: task 0: Killed\n")
    assert blamed(run_on(tmp_path, text)) == []


def test_torch_rank_prefix(tmp_path):
    text = ("[rank3]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
            "srun: error: n2: tasks 2-3: Exited with exit code 1\n"
            "srun: error: n1: tasks 0-1: Terminated\n"
            "srun: error: n3: tasks 4-5: Terminated\n")
    assert blamed(run_on(tmp_path, text)) == ["n2"]


def test_same_error_on_every_node_blames_none(tmp_path):
    text = ("n1:11:11 [0] enqueue.cc:58 NCCL WARN Cuda failure 'uncorrectable ECC error encountered'\n"
            "n2:12:12 [0] enqueue.cc:58 NCCL WARN Cuda failure 'uncorrectable ECC error encountered'\n")
    out = run_on(tmp_path, text)
    assert blamed(out) == []
    assert any("every node" in n["why"] for n in out["not_blamed"])
    assert blamed(run_on(tmp_path, text, nodes=["n1", "n2", "n3", "n4"])) == ["n1", "n2"]
    assert blamed(run_on(tmp_path, text, nodes=["n1", "n2", "n3"])) == []  # more than half


def test_syslog_xid_line_names_its_host(tmp_path):
    xid = real("open_gpu_kernel_modules_1151_xid79.log").splitlines()[2]
    text = f"Feb 14 05:03:41 gpu-7 kernel: {xid}\n"
    assert blamed(run_on(tmp_path, text, nodes=["gpu-6", "gpu-7"])) == ["gpu-7"]
    app = "Feb 14 05:03:41 gpu-7 kernel: NVRM: Xid (PCI:0000:06:00): 31, pid=123, name=python\n"
    assert blamed(run_on(tmp_path, app, nodes=["gpu-6", "gpu-7"])) == []


def test_node_failure_line(tmp_path):
    out = run_on(tmp_path, "srun: error: Node failure on gpu[02-03]\n", nodes=["gpu01", "gpu02"])
    assert out["found"] == [{"node": "gpu02", "source": "node-failure",
                             "reason": "srun: Node failure on gpu02 (log byte 0)"}]


# ---- reading: offsets, truncation ----------------------------------------------------------------

OLD = "n1:11:11 [0] enqueue.cc:58 NCCL WARN Cuda failure 'uncorrectable ECC error encountered'\n"
NEW = "srun: error: n2: task 1: Exited with exit code 1\n"


def test_offset_at_a_line_start_reads_from_there(tmp_path):
    out = run_on(tmp_path, OLD + NEW, offset=len(OLD), nodes=["n1", "n2", "n3"])
    assert out["evidence"] == [] and len(out["tasks"]) == 1
    out = run_on(tmp_path, OLD + NEW, offset=0, nodes=["n1", "n2", "n3"])
    assert blamed(out) == ["n1"]


def test_offset_in_the_middle_of_a_line_drops_that_line(tmp_path):
    out = run_on(tmp_path, OLD + NEW, offset=5, nodes=["n1", "n2", "n3"])
    assert out["evidence"] == [] and blamed(out) == []
    assert out["read"]["dropped_partial_line_bytes"] == len(OLD) - 1 - 5
    assert out["tasks"][0]["node"] == "n2"


def test_log_shorter_than_offset_is_read_from_its_start(tmp_path):
    out = run_on(tmp_path, OLD, offset=10_000, nodes=["n1", "n2", "n3"])
    assert out["read"]["log_shorter_than_offset"] is True
    assert blamed(out) == ["n1"]


def test_truncated_last_line(tmp_path):
    out = run_on(tmp_path, "srun: error: n2: task 1: Exi", nodes=["n1", "n2"])
    assert out["read"]["last_line_unterminated"] is True
    assert out["tasks"] == []  # "Exi" is no status srun prints


def test_tail_only_when_huge(tmp_path):
    text = OLD + "x" * 5000 + "\n" + NEW
    log = tmp_path / "big.out"
    log.write_text(text)
    out = crashlog.blame(str(log), 0, ["n1", "n2", "n3"], max_bytes=len(NEW) + 10)
    assert out["read"]["skipped_bytes"] > 0 and out["evidence"] == [] and out["tasks"][0]["node"] == "n2"


# ---- hostile names ----------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "srun: error: node1;reboot: task 0: Exited with exit code 1\n",
    "srun: error: evil,node2: task 0: Exited with exit code 1\n",
    "srun: error: $(reboot): task 0: Exited with exit code 1\n",
    "srun: error: " + "a" * 80 + ": task 0: Exited with exit code 1\n",
])
def test_hostile_srun_host_is_not_parsed(tmp_path, line):
    out = run_on(tmp_path, "RuntimeError: CUDA error: uncorrectable ECC error encountered\n" + line +
                 "srun: error: n1: task 1: Killed\n")
    assert blamed(out) == []
    assert all(t["node"] == "n1" for t in out["tasks"])


def test_hostile_nccl_host_and_foreign_node(tmp_path):
    text = ("x;evil:12:12 [0] NCCL WARN Cuda failure 'uncorrectable ECC error encountered'\n"
            "12:34:56 [0] NCCL WARN Cuda failure 'uncorrectable ECC error encountered'\n"
            "other:12:12 [0] NCCL WARN Cuda failure 'uncorrectable ECC error encountered'\n")
    out = run_on(tmp_path, text, nodes=["n1", "n2", "n3"])
    assert blamed(out) == []
    assert [e["node"] for e in out["evidence"]] == [None, None, "other"]
    assert any(n["why"] == "not a node of this job" for n in out["not_blamed"])


def test_expand_hosts_and_tasks():
    assert crashlog.expand_hosts("gpu[01-03,7]") == ["gpu01", "gpu02", "gpu03", "gpu7"]
    assert crashlog.expand_hosts("a b") == [] and crashlog.expand_hosts("n[3-1]") == []
    assert crashlog.expand_tasks("0-2,5") == [0, 1, 2, 5] and crashlog.expand_tasks("1-x") == []


# ---- the CLI and its contract with lingjun_slurm.injob.host.exclusion.add ---------------------------------

def test_cli_prints_one_json_object(tmp_path):
    log = tmp_path / "job.out"
    log.write_text("prelude\n" + real("nccl_1653_unknown_error.log"))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.host.crashlog", "--log", str(log), "--offset", "8",
                           "--nodes", "DESKTOP-1CE5APL,node2"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == 1 and [f["node"] for f in doc["found"]] == ["DESKTOP-1CE5APL"]
    assert set(doc["found"][0]) == {"node", "reason", "source"}  # what exclusion.add() reads
    missing = subprocess.run([sys.executable, "-m", "lingjun_slurm.injob.host.crashlog", "--log", str(tmp_path / "nope"),
                              "--offset", "0"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_stdlib_only():
    """crashlog and what it imports of the package (the XID table reader and the health package's
    __init__) use the standard library only: they run on the batch host with plain python3."""
    stdlib = {"argparse", "json", "os", "re", "sys", "typing", "shutil", "tempfile", "collections", "contextlib",
              "importlib", "pathlib"}
    for rel in ("injob/host/crashlog.py", "nodes/health/xid.py", "nodes/health/__init__.py"):
        src = (REPO / "lingjun_slurm" / rel).read_text()
        imports = {line.split()[1].split(".")[0] or line.split()[1] for line in src.splitlines()
                   if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
        ours = {line.split()[1] for line in src.splitlines() if line.startswith("from lingjun_slurm")}
        assert imports <= stdlib | {".health", "lingjun_slurm"} and ours <= {"lingjun_slurm.nodes.health"}, (rel, imports)



# ---- Xids: lingjun-health's XID table and the SKU family (lingjun_slurm/nodes/health/xid.py) --------------

XID63 = real("m4_logs_tr190_xid63.log").split("Error: ", 1)[1]  # the kernel's syslog line, host ip-26-0-146-100
XID94 = real("open_gpu_kernel_modules_xid94_format.log")
NODES = ["ip-26-0-146-100", "ip-26-0-146-101"]


def test_real_xid63_line_as_posted_names_no_node(tmp_path):
    """m4-logs' monitoring line ("Xid errors on instance: HOST, Error: <syslog line>") does not
    start with the syslog stamp: the Xid is seen, under Azure's policy as a node fault, but no node."""
    text = real("m4_logs_tr190_xid63.log")
    log = tmp_path / "job.out"
    log.write_text(text)
    out = crashlog.blame(str(log), 0, NODES, xid_policy="azure")
    assert out["evidence"][0]["class"] == "xid" and out["evidence"][0]["node"] is None and blamed(out) == []
    out = crashlog.blame(str(log), 0, NODES, xid_policy="nvidia")
    assert out["evidence"] == [] and [n["class"] for n in out["not_blamed"]] == ["xid-app"]


@pytest.mark.parametrize("policy, line, blames", [
    ("nvidia", XID63, False),  # NVIDIA's catalog: IGNORE
    ("azure", XID63, True),  # azure_gpu_xid.nhc lists 63
    ("nvidia", XID63.replace("): 63, ", "): 92, "), False),  # IGNORE
    ("azure", XID63.replace("): 63, ", "): 92, "), True),  # Azure lists 92
    ("nvidia", "May 19 07:08:57 ip-26-0-146-100 kernel: " + XID94, False),  # RESTART_APP
    ("azure", "May 19 07:08:57 ip-26-0-146-100 kernel: " + XID94, False),  # not in Azure's list
    ("nvidia", XID63.replace("): 63, ", "): 79, "), True),  # RESTART_BM
    ("azure", XID63.replace("): 63, ", "): 79, "), True),
])
def test_xid_verdict_is_the_health_checks_for_the_family(tmp_path, policy, line, blames):
    log = tmp_path / "job.out"
    log.write_text(line + "\n")
    out = crashlog.blame(str(log), 0, NODES, xid_policy=policy)
    assert blamed(out) == (["ip-26-0-146-100"] if blames else []), out
    assert out["xid_policy"]["policy"] == policy


def test_nonfatal_nvlink5_xid_does_not_blame(tmp_path):
    """lingjun-health's rule: an NVLink5 Xid whose line says "Nonfatal" never drains."""
    kern = (REPO / "tests/fixtures/health/kern/nvlink5.log").read_text().splitlines()
    fatal, nonfatal = (f"Feb 14 05:03:41 gpu-7 kernel: {ln.split('] ', 1)[1]}\n" for ln in kern)
    assert blamed(run_on(tmp_path, nonfatal, nodes=["gpu-6", "gpu-7"])) == []
    assert blamed(run_on(tmp_path, fatal, nodes=["gpu-6", "gpu-7"])) == ["gpu-7"]


def _node(tmp_path, conf: str) -> None:
    folder = tmp_path / "node" / "etc" / "lingjun-slurm"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "health.conf").write_text(conf)


def test_the_family_comes_from_the_nodes_health_conf(tmp_path):
    """As lingjun-health reads it: SKU= (an instance type listed in a thresholds file), a drop-in
    over it."""
    log = tmp_path / "job.out"
    log.write_text(XID63 + "\n")
    _node(tmp_path, "SKU=Standard_ND96amsr_A100_v4\n")
    out = crashlog.blame(str(log), 0, NODES)
    assert out["xid_policy"]["policy"] == "azure" and "azure-nd-a100-v4.conf" in out["xid_policy"]["source"]
    assert blamed(out) == ["ip-26-0-146-100"]
    dropins = tmp_path / "node/etc/lingjun-slurm/health.conf.d"
    dropins.mkdir()
    (dropins / "90-xid.conf").write_text("GPU_XID_POLICY=nvidia\n")
    assert blamed(crashlog.blame(str(log), 0, NODES)) == []
    _node(tmp_path, "SKU=lingjun\n")
    (dropins / "90-xid.conf").write_text("GPU_FATAL_XIDS=63\n")  # a site's own addition
    assert blamed(crashlog.blame(str(log), 0, NODES)) == ["ip-26-0-146-100"]


def test_a_broken_node_config_falls_back_to_nvidias_catalog_and_says_why(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(XID63 + "\n")
    _node(tmp_path, "SKU=Standard_ND96amsr_A100_v4\nthis is not a setting\n")
    out = crashlog.blame(str(log), 0, NODES)
    assert out["xid_policy"]["policy"] == "nvidia" and blamed(out) == []
    assert "health.conf:2: expected KEY=VALUE" in out["xid_policy"]["source"]


def test_cli_sku_and_policy(tmp_path):
    log = tmp_path / "job.out"
    log.write_text(XID63 + "\n")
    base = [sys.executable, "-m", "lingjun_slurm.injob.host.crashlog", "--log", str(log), "--offset", "0", "--nodes", " ".join(NODES)]
    proc = subprocess.run(base + ["--sku", "Standard_ND96isr_H200_v5"], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0 and [f["node"] for f in json.loads(proc.stdout)["found"]] == ["ip-26-0-146-100"]
    proc = subprocess.run(base + ["--sku", "Standard_NoSuch"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "no thresholds for SKU 'Standard_NoSuch'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run(base + ["--xid-policy", "gcp"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "GPU_XID_POLICY=gcp: not a POLICY of " in proc.stderr


def test_a_malformed_xid_table_names_its_line(tmp_path):
    from lingjun_slurm.nodes.health import xid
    bad = tmp_path / "xid.tsv"
    bad.write_text("# ok\nPOLICY\tnvidia\tactions\telapsed\tevery-run\n79 RESTART_BM - lost\n")
    with pytest.raises(xid.XidTableError, match=rf"^{bad}:3: expected CODE<TAB>"):
        xid.load(str(bad))
