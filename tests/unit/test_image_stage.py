"""The image stage and its cache (issue 12 item 1) with the enroot 4.x/3.x stand-in
(tests/fixtures/standins/enroot): one import per digest, atomic, concurrent runs wait, partial
files never used, unsafe caches refused, `image list|prune`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lingjun_slurm.cli.main import main
from lingjun_slurm.images.cache import CacheError, ImageCache, check_owner
from tests.standins import REGISTRY, imports, standin_env

IMAGE = "reg.example#team/img:1"
DIGEST = REGISTRY[IMAGE]["amd64"]


def write_plan(run_dir: Path, cache: Path, image: str = IMAGE) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = run_dir / "plan.json"
    plan.write_text(json.dumps({"schema": 1, "settings": {"container": {
        "image": image, "cache_dir": str(cache), "arch": None}}}))
    return plan


def run_stage(plan: Path, env: dict[str, str], extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lingjun_slurm.stages", "image", "--plan", str(plan)],
                          env={**os.environ, **env, **(extra or {})}, capture_output=True, text=True, timeout=120)


def cli_rc(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return standin_env(tmp_path)


def test_stage_imports_once_and_records_the_sqsh(tmp_path: Path, env: dict[str, str]) -> None:
    cache = tmp_path / "cache"
    for run in ("r1", "r2"):
        proc = run_stage(write_plan(tmp_path / run, cache), env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(imports(env)) == 1 and f"@{DIGEST}" in imports(env)[0]
    sqsh = cache / f"sha256-{DIGEST.split(':')[1]}.sqsh"
    for run in ("r1", "r2"):
        assert (tmp_path / run / "image" / "sqsh").read_text() == f"{sqsh}\n"
        assert (tmp_path / run / "image" / "digest").read_text() == f"{DIGEST}\n"
    assert "reusing" in proc.stdout
    assert oct(cache.stat().st_mode & 0o777) == "0o700"


def test_a_new_digest_is_imported_again(tmp_path: Path, env: dict[str, str]) -> None:
    cache = tmp_path / "cache"
    assert run_stage(write_plan(tmp_path / "r1", cache), env).returncode == 0
    moved = {**REGISTRY, IMAGE: REGISTRY["reg.example#team/img:2"]}  # the tag was pushed again
    Path(env["STANDIN_REGISTRY"]).write_text(json.dumps(moved))
    assert run_stage(write_plan(tmp_path / "r2", cache), env).returncode == 0
    assert len(imports(env)) == 2
    assert len(list(cache.glob("sha256-*.sqsh"))) == 2


def test_enroot_3_resolves_the_digest_from_the_registry(tmp_path: Path, env: dict[str, str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """enroot 3.x has no `digest` and no @sha256 URIs: the stage asks the registry and imports the digest
    as the tag (3.x fetches manifests/<tag> as given)."""
    import lingjun_slurm.injob.stages.image as stage

    calls = []
    monkeypatch.setattr(stage, "resolve_digest",
                        lambda ref, arch=None, environ=None: calls.append((ref, environ)) or DIGEST)
    monkeypatch.setenv("STANDIN_ENROOT_VERSION", "3.5.0")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # The request is made with enroot's own settings: enroot.conf's ENROOT_ALLOW_HTTP counts.
    conf = tmp_path / "enroot.conf"
    conf.write_text("ENROOT_ALLOW_HTTP yes\n")
    monkeypatch.setattr(stage.enroot, "config_file", lambda exe="enroot": conf)
    plan = write_plan(tmp_path / "r1", tmp_path / "cache")
    assert stage.main(json.loads(plan.read_text()), plan) == 0
    assert calls and calls[0][0].repository == "team/img"
    assert calls[0][1]["ENROOT_ALLOW_HTTP"] == "yes"
    assert len(imports(env)) == 1 and f"docker://reg.example#team/img:{DIGEST} " in imports(env)[0] + " "


@pytest.mark.parametrize("version", ["4.1.2", "3.5.0"])
def test_a_docker_style_reference_is_imported_from_its_registry(tmp_path: Path, env: dict[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """`reg.example/team/img:1` (issue 25: real enroot 4.1.2 imports REGISTRY/IMAGE) names the same image as
    `reg.example#team/img:1`: the stage parses it as enroot 4.x does (images/reference.py) and imports enroot's
    own '#' form, which enroot 3.x reads too (v3.5.0 src/docker.sh:259-272), so staging works on both."""
    import lingjun_slurm.injob.stages.image as stage

    monkeypatch.setattr(stage, "resolve_digest", lambda ref, arch=None, environ=None: DIGEST)  # 3.x asks the registry
    monkeypatch.setenv("STANDIN_ENROOT_VERSION", version)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    plan = write_plan(tmp_path / "r1", tmp_path / "cache", image="reg.example/team/img:1")
    assert stage.main(json.loads(plan.read_text()), plan) == 0
    assert (tmp_path / "r1" / "image" / "digest").read_text() == f"{DIGEST}\n"
    (uri,) = [line.split()[1] for line in imports(env)]
    assert uri.startswith("docker://reg.example#team/img") and DIGEST in uri


def test_a_failed_import_leaves_nothing_usable(tmp_path: Path, env: dict[str, str]) -> None:
    cache = tmp_path / "cache"
    proc = run_stage(write_plan(tmp_path / "r1", cache), env, {"STANDIN_IMPORT_FAIL": "1"})
    assert proc.returncode == 1 and "lingjun-slurm: image:" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(cache.glob("sha256-*.sqsh")) and not list(cache.glob(".import-*"))
    assert not (tmp_path / "r1" / "image").exists()
    assert run_stage(write_plan(tmp_path / "r1", cache), env).returncode == 0  # the retry imports cleanly


def test_concurrent_runs_wait_instead_of_importing_twice(tmp_path: Path, env: dict[str, str]) -> None:
    cache = tmp_path / "cache"
    slow = {"STANDIN_IMPORT_DELAY": "1.5"}
    results: dict[str, subprocess.CompletedProcess] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, run_stage(write_plan(tmp_path / r, cache),
                                                                                    env, slow)))
               for r in ("a", "b", "c")]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(120)
    assert all(p.returncode == 0 for p in results.values()), {r: p.stderr for r, p in results.items()}
    assert len(imports(env)) == 1
    assert sum("waiting for pid" in p.stdout for p in results.values()) >= 1


def test_a_partial_file_is_never_used(tmp_path: Path) -> None:
    cache = ImageCache(tmp_path / "cache")

    def importer(out: str) -> None:
        Path(out).write_bytes(b"hsq")  # cut short
        raise OSError("connection reset")

    with pytest.raises(OSError):
        cache.stage(IMAGE, DIGEST, importer)
    assert cache.lookup(DIGEST) is None and cache.entries() == [] and cache.partials() == []
    with pytest.raises(CacheError, match="no squashfs"):
        cache.stage(IMAGE, DIGEST, lambda out: Path(out).write_bytes(b"<html>error page</html>"))
    assert cache.lookup(DIGEST) is None


def test_a_cache_others_can_write_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CacheError, match="writable by others"):
        check_owner(shared)
    proc = run_stage(write_plan(tmp_path / "r1", shared), env)
    assert proc.returncode == 1 and "writable by others" in proc.stderr and not imports(env)
    shared.chmod(0o755)
    assert run_stage(write_plan(tmp_path / "r1", shared), env).returncode == 0
    sqsh = next(shared.glob("sha256-*.sqsh"))
    sqsh.chmod(0o666)
    proc = run_stage(write_plan(tmp_path / "r2", shared), env)
    assert proc.returncode == 1 and "writable by others" in proc.stderr


def test_someone_elses_cache_is_refused(tmp_path: Path) -> None:
    """Owned by another user (not root): their squashfs would run as you."""
    (tmp_path / "c").mkdir(mode=0o755)
    if os.getuid() == 0:
        os.chown(tmp_path / "c", 12345, -1)
        uid = 0
    else:
        uid = os.getuid() + 1  # the directory is ours: judge it as another user would
    with pytest.raises(CacheError, match="belongs to uid"):
        check_owner(tmp_path / "c", uid=uid if uid else None)


def test_image_list_and_prune(tmp_path: Path, env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    assert run_stage(write_plan(tmp_path / "r1", cache), env).returncode == 0
    assert cli_rc(["image", "list", "--cache-dir", str(cache), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [i["digest"] for i in listed["images"]] == [DIGEST] and listed["images"][0]["image"] == IMAGE
    assert cli_rc(["image", "prune", "--cache-dir", str(cache)]) == 0
    assert "freed 0 B" in capsys.readouterr().out and len(list(cache.glob("*.sqsh"))) == 1  # used today
    assert cli_rc(["image", "prune", "--cache-dir", str(cache), "--digest", DIGEST, "--dry-run"]) == 0
    assert "would remove" in capsys.readouterr().out and len(list(cache.glob("*.sqsh"))) == 1
    assert cli_rc(["image", "prune", "--cache-dir", str(cache), "--older-than", "0"]) == 0
    assert "removed " + DIGEST in capsys.readouterr().out and not list(cache.glob("*.sqsh"))
    assert cli_rc(["image", "prune", "--cache-dir", str(cache), "--digest", "sha256:" + "0" * 64]) == 2


def test_the_stage_names_what_is_missing(tmp_path: Path, env: dict[str, str]) -> None:
    plan = tmp_path / "r" / "plan.json"
    plan.parent.mkdir()
    plan.write_text(json.dumps({"schema": 1, "settings": {"container": None}}))
    proc = run_stage(plan, env)
    assert proc.returncode == 1 and "names no image" in proc.stderr
    proc = run_stage(write_plan(tmp_path / "r2", tmp_path / "cache", image="reg.example#team/nosuch:1"), env)
    assert proc.returncode == 1 and "nosuch" in proc.stderr and "Traceback" not in proc.stderr
