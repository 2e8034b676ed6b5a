"""Wall time of one lingjun-health run, against slurmd's 60 s HealthCheckProgram limit.

    python bench/health_runtime.py [--repeat 5]

slurmd kills a HealthCheckProgram after 60 s (SchedMD/slurm src/slurmd/slurmd/slurmd.c,
run_script_health_check: max_wait 60 * 1000 in 22.05; HealthCheckTimeout, default 60, since
26.05). Measured in the same run, on the real-sample node tree of tests/health (the gpud H100
node: its nvidia-smi -q, InfiniBand sysfs with the Ethernet bond, the XID 119 kernel log):

- reference: the program with SKU=cpu and no probe to run (bash start, config, thresholds);
- healthy: the real-sample tree, every check (stand-in nvidia-smi, systemctl, scontrol);
- hung nvidia-smi: nvidia-smi is `sleep 1000` (CMD_TIMEOUT=20, TIME_BUDGET=50, the defaults);
- everything hung: nvidia-smi, systemctl and scontrol all `sleep 1000` (FABRIC_MANAGER=yes, so
  systemctl is asked too): the budget, not CMD_TIMEOUT, ends the run.

Each line: median seconds, ratio to the reference, share of the 60 s limit. No thresholds here:
this is a benchmark, not a test (tests/health/test_timeouts.py checks that hung probes are
killed with the timeout their verdict names).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.health.machines import Node, gpud_h100  # noqa: E402

SLURMD_LIMIT = 60.0
HANG = "#!/bin/sh\nexec sleep 1000\n"


def seconds(node: Node, repeat: int, *args: str, **env: str) -> tuple[float, int]:
    times, rc = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = node.run(*args, **env)
        times.append(time.perf_counter() - start)
        rc = proc.returncode
    return statistics.median(times), rc


def hang(node: Node, *names: str) -> None:
    for name in names:
        path = node.bin / name
        path.unlink(missing_ok=True)
        path.write_text(HANG)
        path.chmod(0o755)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of the fast cases (the hung ones run once)")
    opts = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lingjun-health-bench-") as tmp:
        base = Path(tmp)
        ref = Node(base / "ref", gpud_h100())
        ref.change(sku="cpu", dropins={}, nccl={"NCCL_SOCKET_IFNAME": None}, config={"ENROOT_CONF": "/nonexistent"})
        rows.append(("reference (SKU=cpu, nothing to probe)",) + seconds(ref, opts.repeat, "--no-drain"))
        healthy = Node(base / "healthy", gpud_h100())
        rows.append(("healthy real-sample H100 node",) + seconds(healthy, opts.repeat))
        print(f"{rows[-1][0]}: done", file=sys.stderr)
        smi = Node(base / "smi", gpud_h100())
        hang(smi, "nvidia-smi")
        rows.append(("nvidia-smi hung (sleep 1000)",) + seconds(smi, 1))
        print(f"{rows[-1][0]}: done", file=sys.stderr)
        every = Node(base / "all", gpud_h100())
        every.change(dropins={**every.machine.dropins, "90-fm.conf": "FABRIC_MANAGER=yes\n"})  # systemctl asked too
        hang(every, "nvidia-smi", "systemctl", "scontrol")
        rows.append(("nvidia-smi, systemctl, scontrol hung",) + seconds(every, 1))
    reference = rows[0][1]
    print(f"{'case':<40} {'seconds':>8} {'x reference':>12} {'of 60 s':>8} {'exit':>5}")
    for name, secs, rc in rows:
        print(f"{name:<40} {secs:>8.2f} {secs / reference:>12.1f} {secs / SLURMD_LIMIT:>7.0%} {rc:>5}")


if __name__ == "__main__":
    main()
