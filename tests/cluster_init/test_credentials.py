"""Registry credentials: a root-only master file, a Slurm prolog that hands each job's user a
private copy where enroot.conf points ENROOT_CONFIG_PATH, and secrets that never reach a log,
stdout, stderr or a command line."""

from __future__ import annotations

import os
import subprocess

from tests.cluster_init.node import Node

SECRET = "nvapi-Zx9Secret0Value"
CREDENTIALS = (f"machine nvcr.io login $oauthtoken password {SECRET}; "
               f"machine authn.nvidia.com login $oauthtoken password {SECRET}")
NETRC = (f"machine nvcr.io login $oauthtoken password {SECRET}\n"
         f"machine authn.nvidia.com login $oauthtoken password {SECRET}\n")
PROLOG = "/etc/slurm/prolog.d/60-lingjun-enroot-credentials.sh"


def assert_secret_kept(node: Node, *results: subprocess.CompletedProcess[str]) -> None:
    for result in results:
        assert SECRET not in result.stdout + result.stderr
    assert SECRET not in node.log()
    assert SECRET not in "\n".join(node.calls())


def run_prolog(node: Node, uid: int, gid: int) -> subprocess.CompletedProcess[str]:
    env = node.env({"SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(gid), "SLURM_JOB_USER": "someone"})
    return subprocess.run(["bash", str(node.path(PROLOG))], env=env, capture_output=True, text=True, timeout=30)


def test_credentials_from_jetpack(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS})
    first = node.run("execute")
    assert first.returncode == 0, first.stderr
    assert "lingjun_slurm.enroot.credentials = <set>" in first.stdout
    assert node.mode("/etc/lingjun-slurm/enroot/credentials") == 0o600
    assert node.mode("/etc/lingjun-slurm/enroot") == 0o700
    assert node.path("/etc/lingjun-slurm/enroot/credentials").read_text() == NETRC
    assert node.mode("/run/lingjun-slurm/enroot-config/0/.credentials") == 0o600
    assert node.mode(PROLOG) == 0o755
    assert "ENROOT_CONFIG_PATH /run/lingjun-slurm/enroot-config/$(id -u)\n" in \
        node.path("/etc/enroot/enroot.conf").read_text()
    second = node.run("execute")
    assert second.returncode == 0 and "0 change(s)" in second.stdout
    assert_secret_kept(node, first, second)


def test_prolog_gives_the_job_user_a_private_copy(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS})
    assert node.run("execute").returncode == 0
    uid, gid = os.getuid(), os.getgid()
    user_uid = uid if uid != 0 else 4242
    result = run_prolog(node, user_uid, gid if uid != 0 else 4242)
    assert result.returncode == 0 and result.stdout == result.stderr == ""
    copy = node.path(f"/run/lingjun-slurm/enroot-config/{user_uid}/.credentials")
    assert copy.read_text() == NETRC
    assert copy.stat().st_mode & 0o777 == 0o600 and copy.stat().st_uid == user_uid
    assert copy.parent.stat().st_mode & 0o777 == 0o700 and copy.parent.stat().st_uid == user_uid
    assert run_prolog(node, user_uid, gid).returncode == 0, "runs again for the user's next job"
    assert copy.read_text() == NETRC


def test_prolog_never_fails_a_job(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS})
    assert node.run("execute").returncode == 0
    assert run_prolog(node, 0, 0).returncode == 0
    assert not node.path("/run/lingjun-slurm/enroot-config/0/.credentials.tmp").exists()
    env = node.env()
    env.pop("SLURM_JOB_UID", None)
    assert subprocess.run(["bash", str(node.path(PROLOG))], env=env, capture_output=True).returncode == 0
    node.path("/etc/lingjun-slurm/enroot/credentials").unlink()
    assert run_prolog(node, 4243, 4243).returncode == 0
    assert not node.path("/run/lingjun-slurm/enroot-config/4243").exists()


def test_credentials_file_in_config_file_mode(make_node):
    node = make_node(config={"lingjun_slurm.nccl.profile": "lingjun",
                             "lingjun_slurm.enroot.credentials_file": "/root/registry.netrc"})
    netrc = node.path("/root/registry.netrc")
    netrc.parent.mkdir(parents=True)
    netrc.write_text("# site registry\n\n" + NETRC)
    result = node.run("execute", mode="file")
    assert result.returncode == 0, result.stderr
    assert node.path("/etc/lingjun-slurm/enroot/credentials").read_text() == NETRC
    assert_secret_kept(node, result)


def test_malformed_entry_is_named_by_position_only(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": f"machine nvcr.io login $oauthtoken password {SECRET};"
                                                                    f" machine registry.local {SECRET}"})
    result = node.run("execute")
    assert result.returncode == 2
    assert 'lingjun_slurm.enroot.credentials: entry 2 is not "machine HOST login USER password SECRET"' in result.stderr
    assert_secret_kept(node, result)
    assert not node.path("/etc/enroot/enroot.conf").exists(), "checked before any change"


def test_both_sources_is_an_error(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS,
                             "lingjun_slurm.enroot.credentials_file": "/root/registry.netrc"})
    result = node.run("execute")
    assert result.returncode == 2
    assert "not both" in result.stderr
    assert_secret_kept(node, result)


def test_removing_credentials_removes_the_copies(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS})
    assert node.run("execute").returncode == 0
    del node.config["lingjun_slurm.enroot.credentials"]
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert not node.path("/etc/lingjun-slurm/enroot/credentials").exists()
    assert not node.path("/run/lingjun-slurm/enroot-config/0/.credentials").exists()
    assert "ENROOT_CONFIG_PATH" not in node.path("/etc/enroot/enroot.conf").read_text()


def test_warns_when_slurm_runs_no_prolog_dir(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS})
    conf = node.path("/etc/slurm/slurm.conf")
    conf.write_text(conf.read_text().replace("Prolog=/etc/slurm/prolog.d/*\n", ""))
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert "slurm.conf has no Prolog=/etc/slurm/prolog.d/*" in result.stderr


def test_no_tracing_even_under_bash_x(make_node):
    node = make_node(config={"lingjun_slurm.enroot.credentials": CREDENTIALS})
    script = node.project / "specs/default/cluster-init/files/install.sh"
    node.write_jetpack()
    result = subprocess.run(["bash", "-x", str(script), "--role", "execute"], env=node.env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert_secret_kept(node, result)
