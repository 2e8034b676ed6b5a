"""`lingjun-slurm nccl-test` without a cluster: usage errors (exit 2, naming the option), --render-only,
--report, the rendered script run with srun stubbed, hostile strings, and what the command imports."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit import clirun
from tests.unit.test_nccltests_report import need_matplotlib

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "fixtures" / "nccl" / "standin"
FIXTURES = REPO / "tests" / "fixtures" / "nccl"
# srun: drop its own options, then run the task for real as rank 0 of 1; scontrol: one node.
STUBS = {
    "srun": 'while [ "$#" -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done\n'
            'SLURM_PROCID=0 SLURM_NTASKS=1 exec "$@"\n',
    "scontrol": 'case "$1 $2" in\n  "show hostnames") echo node1 ;;\nesac\n',
}


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    return clirun.run_cli(capsys, "nccl-test", *args)


def render(capsys: pytest.CaptureFixture[str], outdir: Path, *args: str) -> Path:
    code, out, err = run_cli(capsys, "--render-only", str(outdir), *args)
    assert code == 0, err
    assert f"submit with: cd {outdir} && sbatch nccl-test.sbatch" in out
    return outdir / "nccl-test.sbatch"


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    bindir = tmp_path / "stubbin"
    bindir.mkdir()
    for name, body in STUBS.items():
        path = bindir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bindir


def run_script(script: Path, bindir: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
            "SLURM_JOB_NODELIST": "node1", "LINGJUN_RUN_DIR": str(cwd), **env}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=full, capture_output=True, text=True, timeout=60)


BASE = ["--profile", "tcp", "--nodes", "2", "--gpus-per-node", "0", "--no-container", "--tests-dir", str(STANDIN)]


@pytest.mark.parametrize("args, option", [
    ([], "--profile NAME or --instance-type TYPE"),
    (["--profile", "nope"], "unknown network profile 'nope'"),
    (["--profile", "tcp", "--instance-type", "Standard_ND96isr_H100_v5"], "--instance-type"),
    (["--profile", "tcp", "--time", "soon"], "--time:"),
    (["--profile", "tcp", "--min-bytes", "1.5G"], "--min-bytes:"),
    (["--profile", "tcp", "--min-bytes", "2G", "--max-bytes", "1G"], "--min-bytes 2147483648 is larger"),
    (["--profile", "tcp", "--ops", "all_reduce,bogus"], "--ops: unknown test(s) bogus"),
    (["--profile", "tcp", "--bisect"], "--render-only writes the script and exits: it takes no --outdir"),
    (["--profile", "tcp", "--image", "localhost/nccl:1"], "--image 'localhost/nccl:1'"),
    (["--profile", "tcp", "--partition", "gpu;rm -rf /"], "--partition 'gpu;rm -rf /'"),
    (["--profile", "tcp", "--account", "a b"], "--account 'a b'"),
    (["--profile", "tcp", "--job-name", "x/y"], "--job-name 'x/y'"),
    (["--profile", "tcp", "--nodes", "0"], "--nodes 0"),
    (["--profile", "tcp", "--mpi", "pmix;x"], "--mpi 'pmix;x'"),
    (["--profile", "tcp", "--mount", "/a b:/c"], "--mount '/a b:/c'"),
    (["--profile", "tcp", "--tests-dir", "relative/dir"], "--tests-dir 'relative/dir'"),
    (["--profile", "tcp", "--expect", "all_reduce=fast"], "--expect:"),
    (["--profile", "tcp", "--no-container", "--image", "nvcr.io#nvidia/pytorch:25.06-py3"], "--no-container"),
    (["--profile", "tcp", "--set", "NOEQUALS"], "--set 'NOEQUALS'"),
    (["--profile", "tcp", "--step-factor", "1"], "--step-factor 1"),
    (["--report"], "--report needs"),
    (["--report", "/nonexistent/run"], "--report: no such file or directory: /nonexistent/run"),
    (["--profile", "tcp", "--expect", "all_reduce=300@16G", "--max-bytes", "8G"],
     "--expect all_reduce=300@16G: 16 GiB is not measured: --min-bytes 8, --max-bytes 8G and --step-factor 2"),
    (["--profile", "tcp", "--expect", "all_reduce=300@16G", "--min-bytes", "3"], "16 GiB is not measured"),
    (["--profile", "tcp", "--expect", "broadcast=30"], "--expect broadcast=...: broadcast is not tested"),
    (["stray.txt"], "files are read only with --report"),
])
def test_bad_input_exits_2_and_names_the_option(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  args: list[str], option: str) -> None:
    code, out, err = run_cli(capsys, "--render-only", str(tmp_path / "r"), *args) if "--report" not in args \
        and "stray.txt" not in args else run_cli(capsys, *args)
    assert code == 2, (out, err)
    assert option in err and "Traceback" not in err
    assert not (tmp_path / "r" / "nccl-test.sbatch").exists()


def test_bisect_needs_a_node_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--profile", "tcp", "--bisect", "--outdir", str(tmp_path / "b"))
    assert code == 2 and "--bisect needs --nodelist" in err and not (tmp_path / "b").exists()
    # --no-wait would be ignored: the command would wait for every round anyway.
    code, _, err = run_cli(capsys, "--profile", "tcp", "--bisect", "--nodelist", "n[1-4]", "--no-wait",
                           "--outdir", str(tmp_path / "b"))
    assert code == 2 and "--bisect takes no --no-wait" in err and not (tmp_path / "b").exists()


def test_outdir_with_unquotable_characters_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "--render-only", str(tmp_path / "a b"), "--profile", "tcp")
    assert code == 2 and "--outdir" in err


def test_render_only_writes_the_script_and_submits_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no scontrol: nothing can be submitted
    script = render(capsys, tmp_path / "out", "--profile", "azure-nd-h100-v5", "--nodelist", "gpu[01-04]")
    text = script.read_text()
    assert "#SBATCH --nodelist=gpu[01-04]" in text and "#SBATCH --nodes" not in text  # Slurm counts the list
    assert "NCCL_TOPO_FILE=/opt/microsoft/ndv5-topo.xml" in text
    assert "--container-image=nvcr.io#nvidia/pytorch:25.06-py3" in text
    assert os.access(script, os.X_OK) and sorted(p.name for p in script.parent.iterdir()) == ["nccl-test.sbatch"]


def test_script_runs_the_tests_writes_text_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   stubs: Path) -> None:
    out = tmp_path / "out"
    script = render(capsys, out, *BASE, "--min-bytes", "1G")
    proc = run_script(script, stubs, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["all_gather.json", "all_gather.txt", "all_reduce.json",
                                                     "all_reduce.txt", "jobs", "nccl-test.sbatch"]
    assert "Avg bus bandwidth" in (out / "all_reduce.txt").read_text()
    assert json.loads((out / "all_reduce.json").read_text())["results"][0]["size"] == 1 << 30
    assert "end " in (out / "jobs" / "77").read_text()  # the prelude's end marker
    # Then the report reads the JSON, with the text kept beside it.
    code, text, _ = run_cli(capsys, "--report", str(out), "--no-chart", "--expect", "all_reduce=330@8G")
    assert code == 0 and "all_reduce: PASS: busbw 338.09 GB/s at 8 GiB >= 330 GB/s" in text


def test_a_build_without_dash_j_is_rerun_for_text_only(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                      stubs: Path) -> None:
    out = tmp_path / "out"
    script = render(capsys, out, *BASE, "--ops", "all_reduce")
    proc = run_script(script, stubs, out, NCCL_STANDIN_NO_JSON="1")
    assert proc.returncode == 0, proc.stderr
    assert "this nccl-tests build has no -J (JSON output); running all_reduce again without it" in proc.stdout
    assert not (out / "all_reduce.json").exists()
    text = (out / "all_reduce.txt").read_text()
    assert "USAGE" not in text and "Avg bus bandwidth" in text


def test_the_mpi_build_is_preferred_and_a_missing_binary_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                               stubs: Path) -> None:
    bins = tmp_path / "bins"
    bins.mkdir()
    for name, word in (("all_reduce_perf_mpi", "MPI-BUILD"), ("all_reduce_perf", "PLAIN-BUILD")):
        (bins / name).write_text(f"#!/bin/bash\necho {word} \"$@\"\n")
        (bins / name).chmod(0o755)
    out = tmp_path / "out"
    script = render(capsys, out, "--profile", "tcp", "--no-container", "--tests-dir", str(bins), "--ops",
                    "all_reduce,all_gather")
    proc = run_script(script, stubs, out)
    assert "MPI-BUILD -b 8 -e 16G -f 2 -g 1 -n 20 -w 5 -J" in (out / "all_reduce.txt").read_text()
    assert proc.returncode == 1  # all_gather has no binary: the job fails, after trying all_reduce
    assert f"neither all_gather_perf_mpi nor all_gather_perf in {bins}" in proc.stdout
    assert "lingjun-slurm: all_gather failed (exit 127)" in proc.stderr


def hostile(marker: Path) -> list[str]:
    m = str(marker)
    return [f"/x$(touch {m})", f"/x`touch {m}`", f"/x'; touch {m}; '", f'/x"; touch {m}; "', f"/x\ntouch {m}\n",
            f"/x {m} * ? [a] ~ ${{HOME}} #"]


@pytest.mark.parametrize("option", ["--image", "--tests-dir", "--partition", "--account", "--qos", "--job-name",
                                    "--nodelist", "--mount", "--mpi", "--set", "--set-name", "--unset", "--ops",
                                    "--expect", "--outdir"])
def test_hostile_strings_never_run(capsys: pytest.CaptureFixture[str], tmp_path: Path, stubs: Path,
                                   option: str) -> None:
    marker = tmp_path / "PWNED"
    for i, value in enumerate(hostile(marker)):
        out = tmp_path / f"out{i}"
        args = ["--profile", "tcp", "--gpus-per-node", "0", "--nodes", "1"]
        if option == "--set":
            args += ["--set", f"NCCL_ALGO={value}"]
        elif option == "--set-name":  # the name lands on an `export NAME=...` line and in --container-env
            args += ["--set", f"NCCL{value}=1"]
        elif option == "--mount":
            args += ["--mount", f"{value}:/data"]
        elif option == "--outdir":
            out = Path(value)
        else:
            args += [option, value]
        if option not in ("--image", "--mount"):
            args += ["--no-container"]
        code, _, err = run_cli(capsys, "--render-only", str(out), *args)
        if code:
            flag = "--set" if option == "--set-name" else option
            assert code == 2 and (flag in err or "--render-only" in err or "--outdir" in err), err
            continue
        proc = run_script(out / "nccl-test.sbatch", stubs, tmp_path)
        assert not marker.exists(), f"{option} {value!r} ran: {proc.stdout}{proc.stderr}"
        if option == "--tests-dir":  # accepted, quoted: the task looked for the binaries in that very directory
            assert f"in {value} on" in proc.stdout or "neither" in proc.stdout
    assert not marker.exists()


def test_the_command_imports_neither_torch_nor_numpy(tmp_path: Path) -> None:
    code = f"""
import sys
from lingjun_slurm.cli.main import main
for args in (["nccl-test", "--help"], ["nccl-test", "--render-only", {str(tmp_path / 'o')!r}, "--profile", "lingjun"],
             ["nccl-test", "--report", {str(FIXTURES / 'h100_a3mega_all_reduce.txt')!r}, "--no-chart",
              "--report-json", {str(tmp_path / 'report.json')!r}]):
    try:
        main(args)
    except SystemExit as exc:
        assert not exc.code, (args, exc.code)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron", "numpy", "matplotlib"))
print("HEAVY", heavy)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in proc.stdout, proc.stdout


def test_report_mode_verdicts_and_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    need_matplotlib()
    reduce_txt = str(FIXTURES / "h100_a3mega_all_reduce.txt")
    code, out, _ = run_cli(capsys, "--report", reduce_txt, "--expect", "all_reduce=400", "--chart",
                           str(tmp_path / "c.png"), "--report-json", str(tmp_path / "r.json"))
    assert code == 1 and "all_reduce: FAIL: busbw 338.82 GB/s peak < 400 GB/s" in out
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG" and f"chart: {tmp_path / 'c.png'}" in out
    assert f"report.json: {tmp_path / 'r.json'}" in out and json.loads((tmp_path / "r.json").read_text())["ok"] is False
    code, out, _ = run_cli(capsys, "--report", reduce_txt, "--profile", "lingjun", "--json", "--no-chart",
                           "--report-json", str(tmp_path / "r.json"))
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["ops"][0]["verdict"] == "NONE"
    assert json.loads((tmp_path / "r.json").read_text()) == doc  # --json prints what report.json holds


def test_render_only_counts_the_node_list_with_scontrol_when_it_can(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    scontrol = bindir / "scontrol"
    scontrol.write_text('#!/bin/bash\n[ "$1 $2 $3" = "show hostnames gpu[1-3]" ] && printf "gpu1\\ngpu2\\ngpu3\\n"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    text = render(capsys, tmp_path / "a", "--profile", "tcp", "--nodelist", "gpu[1-3]").read_text()
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --nodelist=gpu[1-3]\n" in text
    code, _, err = run_cli(capsys, "--render-only", str(tmp_path / "b"), "--profile", "tcp", "--nodelist", "gpu[1-3]",
                           "--nodes", "2")
    assert code == 2 and "--nodes 2 but --nodelist 'gpu[1-3]' has 3 node(s)" in err
    # scontrol failing (no Slurm configuration here): rendering goes on without a count, and says so.
    code, _, err = run_cli(capsys, "--render-only", str(tmp_path / "c"), "--profile", "tcp", "--nodelist", "x[1-2]")
    assert code == 0 and "warning: --nodelist 'x[1-2]': scontrol show hostnames failed" in err
    assert "#SBATCH --nodes" not in (tmp_path / "c" / "nccl-test.sbatch").read_text()


def test_bisect_refuses_an_expect_it_cannot_measure(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Every pair would read "not measured": all nodes undetermined after a full set of jobs.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text('#!/bin/bash\nprintf "gpu1\\ngpu2\\ngpu3\\ngpu4\\n"\n')
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    base = ["--profile", "tcp", "--nodelist", "gpu[1-4]", "--bisect", "--no-chart", "--outdir", str(tmp_path / "b")]
    code, _, err = run_cli(capsys, *base, "--expect", "all_reduce=300@16G", "--max-bytes", "1G")
    assert code == 2 and "16 GiB is not measured" in err and not (tmp_path / "b").exists()
    code, _, err = run_cli(capsys, *base, "--expect", "all_gather=300")
    assert code == 2 and "all_gather is not tested (the tests run: all_reduce)" in err


def test_a_chart_that_cannot_be_written_does_not_lose_the_report(capsys: pytest.CaptureFixture[str],
                                                                 tmp_path: Path) -> None:
    need_matplotlib()
    (tmp_path / "afile").write_text("")  # the chart's directory cannot be created, even by root
    code, out, err = run_cli(capsys, "--report", str(FIXTURES / "h100_a3mega_all_reduce.txt"), "--expect",
                             "all_reduce=300", "--chart", str(tmp_path / "afile" / "c.png"),
                             "--report-json", str(tmp_path / "r.json"))
    assert code == 0 and "all_reduce: PASS: busbw 338.82 GB/s peak >= 300 GB/s" in out and "chart:" not in out
    assert "warning: no chart: cannot write the chart" in err and "internal error" not in err


def test_reporting_on_a_run_directory_again_keeps_its_job_ends(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """A run's own report.json lists its Slurm jobs; --report on that directory rewrites report.json
    from the outputs but keeps the job ends, so a job that failed still fails the report."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "all_reduce.txt").write_bytes((FIXTURES / "h100_a3mega_all_reduce.txt").read_bytes())
    job = {"job_id": "41", "state": "NODE_FAIL", "exit_code": 1, "reason": "node h7 failed", "nodes": "h[7-8]"}
    (run / "report.json").write_text(json.dumps({"schema": 2, "jobs": [job], "ops": []}))
    code, out, _ = run_cli(capsys, "--report", str(run), "--no-chart", "--json")
    doc = json.loads((run / "report.json").read_text())
    assert code == 1 and doc["jobs"] == [job] and doc["ok"] is False and json.loads(out) == doc
    assert doc["ops"] and doc["ops"][0]["op"] == "all_reduce"
