"""Files for node_exporter's textfile collector (lingjun_slurm/injob/host/promfile.py): one per job and
node, written by the watchdog (injob/host/watchdog.py Exporter) with the samples the trainer's rank 0
stages (injob/train/metrics.py PromFile), and the train script's part (slurm_templates/train.sbatch.j2,
partials/prelude.sh.j2). The real node_exporter and Prometheus read them in
tests/integration/test_prometheus.py. Megatron-LM lines:
tests/fixtures/megatron_logs/SOURCES.md (recorded: NVIDIA/Megatron-LM#756), plus report_memory's
line built from its format string (megatron/training/utils.py core_v0.16.1:279-291)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm.injob.host import promfile, watchdog

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT / "tests" / "fixtures" / "megatron_logs"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$')


def parse(text: str) -> dict[str, dict[str, Any]]:
    """The exposition format's sample lines (exposition_formats.md): name{labels} value, nothing after
    the value (a timestamp would be a third token: node_exporter skips such a file whole). As the text
    parser node_exporter v1.5.0 uses (prometheus/common expfmt/text_parse.go at v0.37.0, readingHelp
    :496 and readingType :511), a second HELP or TYPE line for a name, or a TYPE after its samples, is
    an error (node_exporter then skips the whole file); so is one series twice (the registry's
    "was collected before")."""
    assert text.endswith("\n")
    out: dict[str, dict[str, Any]] = {}
    helps: set[str] = set()
    types: set[str] = set()
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.match(r"^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) ", line)
            assert m, line
            seen = helps if m.group(1) == "HELP" else types
            assert m.group(2) not in seen, f"second {m.group(1)} line for metric name {m.group(2)!r}"
            assert m.group(1) == "HELP" or not any(v["name"] == m.group(2) for v in out.values()), \
                f"TYPE reported after samples: {m.group(2)}"
            seen.add(m.group(2))
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line without a timestamp: {line!r}"
        key = m.group(1) + (m.group(2) or "")
        assert key not in out, f"{key} twice"
        out[key] = {"name": m.group(1), "value": float(m.group(3))}
    return out


def test_label_values_and_help_are_escaped_as_the_format_says() -> None:
    assert promfile.escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    assert promfile.escape_help('x\\y"z\nw') == 'x\\\\y"z\\nw'  # HELP: backslash and line feed only
    text = promfile.render([("lingjun_train_loss", {"run": 'r"1\\\n'}, 2.5)])
    assert 'lingjun_train_loss{run="r\\"1\\\\\\n"} 2.5\n' in text
    parse(text)


def test_values_nan_inf_ints_floats() -> None:
    assert [promfile.format_value(v) for v in (3, 0.1, 1e-05, float("nan"), float("inf"), float("-inf"))] == \
        ["3", "0.1", "1e-05", "NaN", "+Inf", "-Inf"]
    with pytest.raises(promfile.PromError):
        promfile.format_value(True)


def test_render_help_and_type_once_no_timestamps_none_left_out() -> None:
    text = promfile.render([("lingjun_goodput_seconds", {"bucket": "productive"}, 10.0),
                            ("lingjun_goodput_seconds", {"bucket": "startup"}, 2.0),
                            ("lingjun_train_loss", {}, None)])
    assert text.count("# HELP lingjun_goodput_seconds ") == 1 and text.count("# TYPE lingjun_goodput_seconds gauge") == 1
    assert text.index("# TYPE") < text.index("lingjun_goodput_seconds{")
    assert "lingjun_train_loss" not in text
    assert set(parse(text)) == {'lingjun_goodput_seconds{bucket="productive"}', 'lingjun_goodput_seconds{bucket="startup"}'}


@pytest.mark.parametrize("samples", [
    [("lingjun_train_loss", {}, 1.0), ("lingjun_train_loss", {}, 2.0)],  # one series twice
    [("bad-name", {}, 1.0)],
    [("lingjun_train_loss", {"__reserved": "x"}, 1.0)],
    [("lingjun_train_loss", {"bad-label": "x"}, 1.0)],
])
def test_render_refuses_what_the_collector_would_not_take(samples: list[Any]) -> None:
    with pytest.raises(promfile.PromError):
        promfile.render(samples)


def test_write_is_a_rename_of_a_file_the_collector_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary file's name does not end in .prom (textfile.go reads only *.prom), the final file is
    0644 (node_exporter is another user), and a failed write leaves neither."""
    renames: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        renames.append((src, dst))
        assert not src.endswith(".prom") and Path(src).read_text().endswith("\n")
        real(src, dst)

    monkeypatch.setattr(promfile.os, "replace", spy)
    w = promfile.Writer(str(tmp_path), "12_3", "node/1", {"run": "r"})
    assert Path(w.path).name == "lingjun-slurm_12-3_node-1.prom"
    assert w.write([("lingjun_train_iteration", {}, 5)])
    assert renames and str(renames[0][1]) == w.path
    # the name remove_textfiles (partials/prelude.sh.j2) globs for a killed writer's leftovers
    assert fnmatch.fnmatchcase(Path(renames[0][0]).name, f".{Path(w.path).name}.*.tmp"), renames
    assert stat.S_IMODE(os.stat(w.path).st_mode) == 0o644
    assert os.listdir(tmp_path) == [Path(w.path).name]
    assert not w.write([("lingjun_train_iteration", {}, 5), ("lingjun_train_iteration", {}, 6)])  # said, not raised
    assert os.listdir(tmp_path) == [Path(w.path).name]
    w.remove()
    assert os.listdir(tmp_path) == []


def _exporter(tmp_path: Path, fmt: str, seq: Any = None) -> watchdog.Exporter:
    return watchdog.Exporter(str(tmp_path), fmt, "run-1", "train", "77", "n1", None, seq, clock=lambda: 1000.0)


def _feed(ex: watchdog.Exporter, lines: list[str], wall: Any = 990.0) -> None:
    for line in lines:
        ex.feed(line, watchdog.parse_megatron(line), wall)


def test_watchdog_derives_megatron_numbers_from_recorded_log_lines(tmp_path: Path) -> None:
    """NVIDIA/Megatron-LM#756's lines: iteration 73, lm loss 1.798953E+00, learning rate 1.460000E-05,
    5829.9 ms, 224.0 TFLOP/s/GPU, global batch 128; with --seq-length 4096, tokens/s = 128 x 4096 / 5.8299."""
    ex = _exporter(tmp_path, "megatron", 4096)
    _feed(ex, (LOGS / "megatron-lm-756-mixtral.log").read_text().splitlines()[:3])
    state = watchdog.State(60.0, 600.0, 1, started=0.0)
    state.feed(watchdog.Event("iteration", 73, 5.8299), 0.0, 990.0)
    ex.write(state, 4.0)
    got = parse(Path(ex.writer.path).read_text())
    base = 'node="n1",run="run-1",slurm_job="77",stage="train"'
    assert got[f"lingjun_train_iteration{{{base}}}"]["value"] == 73
    assert got[f"lingjun_train_loss{{{base}}}"]["value"] == pytest.approx(1.798953)
    assert got[f"lingjun_train_learning_rate{{{base}}}"]["value"] == pytest.approx(1.46e-05)
    assert got[f"lingjun_train_step_seconds{{{base}}}"]["value"] == pytest.approx(5.8299)
    assert got[f"lingjun_train_tflops_per_gpu{{{base}}}"]["value"] == pytest.approx(224.0)
    assert got[f"lingjun_train_tokens_per_second{{{base}}}"]["value"] == pytest.approx(128 * 4096 / 5.8299)
    assert got[f'lingjun_watchdog_state{{{base},state="training"}}']["value"] == 1
    assert got[f'lingjun_watchdog_state{{{base},state="hang"}}']["value"] == 0
    assert got[f"lingjun_watchdog_idle_seconds{{{base}}}"]["value"] == 4.0


def test_watchdog_checkpoint_and_memory_from_megatron_lines(tmp_path: Path) -> None:
    ex = _exporter(tmp_path, "megatron")
    fmt = (LOGS / "format-core_v0.16.1-and-main.log").read_text().splitlines()
    ex.feed(fmt[1], watchdog.parse_megatron(fmt[1]), None)  # an earlier attempt's save: time unknown
    # report_memory's format (utils.py core_v0.16.1:283-291), rank 3's line
    mem = "[Rank 3] (after 10 iterations) memory (MB) | allocated: 1024.00 | max allocated: 2048.50 | reserved: 3000.00"
    _feed(ex, [mem])
    state = watchdog.State(60.0, 600.0, 1, started=0.0)
    ex.write(state, 1.0)
    got = parse(Path(ex.writer.path).read_text())
    assert got['lingjun_checkpoint_iteration{node="n1",run="run-1",slurm_job="77",stage="train"}']["value"] == 100
    assert not any(k.startswith("lingjun_checkpoint_age_seconds") for k in got)
    assert got['lingjun_train_memory_peak_bytes{node="n1",rank="3",run="run-1",slurm_job="77",stage="train"}'][
        "value"] == 2048.5 * 1024 * 1024
    assert got['lingjun_watchdog_state{node="n1",run="run-1",slurm_job="77",stage="train",state="startup"}'][
        "value"] == 1
    _feed(ex, [fmt[1]], wall=940.0)  # a save seen now: its age is known
    ex.write(state, 1.0, hang=True)
    got = parse(Path(ex.writer.path).read_text())
    assert got['lingjun_checkpoint_age_seconds{node="n1",run="run-1",slurm_job="77",stage="train"}']["value"] == 60
    assert got['lingjun_watchdog_state{node="n1",run="run-1",slurm_job="77",stage="train",state="hang"}'][
        "value"] == 1


def test_watchdog_builtin_writes_no_training_series_the_trainer_writes(tmp_path: Path) -> None:
    """The builtin trainer's rank 0 writes those: the same series in two files is a duplicate the
    collector's registry rejects (seen with node_exporter 1.5.0: "was collected before")."""
    ex = _exporter(tmp_path, "builtin")
    for line in ('{"type": "train", "iteration": 4, "loss": 3.0, "step_time_s": 0.1}',
                 '{"type": "save", "iteration": 4, "time": 950.0, "seconds": 0.2}'):
        ex.feed(line, watchdog.parse_builtin(line), 990.0)
    ex.write(watchdog.State(60.0, 600.0, 1, started=0.0), 1.0)
    got = parse(Path(ex.writer.path).read_text())
    assert not any(k.startswith("lingjun_train_") or k.startswith("lingjun_checkpoint_iteration") for k in got), got
    assert got['lingjun_checkpoint_age_seconds{node="n1",run="run-1",slurm_job="77",stage="train"}']["value"] == 50


def test_watchdog_goodput_series_from_the_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.injob.host import ledger

    calls: list[tuple[str, str, float]] = []

    def fake(run_dir: str, job_id: str, now: float) -> dict[str, float]:
        calls.append((run_dir, job_id, now))
        return {**dict.fromkeys(ledger.BUCKETS, 0.0), "productive": 12.5}

    monkeypatch.setattr(ledger, "job_buckets", fake)
    ex = watchdog.Exporter(str(tmp_path), "builtin", "run-1", "train", "77", "n1", str(tmp_path / "run"),
                           clock=lambda: 1000.0)
    ex.write(watchdog.State(60.0, 600.0, 1, started=0.0), 1.0)
    ex.write(watchdog.State(60.0, 600.0, 1, started=0.0), 2.0)  # within GOODPUT_EVERY_S: not read again
    assert calls == [(str(tmp_path / "run"), "77", 1000.0)]
    got = parse(Path(ex.writer.path).read_text())
    buckets = {k: v["value"] for k, v in got.items() if k.startswith("lingjun_goodput_seconds")}
    assert len(buckets) == len(ledger.BUCKETS)
    assert buckets['lingjun_goodput_seconds{bucket="productive",node="n1",run="run-1",slurm_job="77",stage="train"}'] \
        == 12.5


def test_trainer_rank0_stages_its_samples_and_removes_them_when_it_ends(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 stages samples (JSON, promfile.Stage) in <run_dir>/textfile, no .prom file of its own: the
    watchdog renders them into the job's one file (promfile.read_staged)."""
    from lingjun_slurm.injob.train import metrics

    out = tmp_path / "textfile"
    out.mkdir()
    monkeypatch.setenv(metrics.TEXTFILE_DIR_ENV, str(out))
    monkeypatch.setenv(metrics.TEXTFILE_JOB_ENV, "88")
    monkeypatch.setenv("SLURMD_NODENAME", "cpu-3")
    mx = metrics.Metrics(str(tmp_path / "run" / "metrics.jsonl"), "run-2", enabled=True, log_interval=1)
    mx._tb = None
    mx.train(10, iteration=1, loss=float("nan"), lr=1e-3, grad_norm=None, step_time_s=0.5, tokens_per_s=256.0,
             consumed_samples=4)
    mx.record("save", iteration=1, seconds=0.1, path="/ckpt")
    path = out / "lingjun-slurm_88_cpu-3.json"
    assert sorted(p.name for p in out.iterdir()) == [path.name]
    got = parse(promfile.render(promfile.read_staged(str(out), "88")))
    base = 'node="cpu-3",rank="0",run="run-2",slurm_job="88",stage="train"'
    assert got[f"lingjun_train_loss{{{base}}}"]["value"] != got[f"lingjun_train_loss{{{base}}}"]["value"]  # NaN
    assert got[f"lingjun_train_tokens_per_second{{{base}}}"]["value"] == 256
    assert got[f"lingjun_checkpoint_iteration{{{base}}}"]["value"] == 1
    assert f"lingjun_metrics_updated_timestamp_seconds{{{base}}}" in got
    assert f"lingjun_train_mfu_ratio{{{base}}}" not in got  # not measured (CPU): no sample, not a 0
    mx.close()
    assert not path.exists()
    assert promfile.read_staged(str(out), "88") == []


@pytest.mark.parametrize("content, why", [
    ("{", "not JSON"),
    ('{"samples": 3}', 'no "samples" list'),
    ('{"samples": [["lingjun_train_loss", {}]]}', "not a [name, labels, value] sample"),
    ('{"samples": [["node_load1", {}, 1]]}', "not a family of promfile.FAMILIES"),
    ('{"samples": [["lingjun_train_loss", {"rank": 0}, 1]]}', "must be strings"),
    ('{"samples": [["lingjun_train_loss", {}, "1"]]}', "not a number"),
])
def test_a_bad_staged_file_is_refused_naming_it(tmp_path: Path, content: str, why: str) -> None:
    (tmp_path / "lingjun-slurm_5_n1.json").write_text(content)
    with pytest.raises(promfile.PromError, match=re.escape(why)) as err:
        promfile.read_staged(str(tmp_path), "5")
    assert "lingjun-slurm_5_n1.json" in str(err.value)


def test_no_file_without_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lingjun_slurm.injob.train import metrics

    monkeypatch.delenv(metrics.TEXTFILE_DIR_ENV, raising=False)
    mx = metrics.Metrics(str(tmp_path / "metrics.jsonl"), "r", enabled=True, log_interval=1)
    assert mx.prom is None
    mx.close()


def _render(tmp_path: Path, textfile_dir: Any, executor: str) -> str:
    doc = yaml.safe_load((ROOT / "examples" / ("megatron-gpt.yaml" if executor == "slurm" else "tiny-gpt.yaml"))
                         .read_text())
    doc["run"]["workdir"] = str(tmp_path / "work")
    if textfile_dir:
        doc["monitoring"] = {"textfile_dir": textfile_dir}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli.main", "render", str(spec), "--stage", "train",
                           "--executor", executor], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_train_script_exports_the_directory_and_removes_the_jobs_files(tmp_path: Path, executor: str) -> None:
    script = _render(tmp_path, "/var/lib/prometheus/node-exporter", executor)
    assert "export LINGJUN_TEXTFILE_DIR LINGJUN_TEXTFILE_JOB LINGJUN_TEXTFILE_STAGE" in script
    assert 'LINGJUN_TEXTFILE_DIR="$RUN_DIR/textfile"' in script  # the trainer writes in the run directory
    body = script[script.index("marker_end() {"):]
    assert "remove_textfiles" in body[:body.index("\n}\n")]  # every way the job ends: EXIT, HUP, INT, TERM
    assert '--textfile-dir "$textfile_publish" --textfile-staging "$LINGJUN_TEXTFILE_DIR"' in script
    # No container mount of the directory: pyxis fails the step on a node where the source is
    # missing (NVIDIA/pyxis args.c:294 at v0.24.0); the watchdog publishes on the host instead.
    assert "/var/lib/prometheus/node-exporter:" not in script
    (tmp_path / "t.sh").write_text(script)
    if subprocess.run(["which", "shellcheck"], capture_output=True).returncode == 0:
        sc = subprocess.run(["shellcheck", str(tmp_path / "t.sh")], capture_output=True, text=True)
        assert sc.returncode == 0, sc.stdout


def test_train_script_without_the_directory_has_none_of_it(tmp_path: Path) -> None:
    script = _render(tmp_path, None, "slurm")
    assert "TEXTFILE" not in script and "textfile" not in script and "node-exporter" not in script


def test_the_container_mounts_no_textfile_directory(tmp_path: Path) -> None:
    """Turning metrics on adds no --container-mounts entry for the directory (a node without it would
    fail the containerised train step: pyxis's default flags for a path are x-create=auto,rbind, which
    creates only the target inside the container, NVIDIA/pyxis args.c:294 at v0.24.0)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_dir = [line for line in _render(tmp_path / "a", "/var/lib/prometheus/node-exporter-lingjun-slurm",
                                         "slurm").splitlines() if "--container-mounts=" in line]
    without = [line for line in _render(tmp_path / "b", None, "slurm").splitlines() if "--container-mounts=" in line]
    assert with_dir and [line.replace(str(tmp_path / "a"), "W") for line in with_dir] == \
        [line.replace(str(tmp_path / "b"), "W") for line in without]


def test_one_file_per_job_and_node_the_watchdog_merges_the_trainers_samples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30 item 2: one file per job and node, lingjun-slurm_<job>_<node>.prom, written only by the
    watchdog: its series and rank 0's staged ones in one text, each family with one HELP and one TYPE
    (lingjun_metrics_updated_timestamp_seconds is in both: two samples, rank="0" and none); without a
    staged file (not started, or stopped) its own series only."""
    from lingjun_slurm.injob.train import metrics

    staging, out = tmp_path / "run" / "textfile", tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv(metrics.TEXTFILE_DIR_ENV, str(staging))
    monkeypatch.setenv(metrics.TEXTFILE_JOB_ENV, "77")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    ex = watchdog.Exporter(str(out), "builtin", "run-1", "train", "77", "n1", None, None, clock=lambda: 1000.0,
                           staging=str(staging))
    state = watchdog.State(60.0, 600.0, 1, started=0.0)
    writes: list[str] = []
    real = promfile.write_atomic
    monkeypatch.setattr(promfile, "write_atomic", lambda path, text: (writes.append(path), real(path, text)))
    ex.write(state, 1.0)  # the trainer has not started: the watchdog's series only
    job_file = out / "lingjun-slurm_77_n1.prom"
    assert sorted(p.name for p in out.iterdir()) == [job_file.name]
    assert not any(k.startswith("lingjun_train_") for k in parse(job_file.read_text()))

    mx = metrics.Metrics(str(tmp_path / "run" / "metrics.jsonl"), "run-1", enabled=True, log_interval=1)
    mx._tb = None
    mx.train(10, iteration=3, loss=2.5, lr=1e-3, grad_norm=None, step_time_s=0.5, tokens_per_s=256.0,
             consumed_samples=4)
    mx.record("save", iteration=3, seconds=0.1, path="/ckpt")
    (staging / "lingjun-slurm_78_n1.json").write_text('{"samples": [["lingjun_train_loss", {}, 9]]}')  # another job's
    writes.clear()
    ex.write(state, 2.0)
    assert sorted(p.name for p in out.iterdir()) == [job_file.name]  # one file: not one per writer
    assert writes == [str(job_file)]  # written by the watchdog only, atomically
    text = job_file.read_text()
    got = parse(text)  # one HELP and one TYPE per family, as expfmt wants
    rank0 = 'node="n1",rank="0",run="run-1",slurm_job="77",stage="train"'
    own = 'node="n1",run="run-1",slurm_job="77",stage="train"'
    assert got[f"lingjun_train_loss{{{rank0}}}"]["value"] == 2.5
    assert got[f"lingjun_checkpoint_iteration{{{rank0}}}"]["value"] == 3
    assert got[f'lingjun_watchdog_state{{{own},state="startup"}}']["value"] == 1
    assert got[f"lingjun_metrics_updated_timestamp_seconds{{{own}}}"]["value"] == 1000.0
    assert f"lingjun_metrics_updated_timestamp_seconds{{{rank0}}}" in got
    assert text.count("# TYPE lingjun_metrics_updated_timestamp_seconds gauge\n") == 1
    assert 9.0 not in [v["value"] for v in got.values()]  # job 78's staged sample is not this job's

    mx.train(10, iteration=4, loss=2.25, lr=1e-3, grad_norm=None, step_time_s=0.5, tokens_per_s=256.0,
             consumed_samples=8)
    mx.prom.flush()
    ex.write(state, 3.0)
    assert parse(job_file.read_text())[f"lingjun_train_loss{{{rank0}}}"]["value"] == 2.25

    mx.close()  # the trainer stopped: its staged samples go, the watchdog's stay
    ex.write(state, 4.0)
    got = parse(job_file.read_text())
    assert not any(k.startswith("lingjun_train_") or "rank=" in k for k in got), got
    assert sorted(p.name for p in out.iterdir()) == [job_file.name]

    # A staged file that is not samples: said once, left out; the watchdog's series still go.
    (staging / "lingjun-slurm_77_n1.json").write_text("not json")
    ex.write(state, 5.0)
    ex.write(state, 6.0)
    assert capsys.readouterr().err.count("the trainer's staged series left out") == 1
    assert f'lingjun_watchdog_state{{{own},state="startup"}}' in parse(job_file.read_text())
    # One that clashes with the watchdog's own series: left out, said once.
    (staging / "lingjun-slurm_77_n1.json").write_text(json.dumps(
        {"samples": [["lingjun_watchdog_timeout_seconds", dict(x.split("=") for x in own.replace('"', "").split(",")),
                      1]]}))
    ex.write(state, 7.0)
    ex.write(state, 8.0)
    assert capsys.readouterr().err.count("the trainer's staged series left out of") == 1
    assert parse(job_file.read_text())[f"lingjun_watchdog_timeout_seconds{{{own}}}"]["value"] == \
        state.effective_timeout() != 1
    ex.remove()
    assert list(out.iterdir()) == []


def test_job_end_removes_the_jobs_files_and_a_killed_writers_temporary_files(tmp_path: Path) -> None:
    """remove_textfiles (partials/prelude.sh.j2), run by bash: the job's *.prom files, the hidden
    temporary file a writer killed between open and rename leaves (promfile.write_atomic's
    .<name>.<random>.tmp), and rank 0's staged samples (.json); another job's files stay."""
    out, run_dir = tmp_path / "tf", tmp_path / "run"
    (run_dir / "textfile").mkdir(parents=True)
    out.mkdir()
    script = _render(tmp_path, str(out), "slurm")
    func = script[script.index("remove_textfiles() {"):]
    func = func[:func.index("\n}\n") + 3]
    mine = [out / "lingjun-slurm_88_n1.prom", out / ".lingjun-slurm_88_n1.prom.k3j9x2ab.tmp",
            run_dir / "textfile" / "lingjun-slurm_88_n1.json",
            run_dir / "textfile" / ".lingjun-slurm_88_n1.json.a1b2c3d4.tmp"]
    others = [out / "lingjun-slurm_89_n1.prom", out / ".lingjun-slurm_89_n1.prom.zz99yy88.tmp",
              out / "node_exporter_collectors.prom", run_dir / "textfile" / "lingjun-slurm_89_n1.json",
              out / "lingjun-slurm_880_n1.prom"]
    for p in mine + others:
        p.write_text("x 1\n")
    proc = subprocess.run(["bash", "-c", f"set -eu\njob_key=88\nRUN_DIR={run_dir}\n{func}remove_textfiles"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in mine if p.exists()] == []
    assert all(p.exists() for p in others)
