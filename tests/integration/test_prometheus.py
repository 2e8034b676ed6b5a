"""Metrics for Prometheus, end to end with the real tools (issue 30 item 2; docs/monitoring.md): Debian's
prometheus-node-exporter with only the textfile collector on a directory of the test's own, Debian's
prometheus scraping it every second on 127.0.0.1 with a config of the test's own, and a training run
(builtin trainer, CPU) on the test Slurm cluster with monitoring.textfile_dir set to that directory.
Prometheus's HTTP API (/api/v1/query) must have the loss series with the run's label, the values the
trainer wrote to metrics.jsonl, the watchdog's state series, all from one file per job and node
(lingjun-slurm_<job>_<node>.prom, node_exporter's node_textfile_mtime_seconds{file=...}) that
node_exporter never failed to parse, and the job's file must be gone at its end.

Skipped when the binaries are absent, except under CI (the env var CI set), where that fails:
.ci/run installs them (apt-get install prometheus prometheus-node-exporter)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from .faults import records, train_spec
from .helpers import all_ended, cli, status, submitted_run_id

NODE_EXPORTER = ("prometheus-node-exporter", "node_exporter")  # Debian's name, upstream's name
PROMETHEUS = ("prometheus",)


def _binary(names: tuple[str, ...]) -> Optional[str]:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _need(names: tuple[str, ...], package: str) -> str:
    found = _binary(names)
    if found:
        return found
    why = f"{' / '.join(names)} not found (Debian package {package})"
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must install it (.ci/run)")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - 127.0.0.1 only
        return resp.read()


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            _get(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in {timeout} s: {log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Stack:
    def __init__(self, textfile_dir: Path, node_exporter_url: str, prometheus_url: str) -> None:
        self.textfile_dir, self.node_exporter_url, self.prometheus_url = textfile_dir, node_exporter_url, prometheus_url

    def query_range(self, promql: str, start: float, end: float) -> list[dict[str, Any]]:
        body = json.loads(_get(f"{self.prometheus_url}/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "1"})))
        assert body["status"] == "success", (promql, body)
        return list(body["data"]["result"])

    def query(self, promql: str) -> list[dict[str, Any]]:
        body = json.loads(_get(f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
        assert body["status"] == "success", body
        return list(body["data"]["result"])


@pytest.fixture
def prometheus_stack(tmp_path: Path) -> Iterator[Stack]:
    node_exporter = _need(NODE_EXPORTER, "prometheus-node-exporter")
    prometheus = _need(PROMETHEUS, "prometheus")
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    textfile_dir.chmod(0o1777)  # as cluster-init sets it up: every job's user writes its own files
    ne_port, prom_port = _free_port(), _free_port()
    ne_log, prom_log = tmp_path / "node_exporter.log", tmp_path / "prometheus.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # node_exporter 1.5.0 flags (Debian 12): only the textfile collector, on our directory.
        with open(ne_log, "wb") as out:
            procs.append(subprocess.Popen(
                [node_exporter, "--collector.disable-defaults", "--collector.textfile",
                 f"--collector.textfile.directory={textfile_dir}", f"--web.listen-address=127.0.0.1:{ne_port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        ne_url = f"http://127.0.0.1:{ne_port}"
        _wait_http(f"{ne_url}/metrics", procs[0], ne_log)
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{ne_port}"]}]}]}))
        with open(prom_log, "wb") as out:
            procs.append(subprocess.Popen(
                [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path))
        prom_url = f"http://127.0.0.1:{prom_port}"
        _wait_http(f"{prom_url}/-/ready", procs[1], prom_log)
        yield Stack(textfile_dir, ne_url, prom_url)
    finally:
        for proc in reversed(procs):
            _stop(proc)


def _series_values(result: list[dict[str, Any]]) -> list[float]:
    return [float(v) for r in result for _, v in r["values"]]


@pytest.mark.slurm
def test_the_loss_series_reaches_prometheus_through_node_exporter(tmp_path: Path, slurm_cluster: Any,
                                                                  prometheus_stack: Stack) -> None:
    stack = prometheus_stack
    env = {**slurm_cluster.env, "LINGJUN_STATE_DIR": str(tmp_path / "state")}
    spec = train_spec(tmp_path, "prom", nodes=1, iterations=120, save_interval=40, hang_timeout=60, preflight=False)
    doc = yaml.safe_load(spec.read_text())
    doc["monitoring"] = {"textfile_dir": str(stack.textfile_dir)}
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    submitted = time.time()
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "slurm", env=env).stdout)
    run_dir = tmp_path / "prom" / "runs" / run_id

    # While the run trains: node_exporter serves the job's one file (what Prometheus scrapes).
    seen_files: set[str] = set()
    deadline = time.time() + 600
    stages: dict[str, Any] = {}
    while time.time() < deadline:
        seen_files |= {p.name for p in stack.textfile_dir.glob("*.prom")}
        stages = status(run_id, env)
        if all_ended(stages):
            break
        time.sleep(0.5)
    assert stages and stages["train"]["state"] == "COMPLETED", stages
    time.sleep(3)  # one more scrape (1 s) after the file went

    trained = [r for r in records(run_dir) if r["type"] == "train"]
    assert trained and trained[-1]["iteration"] == 120
    job = json.loads((run_dir / "manifest.json").read_text())
    job_id = next(s for s in job["stages"] if s["name"] == "train")["job_ids"][0]
    from lingjun_slurm.injob.host.promfile import file_name

    state = stack.query(f'lingjun_watchdog_state{{run="{run_id}",state="training"}}[15m]')
    assert state and 1.0 in _series_values(state), state
    # One file per job and node, the watchdog's (its node label: the batch host), the trainer's series in it.
    one = file_name(job_id, state[0]["metric"]["node"])
    assert seen_files == {one}, seen_files
    served = {r["metric"]["file"] for r in stack.query("node_textfile_mtime_seconds[15m]")}  # file: the path
    assert served == {str(stack.textfile_dir / one)}, served
    errors = _series_values(stack.query("node_textfile_scrape_error[15m]"))
    assert errors and max(errors) == 0, errors  # the merged file parsed at every scrape

    loss = stack.query(f'lingjun_train_loss{{run="{run_id}"}}[15m]')
    assert loss, (stack.query('{__name__=~"lingjun_.*"}'), seen_files)
    labels = loss[0]["metric"]
    assert labels["run"] == run_id and labels["stage"] == "train" and labels["slurm_job"] == job_id, labels
    assert labels["rank"] == "0" and labels["node"], labels
    losses = {round(r["loss"], 9) for r in trained}
    values = _series_values(loss)
    assert values and all(round(v, 9) in losses for v in values), (values[:5], sorted(losses)[:5])
    iterations = _series_values(stack.query(f'lingjun_train_iteration{{run="{run_id}"}}[15m]'))
    assert iterations and max(iterations) <= 120 and iterations == sorted(iterations), iterations
    # The watchdog's goodput buckets of this job so far (ledger.job_buckets): every bucket, some time in one.
    from lingjun_slurm.injob.host.ledger import BUCKETS

    goodput = stack.query(f'max_over_time(lingjun_goodput_seconds{{run="{run_id}"}}[15m])')
    by_bucket = {r["metric"]["bucket"]: float(r["value"][1]) for r in goodput}
    assert set(by_bucket) == set(BUCKETS) and sum(by_bucket.values()) > 0, by_bucket

    # The Grafana dashboard's queries (docs/grafana/lingjun-slurm.json) run on this Prometheus, and each
    # panel a CPU run of the builtin trainer has numbers for shows them.
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "docs" / "grafana" / "lingjun-slurm.json").read_text())
    no_data_on_cpu = {"MFU", "TFLOP/s per GPU", "GPU memory peak"}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            result = stack.query_range(target["expr"].replace("$run", run_id), submitted, time.time())
            if panel["title"] not in no_data_on_cpu:
                assert result, (panel["title"], target["expr"])

    # At the job's end its file is gone (temporary files included), and with it the series (no sample
    # in the last scrape), and so are rank 0's staged samples in the run directory, which the watchdog
    # merged into the file (no container mount of the directory: docs/monitoring.md).
    assert not list(stack.textfile_dir.iterdir()), list(stack.textfile_dir.iterdir())
    assert (run_dir / "textfile").is_dir() and not list((run_dir / "textfile").iterdir())
    assert stack.query(f'lingjun_train_loss{{run="{run_id}"}}') == []
    scrape = _get(f"{stack.node_exporter_url}/metrics").decode()
    assert "node_textfile_scrape_error 0" in scrape, scrape[-2000:]
