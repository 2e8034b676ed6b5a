"""Issue 30 item 3: the report page of a real run, loaded by Debian's headless Chromium.

The run is the README's main job (examples/tiny-gpt.yaml, local executor) cut to 40 iterations
so it takes seconds; `report` writes its page; Chromium (driven by chromedriver through selenium,
both on 127.0.0.1) loads it as file://, and the test reads the browser's own log (no errors), lets
the browser parse the embedded JSON, and takes a screenshot of the whole page in which every chart
<img> must show its data: the colours charts.py draws each series in, spread across the image's
box as a line or bar is (a legend's sample is a few pixels wide), read from the screenshot's
pixels, not from the PNG files.

Chromium and chromedriver: Debian's `chromium` and `chromium-driver`; selenium from PyPI (the test
extra). Without them the browser test is skipped, except under CI (env CI set), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import cli, submitted_run_id

from .layout import CHART_COLOURS, TAB, border_ink, colour_columns

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WIDTH = 1200  # CSS pixels: the page's 70em column (1120 px) and its 880-px charts fit unscaled


def need_browser() -> Any:
    """selenium's webdriver, or skip (fail under CI) naming what is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
        missing.append("selenium (pip install selenium)")
    if missing:
        why = "the browser test needs " + ", ".join(missing) + " (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI installs them (.ci/run)", pytrace=False)
        pytest.skip(why)
    return webdriver


@pytest.fixture(scope="module")
def webdriver() -> Any:
    """selenium's webdriver module; asked for before `report`, so a skip costs no run."""
    return need_browser()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report directory of the README's main job, cut short (40 iterations, 2 evaluations,
    2 checkpoints), run with the local executor."""
    tmp = tmp_path_factory.mktemp("browser")
    text = (REPO / "examples" / "tiny-gpt.yaml").read_text().replace("/tmp/lingjun-slurm/tiny-gpt", str(tmp / "w"))
    for old, new in (("iterations: 300", "iterations: 40"), ("log_interval: 20", "log_interval: 2"),
                     ("eval_interval: 100", "eval_interval: 20"), ("save_interval: 100", "save_interval: 20"),
                     ("--docs 2000", "--docs 300")):
        assert text.count(old) == 1, old  # the example changed: adjust the cut
        text = text.replace(old, new)
    spec = tmp / "tiny-gpt.yaml"
    spec.write_text(text)
    env = {"LINGJUN_STATE_DIR": str(tmp / "state")}
    run_id = submitted_run_id(cli("submit", str(spec), "--executor", "local", env=env, timeout=600).stdout)
    cli("report", run_id, "-o", str(tmp / "report"), env=env)
    return tmp / "report"


def browse(webdriver: Any, page: Path, shot: Path) -> dict[str, Any]:
    """Load the page in headless Chromium; what the browser saw: its log, the tables' empty rows,
    each <img>'s box and state, the embedded data as JSON.parse read it, the resources it loaded;
    a screenshot of the whole page (1 CSS pixel = 1 device pixel, sRGB) at `shot`."""
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--user-data-dir={shot.parent / 'chromium-profile'}", f"--window-size={WIDTH},900",
                "--force-device-scale-factor=1", "--force-color-profile=srgb", "--hide-scrollbars",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-extensions"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER, service_args=["--allowed-ips=127.0.0.1"]))
    try:
        driver.get(page.as_uri())
        seen = driver.execute_script("""
            const imgs = [...document.images].map(i => {
              const r = i.getBoundingClientRect();
              return {alt: i.alt, complete: i.complete, natural: [i.naturalWidth, i.naturalHeight],
                      box: [r.left + scrollX, r.top + scrollY, r.width, r.height]};
            });
            const empty = [...document.querySelectorAll('tr')]
              .filter(tr => ![...tr.cells].some(c => c.textContent.trim())).map(tr => tr.outerHTML);
            let data = null, error = null;
            try { data = JSON.parse(document.getElementById('report-data').textContent); }
            catch (e) { error = String(e); }
            return {imgs, empty, data, error, height: document.documentElement.scrollHeight,
                    links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
                    resources: performance.getEntriesByType('resource').map(r => r.name)};
        """)
        # The whole page in one viewport, one device pixel per CSS pixel (Chrome DevTools Protocol,
        # Emulation.setDeviceMetricsOverride): the boxes above are the screenshot's coordinates.
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": WIDTH, "height": seen["height"], "deviceScaleFactor": 1, "mobile": False})
        assert driver.save_screenshot(str(shot))
        seen["log"] = driver.get_log("browser")
    finally:
        driver.quit()
    return seen


def drawn(shot: Path, box: list[float], colours: list[str]) -> dict[str, float]:
    """For each colour: the share of the image box's width that its pixels span in the screenshot
    (a line or bar drawn across the axes spans most of it, a legend sample a few per cent)."""
    from PIL import Image

    x, y, w, h = (round(v) for v in box)
    img = Image.open(shot).convert("RGB").crop((x, y, x + w, y + h))
    out = {}
    for name in colours:
        cols = colour_columns(img, TAB[name])
        out[name] = (max(cols) - min(cols)) / w if cols else 0.0
    return out


def coloured_pixels(shot: Path, box: list[float]) -> int:
    """Pixels in the box that are neither white, gray nor black (axes, ticks and text are)."""
    from PIL import Image

    x, y, w, h = (round(v) for v in box)
    img = Image.open(shot).convert("RGB").crop((x, y, x + w, y + h))
    raw = img.tobytes()
    return sum(1 for i in range(0, len(raw), 3) if max(raw[i:i + 3]) - min(raw[i:i + 3]) >= 60)


def test_the_report_page_in_chromium(webdriver: Any, report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "page.png"
    seen = browse(webdriver, report / "index.html", shot)
    errors = [e for e in seen["log"] if e.get("level") in ("SEVERE", "WARNING")]
    assert errors == [], f"the browser's console: {errors}"
    # The embedded data as the browser's strict JSON.parse reads it (NaN would throw).
    assert seen["error"] is None and seen["data"] == json.loads((report / "report-data.json").read_text())
    assert seen["empty"] == [], "table rows without any text"
    # Self-contained: nothing fetched (the charts are data: URIs); the links name the PNGs beside it.
    assert [r for r in seen["resources"] if not r.startswith("data:")] == []
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert sorted(seen["links"]) == pngs and {"loss.png", "lr.png", "throughput.png", "timeline.png"} <= set(pngs)
    assert len(seen["imgs"]) == len(pngs)
    for img in seen["imgs"]:
        assert img["complete"] and img["natural"][0] > 0, f"{img['alt']}: not decoded"
        # shown at its own size (not squeezed), inside the screenshot
        assert abs(img["box"][2] - img["natural"][0]) <= 1 and img["box"][1] + img["box"][3] <= seen["height"]
    from PIL import Image

    assert Image.open(shot).size == (WIDTH, seen["height"])
    by_alt = {img["alt"]: img for img in seen["imgs"]}
    from lingjun_slurm.report.page import CAPTIONS

    for name in pngs:
        img = by_alt[CAPTIONS.get(name, name)]
        assert coloured_pixels(shot, img["box"]) >= 200, f"{name}: no data drawn in the screenshot"
        assert border_ink(report / name) == [], f"{name}: something cut off at the chart's edge"
        if name in CHART_COLOURS:
            spans = drawn(shot, img["box"], CHART_COLOURS[name])
            # goodput.png's green is the productive part of a stacked bar: its share of the run (about half
            # of this short run); a legend's sample spans about 0.04
            least = 0.1 if name == "goodput.png" else 0.3
            assert min(spans.values()) >= least, f"{name}: a series is missing in the screenshot: {spans}"


def test_report_runs_on_what_the_readme_installs(report: Path, tmp_path: Path) -> None:
    """Every module the `report` command loads (sys.modules at its end, all of them, not only its
    own imports) comes from the standard library, lingjun-slurm, or a distribution that the
    README's main-job command installs (`pip install -e '.[megatron,plot]'`) or one of their
    dependencies as installed here; tests/unit/test_readme_installs.py checks report's own imports."""
    from importlib import metadata

    from packaging.requirements import Requirement

    from tests.unit.test_readme_installs import _requirements

    readme = (REPO / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "submit examples/tiny-gpt.yaml --executor local" in ln)
    extras = line.split("pip install -q -e '.[", 1)[1].split("]", 1)[0].split(",")
    allowed, todo = set(), [*(_requirements(extras))]
    while todo:  # the installed dependency closure (each distribution's own Requires-Dist)
        name = todo.pop().lower().replace("_", "-")
        if name in allowed:
            continue
        allowed.add(name)
        try:
            reqs = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r.name for r in map(Requirement, reqs) if not r.marker or r.marker.evaluate({"extra": ""})]
    run_id = json.loads((report / "report-data.json").read_text())["run"]["run_id"]
    state = report.parent / "state"
    probe = ("import json, runpy, sys\n"
             f"sys.argv = ['lingjun-slurm', 'report', {run_id!r}, '-o', {str(tmp_path / 'again')!r}]\n"
             "try:\n    runpy.run_module('lingjun_slurm.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    assert not e.code, e.code\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LINGJUN_STATE_DIR": str(state)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.splitlines()[-1])
    owners = metadata.packages_distributions()
    # sitecustomize: the test session's write guard (tests/hermetic_hook.py); the editable install's finder
    ours = {"lingjun_slurm", "sitecustomize", "__main__"}
    outside = {m: owners.get(m) for m in loaded
               if m not in sys.stdlib_module_names and m not in ours
               and not m.startswith(("__editable__", "_sysconfigdata_"))  # the stdlib's, named per platform
               and not any(d.lower().replace("_", "-") in allowed for d in owners.get(m, []))}
    assert "matplotlib" in loaded and outside == {}, f"report loaded modules the README does not install: {outside}"
