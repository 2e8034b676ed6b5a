"""Run a Python script as `python3 SCRIPT ARGS...` would, with stack traces on SIGUSR2 first.

    python3 -m lingjun_slurm.injob.pyrun SCRIPT [ARGS...]

For tasks that run a script (Megatron-LM's pretrain_gpt.py, a command stage's python file):
lingjun_slurm.injob.stacks.install() (a no-op without LINGJUN_STACKS_DIR), then the script in this
interpreter, set up the way CPython sets up `python3 SCRIPT ARGS` (checked against CPython 3.11):
  sys.argv      [SCRIPT as given, *ARGS]
  sys.path[0]   the directory of the script's real path (symlinks resolved), replacing the
                working directory that `-m` put there; nothing with -P / PYTHONSAFEPATH
  __main__      a fresh module: __name__ "__main__", __file__ the absolute path (cwd joined, as
                CPython >= 3.9 gives it), __spec__ None, __package__ None, __cached__ None,
                __annotations__ {},
                a SourceFileLoader; it replaces sys.modules["__main__"], so pickling and
                multiprocessing's spawn re-import the script as they would under python3
Exit status: SystemExit and KeyboardInterrupt pass through untouched (so `sys.exit(3)` exits 3,
Ctrl-C ends by SIGINT); any other exception prints its traceback through sys.excepthook (this
wrapper's frame left out) and exits 1, as python3 does. A directory or zip with __main__.py
runs through runpy.run_path, as python3 would. 2: no script given or not readable.
Standard library only.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import os
import runpy
import sys
import types
from typing import Optional

from . import stacks

USAGE = "usage: python3 -m lingjun_slurm.injob.pyrun SCRIPT [ARGS...]"


def run(script: str, args: list[str]) -> int:
    sys.argv = [script, *args]
    if os.path.isdir(script) or (os.path.isfile(script) and _is_zip(script)):
        _drop_path0()
        runpy.run_path(script, run_name="__main__")  # inserts the directory / zip as sys.path[0]
        return 0
    abs_file = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    try:
        with open(script, "rb") as fh:
            source = fh.read()
    except OSError as exc:
        print(f"{sys.executable}: can't open file {abs_file!r}: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr)
        return 2
    if not sys.flags.safe_path:
        _drop_path0()
        sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    code = compile(source, abs_file, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=abs_file, __cached__=None, __spec__=None, __package__=None, __annotations__={},
                         __loader__=importlib.machinery.SourceFileLoader("__main__", abs_file),
                         __builtins__=builtins)
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        tb = tb.tb_next if tb is not None else None  # this wrapper's frame
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        return 1
    return 0


def _is_zip(path: str) -> bool:
    import zipfile

    return zipfile.is_zipfile(path)


def _drop_path0() -> None:
    """Remove the working directory that `python3 -m` put first on sys.path."""
    if sys.path and not sys.flags.safe_path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    stacks.install()
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
