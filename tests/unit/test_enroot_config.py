"""enroot.conf applied as enroot's config::init does (lingjun_slurm/images/enroot.py environment),
for the image stage's own digest request on enroot 3.x: on the real enroot 3.5.0, ENROOT_ALLOW_HTTP
in enroot.conf was ignored by that request (tests/fixtures/real_pyxis_enroot/SOURCES.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lingjun_slurm.images import enroot
from lingjun_slurm.images.registry import allow_http, credentials_path


def test_enroot_conf_and_its_dropins_fill_what_the_environment_leaves_unset(tmp_path: Path) -> None:
    conf = tmp_path / "enroot.conf"
    conf.write_text("# site settings\nENROOT_ALLOW_HTTP yes\nENROOT_CONFIG_PATH ${HOME}/.config/enroot-site\n"
                    "NOT_ENROOT x\nhttps_proxy=http://127.0.0.1:3128\nENROOT_DATA_PATH \"/tmp/enroot-data/$(id -u)\"\n")
    (tmp_path / "enroot.conf.d").mkdir()
    (tmp_path / "enroot.conf.d" / "10-a.conf").write_text("ENROOT_ALLOW_HTTP no\nENROOT_TEMP_PATH /scratch\n")
    env = enroot.environment({"HOME": "/home/u", "PATH": "/bin"}, conf)
    assert env["ENROOT_ALLOW_HTTP"] == "yes"  # the first file that sets it wins (config::export)
    assert allow_http(env)
    assert env["ENROOT_CONFIG_PATH"] == "/home/u/.config/enroot-site"
    assert credentials_path(env) == Path("/home/u/.config/enroot-site/.credentials")
    assert env["https_proxy"] == "http://127.0.0.1:3128" and "NOT_ENROOT" not in env
    assert env["ENROOT_DATA_PATH"] == f"/tmp/enroot-data/{os.getuid()}"
    assert env["ENROOT_TEMP_PATH"] == "/scratch"


def test_the_environment_wins_and_no_is_off(tmp_path: Path) -> None:
    conf = tmp_path / "enroot.conf"
    conf.write_text("ENROOT_ALLOW_HTTP yes\n")
    assert not allow_http(enroot.environment({"ENROOT_ALLOW_HTTP": "no"}, conf))
    assert allow_http(enroot.environment({"ENROOT_ALLOW_HTTP": ""}, conf))  # empty is unset to config::export
    conf.write_text("ENROOT_ALLOW_HTTP no\n")
    assert not allow_http(enroot.environment({}, conf))


def test_what_read_would_not_see_and_unknown_substitutions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "enroot.conf"
    conf.write_text("ENROOT_CACHE_PATH $(hostname)/cache\nENROOT_ALLOW_HTTP yes")  # no final newline
    env = enroot.environment({}, conf)
    assert "ENROOT_CACHE_PATH" not in env and "ENROOT_ALLOW_HTTP" not in env
    assert f"{conf}:1: ENROOT_CACHE_PATH's value cannot be evaluated" in capsys.readouterr().err
    assert enroot.environment({}, tmp_path / "absent.conf") == {}


def test_the_conf_file_is_the_one_the_enroot_on_path_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "bin" / "enroot"
    exe.parent.mkdir()
    exe.write_text('#!/usr/bin/env bash\nset -euo pipefail\nconfig::init "/opt/enroot/etc/enroot/enroot.conf"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(exe.parent))
    assert enroot.config_file() == Path("/opt/enroot/etc/enroot/enroot.conf")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert enroot.config_file() == Path("/etc/enroot/enroot.conf")
