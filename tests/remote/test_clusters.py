"""clusters.yaml: validation with file/line/field, the defaults it gives a spec (command line > spec >
clusters.yaml), --host/--cluster resolution, and the index's per-host lookups. No SSH, no Slurm."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from lingjun_slurm.clusters import (ClustersFileError, cluster_defaults, get_cluster, parse_clusters,
                                    parse_spec_with_defaults)
from lingjun_slurm.destination import destination
from lingjun_slurm.common.errors import RunNotFound, SpecError, UsageError
from lingjun_slurm.runs.index import AmbiguousRun, RunIndex, entry_for
from tests.integration.helpers import cli

GOOD = """\
clusters:
  lingjun:
    host: login.example.com
    user: alice
    port: 2222
    workdir: /mnt/shared/alice
    partition: gpu
    account: proj42
    network_profile: tcp
  plain:
    host: lingjun-test
"""


def spec_text(**over: object) -> str:
    doc: dict = {"version": 1, "run": {"name": "c"},
                 "container": {"runtime": "none"},
                 "stages": {**{s: {"skip": True} for s in ("preprocess", "merge", "train", "checkpoint")},
                            "commands": [{"name": "a", "command": "true", "before": "preprocess"}]}}
    for path, value in over.items():
        cur = doc
        parts = path.split("__")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    return yaml.safe_dump(doc, sort_keys=False)


@pytest.fixture
def clusters_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(GOOD)
    monkeypatch.setenv("LINGJUN_CLUSTERS", str(path))
    return path


def test_a_good_file_and_its_target(clusters_file: Path) -> None:
    cfg = get_cluster("lingjun")
    assert cfg.target() == "alice@login.example.com:2222"
    assert get_cluster("plain").target() == "lingjun-test"
    assert cluster_defaults(cfg) == {"run.workdir": "/mnt/shared/alice", "cluster.defaults.partition": "gpu",
                                     "cluster.account": "proj42", "cluster.network.profile": "tcp"}


def test_every_problem_names_file_line_and_field() -> None:
    text = """\
clusters:
  lingjun:
    host: "login; rm -rf /"
    port: 70000
    workdir: relative/path
    partitoin: gpu
    network_profile: nosuch
  "bad name!":
    host: x
"""
    with pytest.raises(ClustersFileError) as err:
        parse_clusters(text, "/home/a/clusters.yaml")
    msg = str(err.value)
    assert err.value.exit_code == 2
    assert "/home/a/clusters.yaml: invalid clusters file (6 problems)" in msg, msg
    assert "/home/a/clusters.yaml:3: clusters.lingjun.host: expected a host name" in msg
    assert "/home/a/clusters.yaml:4: clusters.lingjun.port:" in msg
    assert "/home/a/clusters.yaml:5: clusters.lingjun.workdir: expected an absolute path" in msg
    assert "/home/a/clusters.yaml:6: clusters.lingjun.partitoin: unknown field; expected one of: host, user" in msg
    assert "/home/a/clusters.yaml:7: clusters.lingjun.network_profile: unknown network profile 'nosuch'" in msg
    assert "clusters.bad name!" in msg


def test_yaml_syntax_and_shape_errors() -> None:
    with pytest.raises(ClustersFileError, match=r"x\.yaml:3: .*YAML syntax error"):
        parse_clusters("clusters:\n  a: [\n", "x.yaml")
    with pytest.raises(ClustersFileError, match="expected a mapping"):
        parse_clusters("- a\n", "x.yaml")
    assert parse_clusters("", "x.yaml").clusters == {}


def test_unknown_cluster_and_missing_file(clusters_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match=r"--cluster 'nope': not in .*clusters: lingjun, plain"):
        get_cluster("nope")
    monkeypatch.setenv("LINGJUN_CLUSTERS", str(tmp_path / "missing.yaml"))
    with pytest.raises(UsageError, match="no clusters file at"):
        get_cluster("lingjun")


def test_xdg_config_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LINGJUN_CLUSTERS", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "lingjun-slurm").mkdir(parents=True)
    (tmp_path / "xdg" / "lingjun-slurm" / "clusters.yaml").write_text(GOOD)
    assert get_cluster("plain").host == "lingjun-test"


def test_host_wins_over_the_clusters_address_but_not_its_defaults(clusters_file: Path) -> None:
    dest = destination("bob@other:22", "lingjun")
    assert dest.target == "bob@other:22" and dest.cluster == "lingjun" and dest.config is not None
    assert destination(None, "lingjun").target == "alice@login.example.com:2222"
    assert not destination(None, None).remote
    with pytest.raises(UsageError, match="--host"):
        destination("a b;c", None)


def test_spec_beats_clusters_yaml_field_by_field() -> None:
    defaults = {"run.workdir": "/shared/w", "cluster.defaults.partition": "gpu", "cluster.account": "acct",
                "cluster.network.profile": "tcp"}
    # The spec sets nothing of it: everything comes from the cluster.
    loaded, applied = parse_spec_with_defaults(spec_text(), "s.yaml", defaults)
    assert applied == defaults
    assert loaded.spec.run.workdir == "/shared/w" and loaded.spec.cluster.defaults.partition == "gpu"
    assert loaded.spec.cluster.account == "acct" and loaded.spec.cluster.network.profile == "tcp"
    assert loaded.text == spec_text()  # the spec as written is what is kept
    # The spec sets them: the spec wins, and nothing is recorded as applied.
    text = spec_text(run__workdir="/mine", cluster__defaults={"partition": "cpu"}, cluster__account="me",
                     cluster__network={"instance_type": "Standard_ND96isr_H100_v5"})
    loaded, applied = parse_spec_with_defaults(text, "s.yaml", defaults)
    assert applied == {}
    assert loaded.spec.run.workdir == "/mine" and loaded.spec.cluster.defaults.partition == "cpu"
    assert loaded.spec.cluster.account == "me" and loaded.spec.cluster.network.profile is None


def test_spec_errors_still_name_the_spec_file_and_line() -> None:
    text = spec_text(run__workdir="/w", cluster__defaults={"partiton": "cpu"})
    with pytest.raises(SpecError) as err:
        parse_spec_with_defaults(text, "s.yaml", {"cluster.network.profile": "tcp"})
    assert "s.yaml:" in str(err.value) and "cluster.defaults.partiton: unknown field" in str(err.value)
    # Without a workdir anywhere, the spec's own message.
    with pytest.raises(SpecError, match="run.workdir: required field is missing"):
        parse_spec_with_defaults(spec_text(), "s.yaml", {"cluster.network.profile": "tcp"})


def test_index_lookups_by_host(tmp_path: Path) -> None:
    index = RunIndex(tmp_path)
    now = time.time()
    index.add(entry_for("r-1", "r", now, "slurm", "ssh", "lingjun-test", "/shared/runs/r-1", "s", cluster="c1"))
    index.add(entry_for("r-2", "r", now + 1, "slurm", "ssh", "other", "/shared/runs/r-2", "s"))
    index.add(entry_for("r-3", "r", now + 2, "slurm", "local", "laptop", "/w/runs/r-3", "s"))
    assert [e.run_id for e in index.on("lingjun-test")] == ["r-1"]
    assert [e.run_id for e in index.on("", "c1")] == ["r-1"]
    # A prefix that is ambiguous overall is unique on one host.
    assert index.resolve("r-", target="other").run_id == "r-2"
    with pytest.raises(AmbiguousRun):
        index.resolve("r-")
    # --host on a run of another host: the run is still found (the host then overrides its address).
    assert index.resolve("r-1", target="other").run_id == "r-1"
    # A remote run directory is matched as written, with or without --host.
    assert index.resolve("/shared/runs/r-2/").run_id == "r-2"
    assert index.resolve("/shared/runs/r-2", target="other").run_id == "r-2"
    with pytest.raises(RunNotFound):
        index.resolve("/shared/runs/nope", target="other")


def test_list_filters_offline_and_cli_rejects_bad_input(tmp_path: Path) -> None:
    state = tmp_path / "state"
    index = RunIndex(state)
    index.add(entry_for("r-1", "r", time.time(), "slurm", "ssh", "lingjun-test", "/shared/runs/r-1", "s"))
    index.add(entry_for("r-2", "r", time.time(), "slurm", "local", "laptop", "/w/runs/r-2", "s"))
    env = {"LINGJUN_STATE_DIR": str(state), "LINGJUN_CLUSTERS": str(tmp_path / "none.yaml")}
    index.add(entry_for("r-3", "r", time.time(), "slurm", "ssh", "login.example.com", "/s/runs/r-3", "s",
                        cluster="gone"))
    doc = json.loads(cli("list", "--json", "--host", "lingjun-test", env=env).stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["r-1"] and doc["runs"][0]["transport"] == "ssh"
    assert doc["runs"][0]["cluster"] == ""
    # A cluster no longer in clusters.yaml (no file at all here): its runs are still listed by name.
    doc = json.loads(cli("list", "--json", "--cluster", "gone", env=env).stdout)
    assert [r["run_id"] for r in doc["runs"]] == ["r-3"]
    proc = cli("status", "--cluster", "nope", env=env, check=2)
    assert "no clusters file" in proc.stderr
    proc = cli("submit", str(tmp_path / "s.yaml"), "--host", "bad host", env=env, check=2)
    assert "--host" in proc.stderr
    spec = tmp_path / "s.yaml"
    spec.write_text(spec_text(run__workdir="/w", cluster__network={"profile": "tcp"}))
    proc = cli("submit", str(spec), "--host", "lingjun-test", "--executor", "local", env=env, check=2)
    assert "--executor local runs the chain on this machine" in proc.stderr
    # A local run reached with --host is refused, not silently sent elsewhere.
    proc = cli("status", "r-2", "--host", "lingjun-test", env=env, check=2)
    assert "submitted on this machine" in proc.stderr


def test_dry_run_with_a_cluster_shows_the_defaults_and_connects_nowhere(clusters_file: Path, tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(spec_text())
    env = {"LINGJUN_STATE_DIR": str(tmp_path / "state"), "LINGJUN_CLUSTERS": str(clusters_file)}
    out = cli("submit", str(spec), "--cluster", "lingjun", "--dry-run", env=env).stdout
    assert "from /mnt/shared/alice/runs/c-" in out
    assert "on alice@login.example.com:2222 over SSH (cluster lingjun)" in out
    assert "cluster.defaults.partition = gpu   (from clusters.yaml, cluster lingjun)" in out
    # render --cluster applies the same defaults, offline.
    got = cli("render", str(spec), "--cluster", "lingjun", "--stage", "a", env=env).stdout
    assert "#SBATCH --partition=gpu" in got and "#SBATCH --account=proj42" in got
    assert "--cluster lingjun" in got  # the reproduce line names it
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters:\n  x:\n    hots: h\n")
    proc = cli("submit", str(spec), "--cluster", "x", "--dry-run", env={**env, "LINGJUN_CLUSTERS": str(bad)}, check=2)
    assert f"{bad}:3: clusters.x.hots: unknown field" in proc.stderr
    assert f"{bad}:2: clusters.x.host: required field is missing" in proc.stderr


@pytest.mark.parametrize("host", ["login.example.com.", "login-", "a."])
def test_a_host_the_ssh_transport_refuses_is_refused_in_clusters_yaml_with_its_line(host: str) -> None:
    """clusters.yaml's check and --host's parser agree: no host passes the file only to fail at connect time
    with a message that names neither the file nor the line."""
    with pytest.raises(ClustersFileError) as err:
        parse_clusters(f"clusters:\n  x:\n    host: {host!r}\n", "/c.yaml")
    assert err.value.exit_code == 2 and "/c.yaml:3: clusters.x.host:" in str(err.value), str(err.value)


@pytest.mark.parametrize("cluster", ["gpu", "[1]", "{network: tcp}", "{network: [tcp]}"])
def test_a_misshapen_cluster_block_with_a_default_profile_is_a_spec_error(cluster: str) -> None:
    """The clusters.yaml network profile must not crash on a spec whose cluster/network is not a mapping:
    the spec's own validation reports it (file, line, exit 2), not an internal error."""
    text = spec_text(run__workdir="/w", cluster__network={"profile": "tcp"}).replace("container:", f"cluster: {cluster}\ncontainer:", 1)
    with pytest.raises(SpecError) as err:
        parse_spec_with_defaults(text, "s.yaml", {"cluster.network.profile": "tcp",
                                                  "cluster.defaults.partition": "gpu"})
    assert err.value.exit_code == 2 and "s.yaml:" in str(err.value) and "cluster" in str(err.value)


def test_port_true_is_not_port_1() -> None:
    with pytest.raises(ClustersFileError) as err:
        parse_clusters("clusters:\n  x:\n    host: h\n    port: true\n", "/c.yaml")
    assert "/c.yaml:4: clusters.x.port: expected a port number" in str(err.value)
    assert parse_clusters("clusters:\n  x:\n    host: h\n    port: 2222\n", "/c.yaml").clusters["x"].port == 2222


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_cluster_name_is_refused_not_ignored(clusters_file: Path, name: str) -> None:
    """`--cluster ""` (an unset shell variable, typically) must not quietly mean "no cluster"."""
    with pytest.raises(UsageError, match="--cluster: empty name"):
        destination(None, name, False)


def test_the_price_and_the_textfile_directory_come_from_clusters_yaml_unless_the_spec_sets_them() -> None:
    """monitoring.gpu_hour_price / textfile_dir (issue 30): clusters.yaml's fill the spec's unset
    ones at submit, reach the plan's settings (the ledger's cost, the train script's textfile
    directory), and a spec's own win."""
    from lingjun_slurm.plan import settings

    cfg = parse_clusters("clusters:\n  c:\n    host: h\n    gpu_hour_price: 3\n"
                         "    textfile_dir: /var/lib/prometheus/node-exporter-lingjun-slurm\n", "clusters.yaml").clusters["c"]
    defaults = cluster_defaults(cfg)
    assert defaults == {"monitoring.gpu_hour_price": 3, "monitoring.textfile_dir":
                        "/var/lib/prometheus/node-exporter-lingjun-slurm"}
    loaded, applied = parse_spec_with_defaults(spec_text(run__workdir="/w", cluster__network={"profile": "tcp"}), "s.yaml", defaults)
    assert applied == defaults
    assert settings(loaded.spec)["monitoring"] == {"gpu_hour_price": 3.0,
                                                   "textfile_dir": "/var/lib/prometheus/node-exporter-lingjun-slurm"}
    loaded, applied = parse_spec_with_defaults(spec_text(run__workdir="/w", cluster__network={"profile": "tcp"}, monitoring={"gpu_hour_price": 1.5}),
                                               "s.yaml", defaults)
    assert loaded.spec.monitoring.gpu_hour_price == 1.5 and "monitoring.gpu_hour_price" not in applied
    # Neither set: the plan has no monitoring key (plans and golden files of such runs are unchanged).
    assert "monitoring" not in settings(parse_spec_with_defaults(spec_text(run__workdir="/w", cluster__network={"profile": "tcp"}), "s.yaml", {})[0].spec)
    with pytest.raises(ClustersFileError, match="gpu_hour_price"):
        parse_clusters("clusters:\n  c:\n    host: h\n    gpu_hour_price: -1\n", "clusters.yaml")
