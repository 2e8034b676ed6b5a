"""Where artifacts come from: the project's files/artifacts/, a configured mirror (http:// on
127.0.0.1 or file://), the upstream URL of the pins file, the verified cache. Traffic never
leaves 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

from tests.cluster_init.node import enroot_files, write_pins


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


@pytest.fixture
def served(tmp_path, artifacts):
    """The dummy artifacts served over HTTP on 127.0.0.1 (an ephemeral port); yields (url, hits)."""
    root = tmp_path / "mirror"
    root.mkdir()
    for name, path in artifacts.items():
        (root / name).write_bytes(path.read_bytes())
    hits: list[str] = []

    class Handler(_Quiet):
        def do_GET(self) -> None:
            hits.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_air_gapped_from_a_mirror_url(make_node, served):
    url, hits = served
    node = make_node(artifacts_in_files=False, config={"lingjun_slurm.artifacts.url": url + "/"})
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert sorted(hits) == sorted(f"/{name}" for name in [*enroot_files("ubuntu"), "pyxis-0.24.0.tar.gz"])
    assert f"fetched pyxis-0.24.0.tar.gz from {url}/pyxis-0.24.0.tar.gz" in result.stdout
    assert node.run("execute").returncode == 0
    assert len(hits) == 3, "a second run needs nothing from the mirror"


def test_air_gapped_from_a_file_url(make_node, tmp_path, artifacts):
    mirror = tmp_path / "shared" / "lingjun-artifacts"
    mirror.mkdir(parents=True)
    for name, path in artifacts.items():
        (mirror / name).write_bytes(path.read_bytes())
    node = make_node("rhel", artifacts_in_files=False, config={"lingjun_slurm.artifacts.url": f"file://{mirror}"})
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert f"from file://{mirror}/{enroot_files('rhel')[1]}" in result.stdout


def test_upstream_url_when_not_offline(make_node, served):
    url, hits = served
    node = make_node(artifacts_in_files=False, upstream=url, config={"lingjun_slurm.artifacts.offline": "false"})
    result = node.run("login")
    assert result.returncode == 0, result.stderr
    assert hits == ["/pyxis-0.24.0.tar.gz"]


def test_offline_without_a_source_fails_clearly(make_node):
    node = make_node(artifacts_in_files=False)
    result = node.run("login")
    assert result.returncode == 1
    assert ("cannot fetch pyxis-0.24.0.tar.gz: not in the project's files/artifacts/, no lingjun_slurm.artifacts.url, "
            "and lingjun_slurm.artifacts.offline is true") in result.stderr


def test_unreachable_source_falls_through_to_the_next(make_node, served):
    url, hits = served
    node = make_node(artifacts_in_files=False, upstream=url,
                     config={"lingjun_slurm.artifacts.offline": "false",
                             "lingjun_slurm.artifacts.url": "http://127.0.0.1:9/nothing-listens-here"})
    result = node.run("login")
    assert result.returncode == 0, result.stderr
    assert "could not fetch pyxis-0.24.0.tar.gz from http://127.0.0.1:9/nothing-listens-here/pyxis-0.24.0.tar.gz" in result.stderr
    assert hits == ["/pyxis-0.24.0.tar.gz"]


def test_admin_pins_file(make_node, artifacts):
    node = make_node(missing=tuple(artifacts), config={"lingjun_slurm.pins_file": "/etc/site/pins.tsv"})
    write_pins(node.path("/etc/site/pins.tsv"), artifacts, "http://127.0.0.1:9/upstream")
    result = node.run("execute")
    assert result.returncode == 0, result.stderr


def test_shipped_pins_file_is_well_formed_and_cited():
    from tests.cluster_init.node import PROJECT
    rows = [line.split("\t") for line in (PROJECT / "specs/default/cluster-init/files/pins.tsv").read_text().splitlines()
            if line and not line.startswith("#")]
    assert rows
    names = {row[0] for row in rows}
    assert {"pyxis-0.24.0.tar.gz", "enroot_4.2.1-1_amd64.deb", "enroot+caps_4.2.1-1_amd64.deb",
            "enroot-4.2.1-1.el8.x86_64.rpm", "enroot+caps-4.2.1-1.el8.x86_64.rpm"} <= names
    for name, digest, url, source in rows:
        assert digest == "-" or (len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)), name
        assert url.startswith("https://github.com/NVIDIA/") and url.rsplit("/", 1)[1] in (name, "v0.24.0.tar.gz"), name
        assert source.strip(), f"{name}: every row says where its checksum comes from"
        if digest == "-":
            assert "No published checksum" in source, name


def test_a_token_in_the_mirror_url_never_reaches_logs_or_command_lines(make_node, served):
    """A mirror URL may carry credentials (https://user:token@mirror/...): the installer logs it
    as ***@ and hands it to curl on stdin, so neither the log, the output nor ps shows it."""
    url, hits = served
    token = "s3cr3t-T0ken"
    mirror = url.replace("http://", f"http://lingjun:{token}@") + "/"
    node = make_node(artifacts_in_files=False, config={"lingjun_slurm.artifacts.url": mirror,
                                                       "lingjun_slurm.artifacts.offline": "true"})
    result = node.run("execute")
    assert result.returncode == 0, result.stderr
    assert hits, "the files came from the mirror"
    assert "http://***@127.0.0.1" in result.stdout
    for text in (result.stdout, result.stderr, node.log(), "\n".join(node.calls())):
        assert token not in text


def test_a_failing_mirror_with_a_token_is_reported_redacted(make_node, served):
    url, _ = served
    token = "s3cr3t-T0ken"
    node = make_node(artifacts_in_files=False,
                     config={"lingjun_slurm.artifacts.url": url.replace("http://", f"http://u:{token}@") + "/missing/",
                             "lingjun_slurm.artifacts.offline": "true"})
    result = node.run("execute")
    assert result.returncode != 0
    assert "could not fetch" in result.stdout + result.stderr and "***@" in result.stdout + result.stderr
    for text in (result.stdout, result.stderr, node.log()):
        assert token not in text
