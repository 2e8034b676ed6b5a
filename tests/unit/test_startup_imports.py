"""What `validate`, `render` and `status` load at start-up (issue 15 item 9), not how long it takes.

Each command runs in a fresh interpreter, which then reports its sys.modules and whether the
spec models were built. bench/cli_startup.py measures the time (a benchmark, no thresholds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "megatron-gpt.yaml"
CHAIN = REPO / "examples" / "command-chain.yaml"
CHAIN_WORKDIR = "/tmp/lingjun-slurm/command-chain"

# Never at start-up of these commands: the training stack, SSH, the Slurm C API, numpy.
HEAVY = ("torch", "megatron", "numpy", "paramiko", "pyslurm")
# The other commands' modules, which the lazy group imports only when their command is named.
OTHER_COMMANDS = ("lingjun_slurm.cli.checkpoint", "lingjun_slurm.cli.devcluster", "lingjun_slurm.cli.health",
                  "lingjun_slurm.cli.image", "lingjun_slurm.cli.nccltest", "lingjun_slurm.devcluster",
                  "lingjun_slurm.cli.doctor", "lingjun_slurm.doctor")

# Standard-library modules none of validate, render and status needs: pydantic's plugin loader
# imported the first four (importlib.metadata), importlib.resources the rest.
NOT_AT_START = ("importlib.metadata", "email", "zipfile", "csv", "importlib.resources", "tempfile", "shutil")

PROBE = """
import json, sys
from lingjun_slurm.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    code = exc.code or 0
else:
    code = 0
import os
assert "PYDANTIC_DISABLE_PLUGINS" not in os.environ or os.environ.get("PROBE_USER_SET") == "1", "set for children"
models = sys.modules.get("lingjun_slurm.spec.models")
tokenize = sys.modules.get("tokenize")
print("PROBE " + json.dumps({"code": code, "modules": sorted(sys.modules),
                             "spec_built": bool(models and models.Spec.__pydantic_complete__),
                             "tokenize_regex": bool(tokenize and tokenize._compile.cache_info().currsize)}))
"""


def probe(args: list[str], env: dict[str, str]) -> dict:
    """Run main(args) in a fresh interpreter; what it imported and built. Without the user's
    PYDANTIC_DISABLE_PLUGINS unless env sets it (cli._no_pydantic_plugin_discovery reads it)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, (proc.returncode, proc.stdout, proc.stderr)
    got = json.loads(lines[-1][len("PROBE "):])
    assert got["code"] == 0, (args, proc.stdout, proc.stderr)
    return got


def loaded(got: dict, roots: tuple[str, ...]) -> list[str]:
    return [m for m in got["modules"] if m.split(".")[0] in roots or m in roots]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    return {**base, "LINGJUN_STATE_DIR": str(tmp_path / "state")}


def test_validate_loads_no_renderer_ssh_torch_or_other_commands(env: dict[str, str]) -> None:
    got = probe(["validate", str(EXAMPLE)], env)
    assert loaded(got, HEAVY) == []
    assert loaded(got, ("jinja2", "rich")) == [], "validate renders nothing and prints one line"
    assert loaded(got, OTHER_COMMANDS + ("lingjun_slurm.cli.runs",)) == []
    # pydantic's plugin discovery (cli._no_pydantic_plugin_discovery) and importlib.resources
    # (presets._read_text) are what pulled these in
    assert [m for m in NOT_AT_START if m in got["modules"]] == []
    assert got["spec_built"]
    # inspect.signature(list) (pydantic asks it of a default_factory=list) compiles tokenize's regex
    assert not got["tokenize_regex"], "a spec model has default_factory=list again: use _no_items"


def test_render_loads_no_ssh_torch_or_other_commands(env: dict[str, str], tmp_path: Path) -> None:
    got = probe(["render", str(EXAMPLE), "-o", str(tmp_path / "out")], env)
    assert (tmp_path / "out" / "plan.json").is_file()
    assert loaded(got, HEAVY) == []
    assert loaded(got, OTHER_COMMANDS + ("lingjun_slurm.cli.runs",)) == []
    # jinja2 itself imports tempfile (jinja2 3.1 bccache.py:16), and tempfile shutil
    assert [m for m in NOT_AT_START if m in got["modules"] and m not in ("tempfile", "shutil")] == []


def test_status_of_a_finished_local_run_builds_no_spec_models(env: dict[str, str], tmp_path: Path) -> None:
    """status reads manifests, not specs: the spec models stay unbuilt (defer_build), and neither
    jinja2 nor paramiko (a local run) nor the other commands' modules are loaded, nor rich (its
    output is a pipe: plain text)."""
    spec = tmp_path / "chain.yaml"
    spec.write_text(CHAIN.read_text().replace(CHAIN_WORKDIR, str(tmp_path / "work")))
    subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "submit", str(spec), "--executor", "local",
                    "--run-id", "startup"], check=True, capture_output=True, env=env, cwd=REPO, timeout=120)
    got = probe(["status", "startup"], env)
    assert loaded(got, HEAVY) == []
    assert loaded(got, ("jinja2", "rich")) == []
    assert loaded(got, OTHER_COMMANDS) == []
    assert "lingjun_slurm.status" in got["modules"]  # it did read the run
    assert not got["spec_built"]
    # clusters.py takes its patterns from spec/base.py, and spec/__init__.py loads lazily: no
    # spec model classes, no spec loader, no YAML
    assert [m for m in got["modules"] if m.startswith("lingjun_slurm.spec.") and m != "lingjun_slurm.spec.base"] == []
    assert loaded(got, ("yaml",)) == []
    # manifests are read by runs/manifest.py's strict reader and no cluster is named: no pydantic
    # (cli/main.py's stand-in for pydantic.plugin._loader is no pydantic)
    assert loaded(got, ("pydantic", "pydantic_core", "lingjun_slurm.clusters")) == ["pydantic.plugin._loader"]
    # transport/local.py uses shutil and atomicfile.py tempfile: those are status's own
    assert [m for m in NOT_AT_START if m in got["modules"] and m not in ("tempfile", "shutil")] == []


def test_help_lists_every_command_and_each_lazy_name_is_its_command() -> None:
    import click

    from lingjun_slurm.cli import main as cli_module
    from lingjun_slurm.cli.runs import COMMANDS

    runs = {name for name, where in cli_module.LAZY_COMMANDS.items() if where.startswith("runs:")}
    assert runs == {c.name for c in COMMANDS}, "a command added to cli/runs.py COMMANDS needs a LAZY_COMMANDS entry"
    ctx = click.Context(cli_module.cli)
    names = cli_module.cli.list_commands(ctx)
    assert names == sorted(names) and set(cli_module.LAZY_COMMANDS) <= set(names)
    for name in names:
        command = cli_module.cli.get_command(ctx, name)
        assert command is not None and command.name == name
    assert cli_module.cli.get_command(ctx, "no-such-command") is None


def test_presets_parse_the_same_with_libyaml_and_pure_python() -> None:
    """presets.load uses libyaml's CSafeLoader when present: same data as SafeLoader, file by file."""
    import yaml

    from lingjun_slurm import presets

    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("PyYAML without libyaml: presets.load uses SafeLoader itself")
    files = sorted((REPO / "lingjun_slurm" / "presets").glob("*.yaml"))
    assert files
    for path in files:
        pure = yaml.load(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)  # noqa: S506
        assert presets.load(path.name) == pure, path.name


def test_an_unknown_command_still_gets_a_suggestion_from_the_lazy_commands(env: dict[str, str]) -> None:
    """click suggests from the commands it has loaded: the lazy group loads them all first."""
    proc = subprocess.run([sys.executable, "-m", "lingjun_slurm.cli", "lgos", "x"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert "No such command 'lgos'. Did you mean 'logs'?" in proc.stderr, proc.stderr


RENDER_PROBE = """
import json, sys
import jinja2
compiled = []
original = jinja2.Environment.compile
def counting(self, source, name=None, *args, **kwargs):
    compiled.append(name)
    return original(self, source, name, *args, **kwargs)
jinja2.Environment.compile = counting
from lingjun_slurm.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    assert not exc.code, exc.code
print("PROBE " + json.dumps(compiled))
"""


def _render_counting(args: list[str], env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", RENDER_PROBE, json.dumps(args)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, (proc.stdout, proc.stderr)
    return json.loads(lines[-1][len("PROBE "):])


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_render_compiles_each_template_once_then_reuses_the_code(env: dict[str, str], tmp_path: Path) -> None:
    """The first render compiles its templates into an existing $LINGJUN_STATE_DIR/cache; the next compiles
    none, and writes the same bytes as a render that could make no cache at all."""
    out = tmp_path / "out"
    args = ["render", str(EXAMPLE), "-o", str(out)]
    # A state dir that does not exist yet gets no cache: a cache never creates it.
    assert sorted(_render_counting(args, env)) and not (tmp_path / "state").exists()
    (tmp_path / "state").mkdir()
    first = _render_counting(args, env)
    assert "train.sbatch.j2" in first and "submit.sh.j2" in first
    cold = _files(out)
    cached = list((tmp_path / "state" / "cache" / "jinja2").glob("*/*.cache"))
    assert len(cached) >= len(set(first)), (first, cached)
    assert _render_counting(args, env) == []
    assert _files(out) == cold
    # A state dir below a plain file: no cache can be made; rendering is unchanged and silent.
    (tmp_path / "file").write_text("")
    assert sorted(_render_counting(args, {**env, "LINGJUN_STATE_DIR": str(tmp_path / "file" / "state")})) == \
        sorted(first)
    assert _files(out) == cold


def _one_template(tmp_path: Path) -> tuple[Path, Callable[[], str]]:
    """templates/page.j2 ("one {{ x }}") and a render of it through a TemplateCodeCache in tmp_path/cache."""
    import jinja2

    from lingjun_slurm.render import TemplateCodeCache

    templates = tmp_path / "templates"
    templates.mkdir()
    page = templates / "page.j2"
    page.write_text("one {{ x }}\n")
    cache = TemplateCodeCache.open(tmp_path / "cache")
    assert cache is not None

    def render() -> str:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), bytecode_cache=cache)
        return env.get_template("page.j2").render(x=1)

    return page, render


def test_an_edited_template_is_compiled_again_never_served_stale(tmp_path: Path) -> None:
    """Jinja keeps the source's SHA-1 in every cached file: an edit of the same size and mtime
    (nothing but the content changed) still renders the new text."""
    page, render = _one_template(tmp_path)
    assert render() == "one 1"
    assert len(list((tmp_path / "cache").glob("*.cache"))) == 1
    assert render() == "one 1"  # from the cache
    before = page.stat()
    page.write_text("two {{ x }}\n")
    os.utime(page, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert page.stat().st_size == before.st_size
    assert render() == "two 1"


@pytest.mark.parametrize("garbage", [b"\x80\x04not a pickle", b"", b"\x80", b"\x00" * 64])
def test_a_damaged_cache_file_is_compiled_again(tmp_path: Path, garbage: bytes) -> None:
    """jinja2's Bucket.load_bytecode unpickles the source checksum after the magic header and
    catches nothing around it: a file cut short or overwritten (a full disk, a crash, another
    program) raised UnpicklingError/EOFError out of render (issue 15 item 5)."""
    from jinja2.bccache import bc_magic

    _, render = _one_template(tmp_path)
    assert render() == "one 1"
    [cached] = (tmp_path / "cache").glob("*.cache")
    cached.write_bytes(bc_magic + garbage)
    assert render() == "one 1"
    assert cached.read_bytes().startswith(bc_magic) and len(cached.read_bytes()) > len(bc_magic) + len(garbage)


def test_the_cache_directory_is_keyed_by_version_options_and_renderer(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """Compiled code depends on the Environment as much as on the template: another tool
    version, Jinja option or render.py gets another directory."""
    from lingjun_slurm import render

    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / "state"))
    base = render._cache_dir()
    assert base.parent == tmp_path / "state" / "cache" / "jinja2"
    monkeypatch.setattr(render, "__version__", "99.0")
    assert render._cache_dir() != base
    monkeypatch.undo()
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setitem(render._ENV_OPTIONS, "trim_blocks", False)
    assert render._cache_dir() != base
    monkeypatch.undo()
    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / "state"))
    assert render._cache_dir() == base
    monkeypatch.setattr(render, "__file__", str(tmp_path / "render.py"))
    (tmp_path / "render.py").write_text("# another renderer\n")
    assert render._cache_dir() != base


def test_cache_root_follows_state_dir_then_xdg_cache_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lingjun_slurm.render import cache_root

    monkeypatch.setenv("LINGJUN_STATE_DIR", str(tmp_path / "state"))
    assert cache_root() == tmp_path / "state" / "cache"
    monkeypatch.delenv("LINGJUN_STATE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "lingjun-slurm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "lingjun-slurm"


def test_a_cache_directory_others_can_write_is_not_used(tmp_path: Path) -> None:
    """Cached files are code that is run: a directory writable by others, a symlink or a plain
    file is no cache."""
    from lingjun_slurm.render import TemplateCodeCache

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert TemplateCodeCache.open(shared) is None
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert TemplateCodeCache.open(tmp_path / "link") is None
    (tmp_path / "plain").write_text("")
    assert TemplateCodeCache.open(tmp_path / "plain") is None
    assert TemplateCodeCache.open(tmp_path / "plain" / "below") is None
    assert TemplateCodeCache.open(tmp_path / "real") is not None


def test_presets_read_beside_the_module_else_through_importlib_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    """presets._read_text reads the file beside the module; where there is none (a package in a
    zip file) it asks importlib.resources, and both give the same text."""
    from importlib import resources

    from lingjun_slurm import presets

    for name in ("models.yaml", "network_profiles.yaml"):
        expected = resources.files("lingjun_slurm.presets").joinpath(name).read_text(encoding="utf-8")
        assert presets._read_text(name) == expected
        monkeypatch.setattr(presets, "__file__", "/nonexistent.zip/lingjun_slurm/presets/__init__.py")
        assert presets._read_text(name) == expected
        monkeypatch.undo()


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -c CODE` in a fresh interpreter from the checkout; it must exit 0."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_the_spec_package_loads_its_parts_on_first_use(env: dict[str, str]) -> None:
    """spec/__init__.py (PEP 562 __getattr__): spec.base alone imports no model class, loader or
    YAML; the package's names still resolve, and an unknown one is an AttributeError."""
    code = ("import sys, lingjun_slurm.spec.base as b; "
            "print(sorted(m for m in sys.modules if m.startswith(('lingjun_slurm.spec.', 'yaml')))); "
            "import lingjun_slurm.spec as s; from lingjun_slurm.spec import load_spec, Spec, LoadedSpec, parse_spec; "
            "assert s.Spec is Spec and Spec.__module__ == 'lingjun_slurm.spec.models'\n"
            "try:\n    s.no_such_name\nexcept AttributeError as exc:\n    print('AttributeError', exc)")
    proc = run_python(code, env)
    first, second = proc.stdout.splitlines()
    assert first == "['lingjun_slurm.spec.base']"
    assert second == "AttributeError module 'lingjun_slurm.spec' has no attribute 'no_such_name'"


def test_the_user_s_pydantic_disable_plugins_keeps_pydantic_s_own_loader(env: dict[str, str]) -> None:
    """PYDANTIC_DISABLE_PLUGINS set by the user, even to '' (every plugin on), means pydantic's
    own loader and its entry-point scan; unset, validate never imports importlib.metadata and
    leaves the environment as it was (the probe checks no PYDANTIC_DISABLE_PLUGINS appeared)."""
    got = probe(["validate", str(EXAMPLE)], {**env, "PYDANTIC_DISABLE_PLUGINS": "", "PROBE_USER_SET": "1"})
    assert "importlib.metadata" in got["modules"] and "pydantic.plugin._loader" in got["modules"]
    assert "importlib.metadata" not in probe(["validate", str(EXAMPLE)], env)["modules"]


def test_the_plugin_loader_stand_in_hands_any_other_name_to_pydantic_s_module(env: dict[str, str]) -> None:
    code = ("import sys, lingjun_slurm.cli.main as c; c._no_pydantic_plugin_discovery(); "
            "m = sys.modules['pydantic.plugin._loader']; assert tuple(m.get_plugins()) == (); "
            "assert 'importlib.metadata' not in sys.modules; "
            "print(m.PYDANTIC_ENTRY_POINT_GROUP, sys.modules['pydantic.plugin._loader'] is not m, "
            "'importlib.metadata' in sys.modules)")
    proc = run_python(code, env)
    assert proc.stdout.split() == ["pydantic", "True", "True"]
