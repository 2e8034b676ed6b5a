"""Terminal output with rich: the status table in colour, a live `status --watch`, and a progress
line under `submit --executor local` and `logs --follow`.

rich draws only where it helps a person (docs/submitting.md, "Terminal output"):

- the stream is a terminal (isatty), and
- NO_COLOR is unset or empty (https://no-color.org: "when present and not an empty string"; rich's
  own Console reads it the same way, rich/console.py in rich 15.0.0: ``NO_COLOR", "") != ""``), and
- TERM is not "dumb" or "unknown" (rich/console.py, ``Console.is_dumb_terminal``).

Anywhere else the commands print their plain text, byte for byte what scripts and tests parse,
and `--json` never comes here. rich is imported only inside the functions that draw, so a
command that prints plain text never loads it.
"""

from __future__ import annotations

import codecs
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, TextIO

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from ..status import RunStatus

# State -> rich style. Ended well: green; running: bold cyan; waiting (PENDING, REQUEUED, ...):
# yellow; failed in any way: bold red; cancelled: magenta; not known (UNKNOWN, STALE): dim.
STATE_STYLES: dict[str, str] = {
    "COMPLETED": "green",
    "RUNNING": "bold cyan",
    "COMPLETING": "cyan",
    "CONFIGURING": "cyan",
    "PENDING": "yellow",
    "REQUEUED": "yellow",
    "REQUEUE_HOLD": "yellow",
    "REQUEUE_FED": "yellow",
    "RESV_DEL_HOLD": "yellow",
    "SUSPENDED": "yellow",
    "STOPPED": "yellow",
    "RESIZING": "yellow",
    "SIGNALING": "yellow",
    "STAGE_OUT": "yellow",
    "FAILED": "bold red",
    "TIMEOUT": "bold red",
    "NODE_FAIL": "bold red",
    "OUT_OF_MEMORY": "bold red",
    "BOOT_FAIL": "bold red",
    "DEADLINE": "bold red",
    "PREEMPTED": "red",
    "CANCELLED": "magenta",
    "NOT_SUBMITTED": "dim",
    "UNKNOWN": "dim",
}
TERMINAL_DUMB = ("dumb", "unknown")


def use_rich(stream: Optional[TextIO] = None, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether to draw with rich on stream (default sys.stdout): a TTY, NO_COLOR unset or empty,
    TERM not dumb."""
    env = os.environ if environ is None else environ
    out = sys.stdout if stream is None else stream
    if env.get("NO_COLOR", "") != "":
        return False
    if env.get("TERM", "").lower() in TERMINAL_DUMB:
        return False
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or not a real file
        return False


def state_style(state: str) -> str:
    return STATE_STYLES.get(state, "")


def console(stderr: bool = False, guarded: bool = False) -> "Console":
    """guarded: writes to a terminal that went away are dropped (see Guarded), for the live displays."""
    from rich.console import Console

    if guarded:
        return Console(file=Guarded(sys.stderr if stderr else sys.stdout), highlight=False, soft_wrap=False)
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


class Guarded:
    """A stream whose writes stop, silently, once the terminal behind it is gone (EIO after a
    SIGHUP, a closed file): rich's refresh thread then never dies with a traceback on stderr, and
    the caller learns it from `gone`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._stream.write(text)
            except (OSError, ValueError):
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.gone = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _check(out: "Console") -> None:
    """OSError once the terminal is gone: the local runner then silences its echo, logs --follow ends."""
    if isinstance(out.file, Guarded) and out.file.gone:
        raise BrokenPipeError("the terminal went away")


# --- the status table -----------------------------------------------------------------------
# REASON as a column needs at least this many cells; on a terminal too narrow for that beside the
# other columns at their natural width, each stage's REASON (with NODES and RESTARTS) goes on
# lines of its own under the table, folded to the terminal's width (issue 26 item 10).
REASON_MIN_WIDTH = 24
_GAP = 2  # cells between two columns (padding 1 on each side, pad_edge off)
_INDENT = 2  # the table's left padding under the run's header


class _StatusTables:
    """status_renderable's output: laid out when rich knows the width (__rich_console__), so the
    one-shot table, `status --watch` and a resized terminal all get the layout that fits."""

    def __init__(self, runs: "Sequence[RunStatus]") -> None:
        self.runs = list(runs)

    def __rich_console__(self, console: "Console", options: Any) -> Any:
        for run in self.runs:
            yield from _run_table(run, options.max_width)


def _run_table(run: "RunStatus", width: int) -> list[Any]:
    from rich import box
    from rich.cells import cell_len
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    from ..status import run_banner, stage_cells

    head = Text.assemble(("run ", "bold"), (run.run_id, "bold"), f"  ({run.executor} on {run.host})")
    banner = run_banner(run)
    if banner:
        head.append(f"  {banner}", style="yellow")
    if not run.stages:  # its record cannot be read (the banner says why)
        return [head, Text("")]
    rows = []
    for s in run.stages:
        elapsed, code, reason = stage_cells(run, s)
        rows.append((s, [s.name, ",".join(s.job_ids) or "-", s.state, elapsed, code, str(s.restarts),
                         s.nodes or "-", reason]))
    headers = ["STAGE", "JOB", "STATE", "ELAPSED", "EXIT", "RESTARTS", "NODES", "REASON"]
    natural = [max([cell_len(h)] + [cell_len(cells[i]) for _s, cells in rows]) for i, h in enumerate(headers)]
    room = width - _INDENT
    full = sum(natural[:7]) + _GAP * 7 + REASON_MIN_WIDTH
    shown = 8 if full <= room else 5  # narrow: STAGE JOB STATE ELAPSED EXIT, the rest on lines below
    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False, collapse_padding=True)
    for i, h in enumerate(headers[:shown]):
        if h == "REASON":
            table.add_column(h, overflow="fold", min_width=REASON_MIN_WIDTH)
        else:  # never narrower than its header or its longest cell: no one-letter-per-line column
            table.add_column(h, no_wrap=True, min_width=natural[i],
                             justify="right" if h in ("ELAPSED", "EXIT", "RESTARTS") else "left")
    for s, cells in rows:
        styled: list[Any] = list(cells[:shown])
        styled[2] = Text(s.state, style=state_style(s.state))
        styled[4] = Text(cells[4], style="red" if s.exit_code else "")
        table.add_row(*styled)
    parts: list[Any] = [head]
    if shown == 8:
        return parts + [Padding(table, (0, 0, 1, _INDENT), expand=False)]
    parts.append(Padding(table, (0, 0, 0, _INDENT), expand=False))
    for s, cells in rows:
        more = [f"nodes {cells[6]}" if s.nodes else "", f"{s.restarts} restart{'s' if s.restarts != 1 else ''}"
                if s.restarts else "", cells[7]]
        detail = ", ".join(x for x in more if x)
        if detail:
            parts.append(Padding(Text.assemble((f"{s.name}: ", "bold"), detail, overflow="fold"),
                                 (0, 0, 0, _INDENT)))
    parts.append(Text(""))
    return parts


def status_renderable(runs: "Sequence[RunStatus]") -> "RenderableType":
    """The columns of status.format_table, one table per run, with a header per run and the
    state (and a non-zero exit code) coloured. Laid out for the console's width: every column at
    least as wide as its header and its longest cell, REASON folded; where REASON would get fewer
    than REASON_MIN_WIDTH cells (60 or 80 columns, say), it moves under the table."""
    from rich.text import Text

    if not runs:
        return Text("no runs")
    return _StatusTables(runs)


def print_status(runs: "Sequence[RunStatus]", out: Optional["Console"] = None) -> None:
    (out or console()).print(status_renderable(runs))


def watch_header(interval: float, notes: Iterable[str] = (), now: Optional[float] = None) -> "RenderableType":
    """The line above the --watch table: what it is, how often it refreshes, when it last did."""
    from rich.console import Group
    from rich.text import Text

    at = time.strftime("%H:%M:%S", time.localtime(time.time() if now is None else now))
    head = Text.assemble(("lingjun-slurm status --watch", "bold"),
                         f"  every {interval:g}s, last refresh {at}; Ctrl-C stops watching")
    return Group(head, *(Text(n, style="yellow") for n in notes), Text(""))


class StatusWatch:
    """`status --watch` on a terminal: one Live display, redrawn in place after each refresh; the
    last frame stays on the screen when watching ends."""

    def __init__(self, interval: float, out: Optional["Console"] = None) -> None:
        self.interval = interval
        self.out = out or console(guarded=True)
        self._live: Any = None

    def __enter__(self) -> "StatusWatch":
        from rich.live import Live
        from rich.text import Text

        self._live = Live(Text("reading the queue ..."), console=self.out, auto_refresh=False,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()
        return self

    def update(self, runs: "Sequence[RunStatus]", notes: Iterable[str] = ()) -> None:
        from rich.console import Group

        self._live.update(Group(watch_header(self.interval, notes), status_renderable(runs)), refresh=True)
        _check(self.out)

    def __exit__(self, *exc: object) -> None:
        try:
            self._live.stop()
        except (OSError, ValueError):  # the terminal went away
            pass


# --- the lines the local executor prints ----------------------------------------------------
def styled_line(line: str) -> Any:
    """A runner line ("12:00:01 train          RUNNING    job 3 ...") with its state word coloured."""
    from rich.text import Text

    text = Text(line)
    parts = line.split(None, 3)
    if len(parts) >= 3 and parts[2] in STATE_STYLES:
        start = line.find(parts[2], len(parts[0]) + 1 + len(parts[1]))
        text.stylize(state_style(parts[2]), start, start + len(parts[2]))
        text.stylize("dim", 0, len(parts[0]))
    return text


class _LiveLine:
    """One live line (a turning spinner and text()) under lines printed above it, on self.out;
    used as a context manager. A terminal gone (SIGHUP) when it stops is not an error: the run
    record says how the run ended."""

    out: "Console"
    _live: Any = None
    _spinner: Any = None

    def text(self) -> Any:
        raise NotImplementedError

    def _renderable(self) -> "RenderableType":
        from rich.spinner import Spinner

        if self._spinner is None:  # one spinner, so that it turns
            self._spinner = Spinner("dots", style="cyan")
        self._spinner.update(text=self.text())
        return self._spinner

    def __enter__(self) -> Any:
        from rich.live import Live

        self._live = Live(console=self.out, get_renderable=self._renderable, refresh_per_second=4, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()
        return self

    def _end(self) -> None:
        self._live.stop()

    def __exit__(self, *exc: object) -> None:
        try:
            self._end()
        except (OSError, ValueError):
            pass


class LocalProgress(_LiveLine):
    """Under `submit --executor local` on a terminal: the runner's state-change lines scroll as
    before (state words coloured) above one live line: a spinner, how many stages have ended, which
    are running and for how long the run has been going. tasks() gives (stage, state) pairs."""

    def __init__(self, run_id: str, tasks: Callable[[], Iterable[tuple[str, str]]] = lambda: (),
                 out: Optional["Console"] = None) -> None:
        self.run_id = run_id
        self.tasks = tasks
        self.out = out or console(guarded=True)
        self.started = time.monotonic()
        self._live: Any = None
        self._spinner: Any = None

    def summary(self) -> str:
        from ..common.timefmt import format_time

        stages: dict[str, list[str]] = {}
        for stage, state in list(self.tasks()):
            stages.setdefault(stage, []).append(state)
        ended = sum(1 for states in stages.values() if all(s in ("COMPLETED", "FAILED", "CANCELLED") for s in states))
        running = [n for n, states in stages.items() if "RUNNING" in states]
        failed = [n for n, states in stages.items() if "FAILED" in states]
        text = f"run {self.run_id}: {ended}/{len(stages)} stages ended"
        if running:
            text += f"; running {', '.join(running)}"
        if failed:
            text += f"; failed {', '.join(failed)}"
        return text + f"; {format_time(int(time.monotonic() - self.started))} (Ctrl-C cancels)"

    def text(self) -> str:
        return self.summary()

    def line(self, text: str) -> None:
        """Print one runner line above the live line (OSError as it comes: the runner silences it)."""
        self.out.print(styled_line(text), soft_wrap=True)  # long lines wrap as the terminal does
        _check(self.out)

class FollowView(_LiveLine):
    """Under `logs --follow` on a terminal: the log's lines as they arrive (its own colours kept,
    as rich's FileProxy decodes them: rich/file_proxy.py) above one live line: the file, the
    stage's state as last polled, how much has been read."""

    def __init__(self, path: str, stage: str, out: Optional["Console"] = None) -> None:
        self.path = path
        self.stage = stage
        self.state = "?"
        self.read = 0
        self.out = out or console(guarded=True)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._live: Any = None
        self._spinner: Any = None
        from rich.ansi import AnsiDecoder

        self._ansi = AnsiDecoder()

    def text(self) -> Any:
        from rich.text import Text

        return Text.assemble(f"following {self.path}: stage {self.stage} ",
                             (self.state, state_style(self.state)), f", {_size(self.read)} read (Ctrl-C stops)")

    def write(self, chunk: bytes) -> None:
        """Print the complete lines of chunk (the rest waits for its newline)."""
        from rich.text import Text

        self.read += len(chunk)
        data = self._pending + self._decoder.decode(chunk)
        head, sep, self._pending = data.rpartition("\n")
        if sep:
            # soft_wrap: a long line is the terminal's to wrap, never cut into lines by rich.
            self.out.print(Text("\n").join(self._ansi.decode_line(line) for line in head.split("\n")), soft_wrap=True)
            _check(self.out)

    def flush(self) -> None:
        """Print what is left after the last newline (the log's end)."""
        rest = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        if rest:
            self.out.print(self._ansi.decode_line(rest), soft_wrap=True)

    def _end(self) -> None:
        self.flush()
        self._live.stop()


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
