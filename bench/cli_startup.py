"""Start-up time of the light CLI commands, as a ratio to a bare interpreter start.

    python bench/cli_startup.py [--repeat 20]

Prints the median wall time of `python -c pass` (the reference, measured in the same run)
and of `lingjun-slurm --help`, `validate` and `render` on the shipped example, each with
its ratio to the reference. No thresholds here: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "megatron-gpt.yaml"


def median_seconds(argv: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    opts = parser.parse_args()
    cli = [sys.executable, "-m", "lingjun_slurm.cli"]
    with tempfile.TemporaryDirectory() as out:
        cases = {
            "python -c pass (reference)": [sys.executable, "-c", "pass"],
            "lingjun-slurm --help": cli + ["--help"],
            "lingjun-slurm validate": cli + ["validate", str(EXAMPLE)],
            "lingjun-slurm render": cli + ["render", str(EXAMPLE), "-o", out],
        }
        ref = None
        print(f"{'command':<30} {'median ms':>10} {'x reference':>12}")
        for name, argv in cases.items():
            secs = median_seconds(argv, opts.repeat)
            ref = ref or secs
            print(f"{name:<30} {secs * 1000:>10.1f} {secs / ref:>12.2f}")


if __name__ == "__main__":
    main()
