"""`lingjun-slurm doctor` without a cluster: which image the checks run in, what the job asks for,
that hostile spec values stay quoted in its script, and the CLI's errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lingjun_slurm import doctor
from lingjun_slurm.common.errors import SpecError, UsageError
from lingjun_slurm.plan import build_plan
from lingjun_slurm.common.shell import Shell
from lingjun_slurm.spec import parse_spec
from lingjun_slurm.transport import LocalTransport
from tests.unit.clirun import run_cli
from tests.unit.test_hostile import BASE, hostile_values, make_stubs, set_path, string_paths

REGISTRY_IMAGE = "nvcr.io#nvidia/pytorch:25.04-py3"


def spec_doc(workdir: Path, **container: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["run"] = {"name": "doc", "workdir": str(workdir)}
    doc["checkpoint"] = {"dir": str(workdir / "ckpt")}
    doc["container"] = {"image": REGISTRY_IMAGE, "mounts": [f"{workdir}:{workdir}"], "name": "ctr", **container}
    return doc


def loaded_spec(doc: dict[str, Any], source: str = "doc.yaml") -> Any:
    return parse_spec(yaml.safe_dump(doc, sort_keys=False), source)


def fake_run(workdir: Path, run_id: str, created: float, image: str = REGISTRY_IMAGE, digest: str = "ab",
             cache: Path | None = None, write_sqsh: bool = True) -> Path:
    """What a submitted run whose image stage ran leaves in the workdir."""
    cache = cache or workdir / "images"
    sqsh = cache / f"sha256-{digest * 32}.sqsh"
    if write_sqsh:
        cache.mkdir(parents=True, exist_ok=True)
        sqsh.write_bytes(b"hsqs")
    run_dir = workdir / "runs" / run_id
    (run_dir / "image").mkdir(parents=True)
    (run_dir / "image" / "sqsh").write_text(f"{sqsh}\n")
    (run_dir / "plan.json").write_text(json.dumps({"settings": {"container": {"image": image}}}))
    (run_dir / "manifest.json").write_text(json.dumps({"created_at": created}))
    return sqsh


# ----------------------------------------------------------------------------------- the image
def test_the_newest_run_of_the_spec_gives_its_staged_image(tmp_path: Path) -> None:
    loaded = loaded_spec(spec_doc(tmp_path))
    fake_run(tmp_path, "doc-old", 100.0, digest="aa")
    newest = fake_run(tmp_path, "doc-new", 300.0, digest="bb")
    fake_run(tmp_path, "other-image", 500.0, image="nvcr.io#nvidia/other:1", digest="cc")
    choice = doctor.choose_image(LocalTransport(), loaded.spec)
    assert (choice.image, choice.source, choice.note) == (str(newest), "run doc-new", None)


def test_a_pruned_image_or_one_outside_the_cache_is_not_used(tmp_path: Path) -> None:
    loaded = loaded_spec(spec_doc(tmp_path))
    fake_run(tmp_path, "doc-pruned", 300.0, digest="bb", write_sqsh=False)
    fake_run(tmp_path, "doc-elsewhere", 200.0, digest="cc", cache=tmp_path / "elsewhere")
    choice = doctor.choose_image(LocalTransport(), loaded.spec)
    assert choice.image is None and choice.source == "unstaged"
    assert choice.note == (f"no staged image for {REGISTRY_IMAGE}: checking the nodes without the container; "
                           "submit the run first to check the image too")


def test_the_cache_record_of_the_image_is_used_when_no_run_has_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    loaded = loaded_spec(spec_doc(tmp_path, cache_dir=str(cache)))
    cache.mkdir()
    for digest, image, used in (("aa", REGISTRY_IMAGE, 10.0), ("bb", REGISTRY_IMAGE, 20.0), ("cc", "x#y:1", 30.0)):
        (cache / f"sha256-{digest * 32}.sqsh").write_bytes(b"hsqs")
        (cache / f"sha256-{digest * 32}.json").write_text(json.dumps({"image": image, "last_used": used}))
    choice = doctor.choose_image(LocalTransport(), loaded.spec)
    assert (choice.image, choice.source) == (str(cache / f"sha256-{'bb' * 32}.sqsh"), "cache")


def test_a_squashfs_spec_image_is_used_as_it_is_and_no_container_means_the_hosts(tmp_path: Path) -> None:
    sqsh = loaded_spec(spec_doc(tmp_path, image="/shared/images/x.sqsh"))
    assert doctor.choose_image(LocalTransport(), sqsh.spec) == doctor.ImageChoice(
        "/shared/images/x.sqsh", "spec", "/shared/images/x.sqsh")
    doc = spec_doc(tmp_path)
    doc["container"] = {"runtime": "none"}
    doc["training"]["entrypoint"] = "builtin"
    del doc["training"]["extra_args"]
    none = loaded_spec(doc)
    assert doctor.choose_image(LocalTransport(), none.spec) == doctor.ImageChoice(None, "none")


# ----------------------------------------------------------------------------------- the job
def test_the_job_asks_for_the_train_stage_less_requeue_signal_and_dependency(tmp_path: Path) -> None:
    loaded = loaded_spec(spec_doc(tmp_path))
    sqsh = fake_run(tmp_path, "doc-1", 1.0)
    job = doctor.prepare(loaded, run_id="doc-doctor-1", choice=doctor.choose_image(LocalTransport(), loaded.spec),
                         reproduce="lingjun-slurm doctor doc.yaml")
    train = dict(build_plan(loaded.spec).stage("train").sbatch)
    opts = dict(job.stage.sbatch)
    assert {"requeue", "signal", "kill-on-invalid-dep"} <= set(train) and not {"requeue", "signal",
                                                                                  "kill-on-invalid-dep"} & set(opts)
    assert opts.pop("no-requeue") is None and opts.pop("job-name") == "doc-doctor-1-doctor"
    assert opts.pop("time") == "00:15:00" and train["time"] == "01:00:00"
    assert {k: v for k, v in train.items() if k in opts} == opts  # nodes, gpus, partition, account, extras...
    assert opts["nodes"] == "2" and opts["gpus-per-node"] == "2" and opts["account"] == "acct"
    words = [w.expr if isinstance(w, Shell) else w for w in job.stage.launcher]
    assert f"--container-image={sqsh}" in words and not [w for w in words if w.startswith("--container-name")]
    assert words[:5] == ["srun", '--ntasks="${SLURM_JOB_NUM_NODES:-1}"', "--ntasks-per-node=1", "--kill-on-bad-exit=0",
                         "--time=10"]
    assert "LINGJUN_SITE" in next(w for w in words if w.startswith("--container-env="))
    plan = json.loads(job.files["plan.json"])
    assert [s["kind"] for s in plan["stages"]].count("train") == 1 and plan["settings"]["training"]["preflight"]
    assert job.run_dir == f"{tmp_path}/runs/doc-doctor-1"
    assert job.verdict_dir("7") == f"{tmp_path}/runs/doc-doctor-1/preflight/7-0"


def test_a_shorter_train_time_limit_is_kept_and_the_hosts_get_the_host_side_checkpoint_dir(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path)
    doc["cluster"]["defaults"]["time"] = "00:05:00"
    doc["container"]["mounts"] = [f"{tmp_path}:{tmp_path}", f"{tmp_path}/host-ckpt:/ckpt"]
    doc["checkpoint"] = {"dir": "/ckpt/run"}
    loaded = loaded_spec(doc)
    job = doctor.prepare(loaded, run_id="d", choice=doctor.ImageChoice(None, "unstaged"), reproduce="x")
    assert dict(job.stage.sbatch)["time"] == "00:05:00"
    assert not [w for w in job.stage.launcher if "container" in str(w)]
    assert json.loads(job.files["plan.json"])["checkpoint_dir"] == f"{tmp_path}/host-ckpt/run"


def test_a_skipped_train_stage_is_refused_naming_its_line(tmp_path: Path) -> None:
    doc = spec_doc(tmp_path)
    doc["stages"]["train"] = {"skip": True}
    doc["stages"]["commands"] = []
    text = yaml.safe_dump(doc, sort_keys=False)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip() == "skip: true")
    with pytest.raises(UsageError) as info:
        doctor.prepare(parse_spec(text, "doc.yaml"), run_id="d", choice=doctor.ImageChoice(None, "none"),
                       reproduce="x")
    assert str(info.value).startswith(f"doc.yaml:{line}: stages.train.skip: ") and "\n" not in str(info.value)


def test_hostile_spec_values_stay_quoted_in_the_doctor_script(tmp_path: Path) -> None:
    """Every string field that accepts a hostile value gets it at once (as tests/unit/test_hostile.py
    does for the chain); the doctor's script, run with srun/scontrol/python3 stubbed, runs no
    injected command and hands the values to python3 literally. The image choice, a path read from
    the cluster, is quoted the same way."""
    import os
    import subprocess

    marker = tmp_path / "PWNED"
    values = hostile_values(marker)
    make_stubs(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "STUB_LOG": str(tmp_path / "stub.log"),
           "STUB_ARGV": str(tmp_path / "argv.log"), "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1",
           "SLURM_JOB_NUM_NODES": "1", "HOME": str(tmp_path)}
    fields = string_paths(BASE)
    rendered = 0
    for i, value in enumerate(values):
        spec = copy.deepcopy(BASE)
        taken = 0
        for loc in fields:
            trial = copy.deepcopy(spec)
            set_path(trial, loc, value)
            try:
                parse_spec(yaml.safe_dump(trial), "hostile.yaml")
            except SpecError:
                continue
            spec, taken = trial, taken + 1
        assert taken >= 5, (value, taken)
        loaded = parse_spec(yaml.safe_dump(spec), "hostile.yaml")
        for choice in (doctor.ImageChoice(f"/w/images/{value}.sqsh", "cache"), doctor.ImageChoice(None, "unstaged")):
            job = doctor.prepare(loaded, run_id=f"h-doctor-{i}", choice=choice, reproduce=f"lingjun-slurm doctor {value}")
            out = tmp_path / f"run{i}-{rendered}"
            out.mkdir()
            for name, text in job.files.items():
                (out / name).write_text(text)
            proc = subprocess.run(["bash", str(out / doctor.SCRIPT)], cwd=tmp_path, capture_output=True, text=True,
                                  env={**env, "LINGJUN_RUN_DIR": str(out)}, timeout=60)
            rendered += 1
            assert not marker.exists(), f"injected command ran for value {value!r}: {proc.stdout}{proc.stderr}"
            assert proc.returncode == 0, (value, proc.stdout, proc.stderr)
            assert "lingjun-slurm: doctor: verdict 0" in proc.stdout
            if choice.image:
                assert f"in the image {choice.image}\n" in proc.stdout  # the value, literally
    calls = [line.split("\0")[:-1] for line in (tmp_path / "argv.log").read_text().splitlines() if line]
    nodes = [c for c in calls if c[:4] == ["-m", "lingjun_slurm.stages", "preflight", "--plan"]]
    judges = [c for c in calls if c[:3] == ["-m", "lingjun_slurm.stages", "preflight-judge"]]
    assert len(nodes) == len(judges) == rendered == 2 * len(values)
    assert all(c[-2] == "--out" and c[-1].endswith("/preflight/4242-0") for c in nodes)


# ----------------------------------------------------------------------------------- output
VERDICT = {"schema": 1, "ok": False, "exit": 1, "job": "7", "restart": "0", "nodes": ["n1", "n2", "n3"],
           "bad_nodes": {"n2": "eth0 down (NCCL_SOCKET_IFNAME=eth0) (+1 more)"},
           "reasons": {"n2": [{"check": "socket-if", "reason": "eth0 down (NCCL_SOCKET_IFNAME=eth0)"},
                              {"check": "gpu-count", "reason": "7 GPUs, expected 8"}]},
           "problems": [], "skew_s": 0.01}


def test_the_judges_lines_and_a_summary(tmp_path: Path) -> None:
    loaded = loaded_spec(spec_doc(tmp_path))
    job = doctor.prepare(loaded, run_id="d", choice=doctor.ImageChoice(None, "unstaged"), reproduce="x")
    assert doctor.verdict_lines(VERDICT) == ["lingjun-slurm: preflight: node n2: eth0 down (NCCL_SOCKET_IFNAME=eth0) "
                                             "(+1 more)", "    gpu-count: 7 GPUs, expected 8"]
    assert doctor.summary(VERDICT, job, "7").startswith("doctor: 1 of 3 nodes failed: n2 (exit 1: exclude them, "
                                                        "e.g. sbatch --exclude=n2); job 7, on the hosts")
    ok = {**VERDICT, "ok": True, "exit": 0, "bad_nodes": {}, "reasons": {}}
    assert doctor.verdict_lines(ok) == ["lingjun-slurm: preflight: 3 nodes passed (clocks within 0.01 s)"]
    wide = {**ok, "ok": False, "exit": 2, "problems": ["gpu-count fails on 3 of 3 nodes"]}
    assert doctor.verdict_lines(wide) == ["lingjun-slurm: preflight: gpu-count fails on 3 of 3 nodes"]
    assert doctor.summary(wide, job, "7").startswith("doctor: a problem of the whole job")


def test_read_verdict_takes_only_a_judges_verdict(tmp_path: Path) -> None:
    loaded = loaded_spec(spec_doc(tmp_path))
    job = doctor.prepare(loaded, run_id="d", choice=doctor.ImageChoice(None, "unstaged"), reproduce="x")
    t = LocalTransport()
    assert doctor.read_verdict(t, job, "7") is None
    folder = Path(job.verdict_dir("7"))
    folder.mkdir(parents=True)
    (folder / "verdict.json").write_text("{not json")
    assert doctor.read_verdict(t, job, "7") is None
    (folder / "verdict.json").write_text(json.dumps(VERDICT))
    assert doctor.read_verdict(t, job, "7") == VERDICT


# ----------------------------------------------------------------------------------- the CLI
def test_cli_errors_are_one_line_with_the_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrun: {name: x, workdir: relative}\n")
    code, out, err = run_cli(capsys, "doctor", str(bad))
    assert code == 2 and f"{bad}:2: run.workdir" in err and not out
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(spec_doc(tmp_path)))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    code, out, err = run_cli(capsys, "doctor", str(good))
    assert code == 1 and err.strip() == ("sbatch is not on the PATH of this machine: doctor submits a Slurm job; "
                                         "use --host [USER@]HOST or --cluster NAME")
    assert not (tmp_path / "runs").exists()


def test_doctor_shows_a_late_node_that_passed_as_the_judge_prints_it() -> None:
    """A node whose container started late (verdict["late"], preflight/judge.py) and passed gets
    the judge's line in doctor's output too; a late node that failed shows only its failure."""
    from lingjun_slurm.doctor import verdict_lines

    lines = verdict_lines({"ok": True, "nodes": ["n1", "n2"], "bad_nodes": {}, "problems": [],
                           "late": {"n2": 90.0}, "skew_s": 0.1})
    assert any("node n2 started 90 s after the first node" in line for line in lines), lines
    lines = verdict_lines({"ok": False, "nodes": ["n1", "n2"], "bad_nodes": {"n2": "shared-dir: x"},
                           "problems": [], "late": {"n2": 90.0}})
    assert not any("started 90 s" in line for line in lines), lines
