"""`lingjun-slurm report RUN [-o DIR]`: one HTML page of a run, with PNG charts beside it (docs/report.md)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

import click

from .remote import EXIT_CODES, Connections, destination, open_run, remote_options


@click.command("report", epilog=EXIT_CODES)
@click.argument("run")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for index.html and the PNGs (default: ./report-<run id>).")
@remote_options
def report(run: str, outdir: Optional[Path], host: Optional[str], cluster: Optional[str],
           accept_new_host_key: bool) -> None:
    """Write a run's report: loss, validation loss, learning rate, tokens/s and MFU curves, the
    stages' queue wait, run time, requeues and restarts, and the checkpoints; the data it shows
    is embedded in the page as JSON. A remote run is read over SSH; the page is written here."""
    import time

    from ..common.errors import EXIT_FAILURE, UsageError
    from ..report import charts, data, page
    from ..status import StatusCollector

    charts.pyplot()  # no matplotlib: one line, before anything is written
    with Connections(destination(host, cluster, accept_new_host_key)) as conns:
        _entry, t, m = open_run(run, conns)
        status = StatusCollector(t).collect([m])[0]
        doc = data.finite(data.collect(t, m, status))
    out = outdir or Path(f"report-{m.run_id}")
    argv = ["lingjun-slurm", "report", run] + (["-o", str(outdir)] if outdir else []) + \
        (["--host", host] if host else []) + (["--cluster", cluster] if cluster else [])
    try:
        out.mkdir(parents=True, exist_ok=True)
        names = charts.draw(doc, out, time.time())
        (out / "index.html").write_text(page.render(data.thinned(doc), names, out, shlex.join(argv)),
                                        encoding="utf-8")
        (out / "report-data.json").write_text(json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n",
                                              encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    click.echo(f"{out / 'index.html'} ({len(names)} charts; data: {out / 'report-data.json'})")
    if doc["run"].get("slurm_error"):  # as status: shown, then exit 1
        click.echo(f"lingjun-slurm: Slurm did not answer: {doc['run']['slurm_error']}; the stages' states in the "
                   "report are UNKNOWN", err=True)
        raise SystemExit(EXIT_FAILURE)
