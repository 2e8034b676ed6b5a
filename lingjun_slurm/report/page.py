"""The report's HTML: one file, its charts embedded (data: URIs) and also written beside it, and
the data it was drawn from embedded as JSON (<script type="application/json" id="report-data">),
so the page is all a reader needs and a script can read the numbers back."""

from __future__ import annotations

import base64
import datetime
import html
import json
from pathlib import Path
from typing import Any

from .. import __version__
from ..common.bytesfmt import human_bytes

CAPTIONS = {"loss.png": "Training and validation loss", "lr.png": "Learning rate",
            "throughput.png": "Throughput (and MFU on GPUs)", "memory.png": "GPU memory peak",
            "timeline.png": "Stages: queue wait and run time, one bar per attempt",
            "goodput.png": "Goodput: each attempt's allocated hours by bucket"}


def _when(epoch: Any) -> str:
    if not isinstance(epoch, (int, float)):
        return ""
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _secs(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return ""
    value = int(round(value))
    return f"{value // 3600}:{value % 3600 // 60:02d}:{value % 60:02d}"


def _size(n: Any) -> str:
    return human_bytes(n) if isinstance(n, int) else ""


def _table(head: list[str], rows: list[list[Any]]) -> str:
    e = html.escape
    out = ["<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(f"<td>{e('' if c is None else str(c))}</td>" for c in row) + "</tr>" for row in rows]
    return "\n".join(out + ["</tbody></table>"])


def _pairs(rows: list[list[Any]]) -> str:
    """A table of name/value rows: each name is its row's header (<th scope="row">), and there is
    no header row (the summary's was two empty cells, an empty grey bar at the top of the page)."""
    e = html.escape
    out = ["<table><tbody>"]
    out += [f'<tr><th scope="row">{e(str(k))}</th><td>{e("" if v is None else str(v))}</td></tr>' for k, v in rows]
    return "\n".join(out + ["</tbody></table>"])


def _goodput_html(ledger: dict[str, Any], charts: list[str], out: Path) -> str:
    """The Goodput section: the ledger's summary (hours per bucket per kind, the waits, goodput, cost) and
    goodput.png (lingjun_slurm/injob/host/ledger.py; docs/report.md "Goodput ledger")."""
    e = html.escape
    if "error" in ledger or "gpu" not in ledger:
        return f"<p>No ledger: {e(str(ledger.get('error', 'not computed')))}</p>"
    rows = []
    for kind in ("gpu", "cpu"):
        part = ledger[kind]
        alloc = part["allocated_seconds"]
        if alloc <= 0:
            continue
        rows.append([f"{kind.upper()}-hours allocated", "", f"{alloc / 3600:.4f}", "100.0%"])
        rows += [[kind.upper(), name, f"{v / 3600:.4f}", f"{100 * v / alloc:.1f}%"]
                 for name, v in part["buckets"].items() if v > 0]
    rows += [["wait", name, f"{v / 3600:.4f}", "(no allocation)"] for name, v in ledger["waits"].items()]
    head = (f"<p>Goodput {100 * ledger['goodput']:.1f}% (productive / allocated {ledger['goodput_of'].upper()}-hours; "
            f"allocation from {e(str(ledger.get('source') or '-'))})"
            + (f"; cost {ledger['cost']:.2f} at {ledger['gpu_hour_price']:g} per GPU-hour" if ledger.get("cost")
               is not None else "") + (f". {e(ledger['note'])}" if ledger.get("note") else "") + "</p>")
    chart = ""
    if "goodput.png" in charts:
        data = base64.b64encode((out / "goodput.png").read_bytes()).decode()
        cap = e(CAPTIONS["goodput.png"])
        chart = (f'<figure><img alt="{cap}" src="data:image/png;base64,{data}"><figcaption>{cap} '
                 '(<a href="goodput.png">goodput.png</a>)</figcaption></figure>')
    return head + _table(["kind", "bucket", "hours", "share"], rows) + chart


def render(doc: dict[str, Any], charts: list[str], out: Path, command: str) -> str:
    """The page's text."""
    e = html.escape
    run = doc["run"]
    train = doc["metrics"]["train"]
    last = train[-1] if train else None
    summary = [["run id", run["run_id"]], ["name", run["name"]], ["executor", run["executor"]],
               ["host", run["host"]], ["run directory", run["run_dir"]], ["created", _when(run["created_at"])]]
    if last:
        summary.append(["last iteration", last["iteration"]])
        if isinstance(last.get("loss"), (int, float)):
            summary.append(["last loss", f"{last['loss']:.4f}"])
        tps = sorted(r["tokens_per_s"] for r in train if isinstance(r.get("tokens_per_s"), (int, float)))
        if tps:
            summary.append(["tokens/s (median)", f"{tps[len(tps) // 2]:,.0f}"])
    if run.get("slurm_error"):
        summary.append(["Slurm", f"did not answer: {run['slurm_error']} (states are UNKNOWN)"])
    every = doc["metrics"].get("train_every")
    if every:
        summary.append(["embedded data", f"every {every}th train record (report-data.json has all)"])
    stages = _table(["stage", "state", "jobs", "submitted", "queue wait", "run time", "attempts", "requeues",
                     "restarts", "exit", "reason"],
                    [[s["name"], s["state"], " ".join(s["job_ids"]), _when(s["submitted_at"]),
                      _secs(s["queue_wait_s"]), _secs(s["run_s"]), len(s["attempts"]), s["requeues"],
                      s["restarts"], s["exit_code"], s["reason"]] for s in doc["stages"]])
    ck = doc["checkpoints"]
    if ck.get("readable"):
        ckpt = _table(["checkpoint", "iteration", "files", "size", "complete", "hash manifest", "tracker"],
                      [[c["name"], c["iteration"], c["files"], _size(c["bytes"]), "yes" if c["complete"] else "no",
                        "yes" if c["manifest"] else "no", "latest" if c["latest"] else ""] for c in ck["iterations"]])
        if ck.get("damaged_aside"):
            ckpt += f"<p>Damaged and moved aside: {e(', '.join(ck['damaged_aside']))}</p>"
        ckpt = f"<p>{e(str(ck['dir']))}</p>" + ckpt
    else:
        ckpt = (f"<p>Checkpoints in {e(str(ck.get('dir')))} are not readable from here (a remote run, or none yet): "
                f"<code>lingjun-slurm checkpoint list DIR</code> on the cluster lists them.</p>")
    events = _table(["event", "iteration", "details"],
                    [[r["type"], r.get("iteration"),
                      ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("type", "iteration", "time", "run_id"))]
                     for r in doc["metrics"]["events"]])
    nccl = doc.get("nccl_tests") or []
    if nccl:
        nccl_html = _table(["report", "op", "ranks", "hosts", "avg busbw (GB/s)", "peak busbw (GB/s)", "verdict",
                            "reason"],
                           [[n["name"], o["op"], o["ranks"], o["hosts"], o["avg_busbw"], o["peak_busbw"], o["verdict"],
                             o["reason"]] for n in nccl for o in n["ops"]])
    else:
        nccl_html = (f"<p>None attached: <code>lingjun-slurm nccl-test --outdir {e(run['run_dir'])}/nccl-tests/NAME</code> "
                     "puts one here.</p>")
    figures = []
    for name in [c for c in charts if c != "goodput.png"]:  # goodput.png: in its own section
        data = base64.b64encode((out / name).read_bytes()).decode()
        figures.append(f'<figure><img alt="{e(CAPTIONS.get(name, name))}" src="data:image/png;base64,{data}">'
                       f'<figcaption>{e(CAPTIONS.get(name, name))} (<a href="{e(name)}">{e(name)}</a>)</figcaption>'
                       "</figure>")
    # No "<", ">" or "&" inside the script element at all (JSON escapes them): nothing in the data
    # can end it or switch the parser's script-data states (HTML Living Standard 13.2.5.4 ff.).
    payload = json.dumps(doc, sort_keys=True, allow_nan=False)
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(run['run_id'])}: lingjun-slurm report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; font-size: 0.9em; }}
th {{ background: #f2f2f2; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
footer {{ color: #666; font-size: 0.8em; margin-top: 2em; }}
</style></head><body>
<h1>Run {e(run['run_id'])}</h1>
{_pairs(summary)}
<h2>Stages</h2>
{stages}
<h2>Goodput</h2>
{_goodput_html(doc.get("goodput") or {}, charts, out)}
<h2>Training</h2>
{''.join(figures) if figures else '<p>No training metrics in this run (metrics.jsonl is written by the builtin trainer).</p>'}
<h2>Events</h2>
{events}
<h2>Checkpoints</h2>
{ckpt}
<h2>NCCL tests</h2>
{nccl_html}
<footer>lingjun-slurm {e(__version__)}: <code>{e(command)}</code></footer>
<script type="application/json" id="report-data">{payload}</script>
</body></html>
"""


def embedded_data(page: str) -> dict[str, Any]:
    """The JSON a page embeds (for tests and scripts)."""
    start = page.index('<script type="application/json" id="report-data">') + len(
        '<script type="application/json" id="report-data">')
    return json.loads(page[start:page.index("</script>", start)])
