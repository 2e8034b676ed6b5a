"""Plan -> files: one sbatch script per stage, submit.sh and plan.json (pure).

Templates live in slurm_templates/ (shipped inside the wheel as
lingjun_slurm/slurm_templates). Every user value passes the `q` filter (shell quoting)
or was restricted at validation to characters that need none.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path

import jinja2

from . import __version__, network
from .network import NetworkEnv
from .plan import TASK_WRAPPER, Plan, StagePlan
from .common.shell import Shell, Word, join, quote

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def templates_dir() -> Path:
    """The installed copy inside the package, else the repository's slurm_templates/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "slurm_templates", here.parent / "slurm_templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("slurm_templates/ not found next to the lingjun_slurm package")


def comment(value: object) -> str:
    """Make any text safe inside a '#' comment: control characters become escapes."""
    return _CONTROL_RE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def argv_lines(words: "tuple[Word, ...] | list[Word]") -> str:
    """Quote argv, one '--flag [values]' group per continued line, for readable scripts."""
    groups: list[list[Word]] = []
    for word in words:
        is_flag = isinstance(word, str) and word.startswith("-") and len(groups) > 0
        if not groups or (is_flag and (len(groups) > 1 or _is_flag(groups[0][0]) or len(groups[0]) >= 2)):
            groups.append([word])
        else:
            groups[-1].append(word)
    return " \\\n  ".join(join(g) for g in groups)


def _is_flag(word: Word) -> bool:
    return isinstance(word, str) and word.startswith("-")


def nccl_block(env: NetworkEnv) -> str:
    return network.render(env, "sh").rstrip("\n")


# The Environment's options: part of the bytecode cache's key (_cache_dir), since the code a
# template compiles to depends on them as much as on its source.
_ENV_OPTIONS: dict[str, object] = dict(
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
    # bash uses '{#' (${#array[@]}): Jinja comments get a marker bash never writes.
    comment_start_string="<#--",
    comment_end_string="--#>",
)


def cache_root() -> Path:
    """Where lingjun-slurm keeps caches: $LINGJUN_STATE_DIR/cache when that is set (as the run
    index is kept there: tests and sandboxes set it), else $XDG_CACHE_HOME/lingjun-slurm, else
    ~/.cache/lingjun-slurm."""
    if os.environ.get("LINGJUN_STATE_DIR"):
        return Path(os.environ["LINGJUN_STATE_DIR"]) / "cache"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lingjun-slurm"


def _cache_dir() -> Path:
    """The bytecode cache's directory for this tool version, Jinja version, Environment options
    and render.py (its mtime and size: a checkout under edit changes them), so compiled code is
    never used by an Environment other than the one that compiled it. A template's own source
    is checked by Jinja itself: every cached file carries the SHA-1 of the source it was
    compiled from, and a different source is compiled afresh (jinja2 3.1 bccache.py,
    Bucket.load_bytecode: `if self.checksum != checksum: self.reset()`)."""
    import hashlib

    here = os.stat(__file__)
    key = repr((__version__, jinja2.__version__, sorted(_ENV_OPTIONS.items()), here.st_mtime_ns, here.st_size))
    return cache_root() / "jinja2" / f"{__version__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


class TemplateCodeCache(jinja2.BytecodeCache):
    """Compiled templates on disk, so `render` does not compile every template on every run
    (about 50 ms of its start-up; issue 15 item 9). Jinja's documented extension point
    (jinja2 3.1 bccache.py, BytecodeCache: "override load_bytecode and dump_bytecode"); Jinja
    computes each bucket's key from the template's name and file and rejects a cached file whose
    source checksum differs (Bucket.load_bytecode).

    A cache is only a speed-up: a directory that cannot be made, is not this user's own or is
    writable by others (the files hold code that is run), or a file that cannot be read or
    written, means compiling as without one, silently.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def open(cls, directory: Path) -> "TemplateCodeCache | None":
        state = os.environ.get("LINGJUN_STATE_DIR")
        if state and not os.path.isdir(state):
            # A cache never brings a state dir into being: `submit --dry-run` writes nothing
            # (tests/integration/test_local_executor.py::test_dry_run_writes_nothing).
            return None
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.lstat(directory)
        except OSError:
            return None
        import stat

        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return None
        if not os.access(directory, os.W_OK | os.X_OK):
            return None
        return cls(directory)

    def _path(self, bucket: "jinja2.bccache.Bucket") -> Path:
        return self.directory / f"{bucket.key}.cache"

    def load_bytecode(self, bucket: "jinja2.bccache.Bucket") -> None:
        # A damaged cache file is compiled afresh, never an error: jinja2's Bucket.load_bytecode
        # (jinja2/bccache.py:65-82, 3.1.6) catches only marshal's errors, and its pickle.load of
        # the checksum raises UnpicklingError, EOFError and others on garbage.
        try:
            with open(self._path(bucket), "rb") as handle:
                bucket.load_bytecode(handle)
        except Exception:
            bucket.reset()

    def dump_bytecode(self, bucket: "jinja2.bccache.Bucket") -> None:
        path = self._path(bucket)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                bucket.write_bytecode(handle)
            os.replace(tmp, path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass

    def clear(self) -> None:
        for path in self.directory.glob("*.cache"):
            try:
                path.unlink()
            except OSError:
                pass


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        bytecode_cache=TemplateCodeCache.open(_cache_dir()),
        **_ENV_OPTIONS,  # type: ignore[arg-type]
    )
    env.filters["q"] = quote
    env.filters["shjoin"] = join
    env.filters["comment"] = comment
    env.filters["argv_lines"] = argv_lines
    env.globals["nccl_block"] = nccl_block
    env.globals["version"] = __version__
    env.globals["wrapper"] = TASK_WRAPPER
    return env


def _uses_plan(stage: StagePlan) -> bool:
    return any(isinstance(w, Shell) and "$PLAN" in w.expr for cmd in stage.commands for w in cmd)


def render_stage(plan: Plan, stage: StagePlan) -> str:
    template = _environment().get_template(f"{stage.kind}.sbatch.j2")
    text = template.render(
        plan=plan, stage=stage, sbatch=stage.sbatch, uses_plan=_uses_plan(stage),
        title=f"{stage.name} stage of run {plan.run_id}",
        grace=plan.settings["training"]["save_grace_s"],
        iterations=plan.settings["training"]["iterations"],
        max_restarts=plan.settings["training"]["max_restarts"],
        # Read by the batch shell, outside the container: the host side of the checkpoint dir.
        tracker=f"{plan.host_checkpoint_dir}/latest_checkpointed_iteration.txt",
    )
    return _tidy(text)


def render_submit(plan: Plan) -> str:
    text = _environment().get_template("submit.sh.j2").render(
        plan=plan, sbatch=(), title=f"submits the chain of run {plan.run_id}")
    return _tidy(text)


def render_template(name: str, **context: object) -> str:
    """Any other template of slurm_templates/ (e.g. nccl-test.sbatch.j2) with the same environment."""
    return _tidy(_environment().get_template(name).render(**context))


def _tidy(text: str) -> str:
    """Collapse runs of blank lines left by optional template blocks."""
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def render_plan(plan: Plan) -> dict[str, str]:
    """Every file of a rendered run, by file name (deterministic order)."""
    files = {st.script: render_stage(plan, st) for st in plan.stages}
    files["submit.sh"] = render_submit(plan)
    files["plan.json"] = json.dumps(plan.to_json(), indent=2) + "\n"
    return files


def write_files(files: dict[str, str], outdir: Path) -> list[Path]:
    """Write atomically (temp file + rename); scripts are made executable.

    A directory that cannot be made or written (read-only, a file in the way, disk full) is
    one TransportError naming the path and the OS's reason (exit 1, as every other I/O error),
    never a traceback; a temp file already made is removed.
    """
    from .common.errors import TransportError

    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TransportError(f"cannot create the output directory {outdir}: {exc.strerror or exc}") from None
    written = []
    for name, text in files.items():
        path = outdir / name
        tmp = outdir / f".{name}.tmp{os.getpid()}"
        try:
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, 0o755 if name.endswith((".sh", ".sbatch")) else 0o644)
            os.replace(tmp, path)
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise TransportError(f"cannot write {path}: {exc.strerror or exc} "
                                 "(give -o a directory you can write)") from None
        written.append(path)
    return written
