"""Memory stays bounded when the input grows: peak memory of the whole process tree (stage + spawned
workers) on 5 MB and on 50 MB of jsonl, in one fresh interpreter (imports counted once).

Measured as PSS (proportional set size): plain RSS counts shared pages once per process, so a
child caught between fork and exec would appear to double the tree's memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    from pathlib import Path
    import psutil
    from lingjun_slurm.injob.stages import preprocess
    from tests.data.helpers import make_plan

    tmp = Path(sys.argv[1])
    def corpus(name, megabytes):
        # long zero-padded ids keep the null tokenizer cheap, so this measures the pipeline
        line = json.dumps({"text": " ".join("0" * 700 + str(i) for i in range(3))}) + "\\n"
        path = tmp / name
        with open(path, "w") as fh:
            for _ in range(megabytes * 1_000_000 // len(line) + 1):
                fh.write(line)
        return str(path)

    me = psutil.Process()
    def tree_rss():
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except psutil.Error:
                pass
        return total

    def peak_of(plan):
        peak, stop = [tree_rss()], threading.Event()
        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], tree_rss())
                time.sleep(0.01)
        t = threading.Thread(target=sample)
        t.start()
        assert preprocess.main(plan, 0) == 0
        stop.set()
        t.join()
        return peak[0]

    out = {}
    for name, mb in (("small", 5), ("large", 50)):
        plan = make_plan(tmp / name, {"type": "null", "vocab_size": 512}, ["text"],
                         inputs=[corpus(name + ".jsonl", mb)], workers=2)
        out[name] = peak_of(plan)
    print(json.dumps(out))
""")


def test_peak_memory_is_flat_when_the_input_grows_tenfold(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "LINGJUN_PROGRESS_INTERVAL_S": "60"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    peaks = json.loads(proc.stdout.strip().splitlines()[-1])
    grow_mb = (peaks["large"] - peaks["small"]) / 1e6
    # 45 MB more input; chunks in flight are ~1 MiB each, the index ~12 bytes per document
    assert grow_mb < 25, f"peak PSS grew by {grow_mb:.1f} MB for 45 MB more input: {peaks}"
