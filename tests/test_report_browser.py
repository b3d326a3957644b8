"""The HTML report in a real browser: Debian's headless `chromium` opens the report the analysis
stage writes and checks that every plot image decodes and that nothing is fetched from the network.

The browser cannot reach anything: every host name resolves to nothing and every http/https/ws
request (IP literals and loopback included) goes to a proxy that cannot be resolved. An attempt
still shows up in the page's Resource Timing entries, which a script added to a copy of the page
reads on `load`, together with each image's state, and writes into an attribute that
`--dump-dom` prints. data: URLs create no entry; any entry that is not a file: URL is a fetch
from the network. (WebSockets make no entry, but opening one takes a script, and the report has
none; the verdict script is the only one.)
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from html import unescape
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscale.report.stage import run_stage
from batchscale.schemas import RunStatus, TrialStatus, make_table

pytestmark = pytest.mark.slow

VERDICT = "data-browser-verdict"
# Synchronous on `load` (every image has then loaded or failed): a verdict awaiting
# `image.decode()` can come after headless chromium's virtual time has run out, and is lost.
VERDICT_SCRIPT = f"""<script>
addEventListener("load", () => document.documentElement.setAttribute("{VERDICT}", JSON.stringify({{
  images: [...document.images].map((image) => ({{
    src: image.src.slice(0, 60), complete: image.complete, naturalWidth: image.naturalWidth}})),
  fetched: performance.getEntriesByType("resource").map((entry) => entry.name),
  card_bottom_px: (() => {{
    const card = document.querySelector(".recommendation");
    return card ? card.getBoundingClientRect().bottom + scrollY : null;
  }})(),
}})));
</script>
"""
OFFLINE_FLAGS = ["--host-resolver-rules=MAP * ~NOTFOUND",  # no host name resolves
                 "--proxy-server=http://proxy.invalid:1",  # nor does the proxy every request
                 "--proxy-bypass-list=<-loopback>"]  # takes, loopback included
BROWSER_TIMEOUT_S = 120
WINDOW = (1280, 900)
"""A laptop's browser window: the answer must be on the first screen."""
PNG_1PX = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGA"
           "WjR9awAAAABJRU5ErkJggg==")


@dataclass
class Verdict:
    """What the browser saw once the page had loaded."""

    images: list[dict]  # src (first 60 characters), complete, naturalWidth
    fetched: list[str]  # URL of every resource the page requested (Resource Timing)
    card_bottom_px: float | None = None  # where the recommendation box ends on the page

    def problems(self) -> list[str]:
        found = [] if self.images else ["the page has no <img>"]
        found += [f"image did not decode: {image}" for image in self.images
                  if not (image["complete"] and image["naturalWidth"] > 0)]
        found += [f"fetched from the network: {url}" for url in self.fetched
                  if not url.startswith(("data:", "file:"))]
        return found


def open_offline(chromium: str, page: Path) -> Verdict:
    """Load a copy of `page` (beside it, so relative references resolve alike) with the verdict
    script added, in headless chromium with no network; return what the script recorded."""
    html = page.read_text()
    body_end = html.rfind("</body>")
    checked = page.with_name(f"{page.stem}.browser-check.html")
    checked.write_text(html[:body_end] + VERDICT_SCRIPT + html[body_end:] if body_end >= 0
                       else html + VERDICT_SCRIPT)
    with tempfile.TemporaryDirectory() as profile:  # a fresh one: a profile another chromium
        # still holds would hand the page to that browser and print nothing
        command = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                   "--disable-dev-shm-usage", "--disable-background-networking",
                   "--disable-component-update", f"--user-data-dir={profile}", *OFFLINE_FLAGS,
                   f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000",
                   "--dump-dom", checked.as_uri()]
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=BROWSER_TIMEOUT_S)
    found = re.search(rf'{VERDICT}="([^"]*)"', result.stdout)
    assert found, (f"chromium wrote no verdict for {checked} (exit code {result.returncode}):\n"
                   f"{result.stderr[-2000:]}")
    return Verdict(**json.loads(unescape(found[1])))


# --------------------------------------------------------------- the report on small tables

S_MIN, E_MIN = 100.0, 6400.0  # steps to target S(B) = S_min + E_min / B, so B_crit = 64
BATCHES = (4, 16, 64, 256, 1024)
ENV = {"run_id": "browser", "config_hash": "0123456789abcdef", "experiment": "browser-check",
       "workload": "digits-mlp", "git_commit": "abc123", "batchscale_version": "0.1.0",
       "torch_version": "2.14.1", "python_version": "3.11", "device_name": "cpu", "threads": 2,
       "world_size": 1}


def sweep_rows() -> list[dict]:
    rows = []
    for mode, slowdown in (("synthetic", 1.0), ("real", 1.2)):
        for batch in BATCHES:
            step_s = slowdown * (1e-3 + 2e-6 * batch)
            rows.append({"input_mode": mode, "batch_size": batch, "status": TrialStatus.OK,
                         "precision": "fp32", "timed_steps": 20, "step_time_median_s": step_s,
                         "samples_per_s": batch / step_s,
                         "peak_memory_bytes": 50_000_000 + 100_000 * batch})
    rows.append({"input_mode": "synthetic", "batch_size": 4096, "status": TrialStatus.OOM,
                 "precision": "fp32", "timed_steps": 0, "error": "CUDA out of memory"})
    return rows


def runs_rows() -> list[dict]:
    """Two LR rules and two seeds on one worker, and two batches on two workers (so the
    data-parallel efficiency plot is drawn too); every trial reaches the target."""
    trials = [(rule, batch, seed, 1) for rule in ("linear", "sqrt") for batch in BATCHES
              for seed in (0, 1)] + [("linear", batch, 0, 2) for batch in (64, 256)]
    rows = []
    for rule, batch, seed, workers in trials:
        steps = round((S_MIN + E_MIN / batch) * (1.3 if rule == "sqrt" else 1.0)
                      * (1 + 0.02 * seed))
        rows.append({"trial_id": f"{rule}-{batch}-{seed}-w{workers}", "batch_size": batch,
                     "lr_rule": rule, "lr": 0.05, "seed": seed, "workers": workers,
                     "status": RunStatus.REACHED, "steps_run": steps, "steps_to_target": steps,
                     "examples_to_target": steps * batch,
                     "time_to_target_s": steps * 1e-3 / workers, "final_val_accuracy": 0.95,
                     "target_val_accuracy": 0.95, "b_simple": 50.0 + seed,
                     "train_time_s": steps * 1e-3 / workers})
    return rows


def curves_rows(runs: list[dict]) -> list[dict]:
    return [{"trial_id": run["trial_id"], "batch_size": run["batch_size"],
             "lr_rule": run["lr_rule"], "seed": run["seed"], "step": step,
             "examples_seen": step * run["batch_size"], "train_time_s": step * 1e-3,
             "train_loss": 2.0 / (1 + step), "val_accuracy": 0.95 * step / run["steps_run"],
             "lr": run["lr"], "b_simple": 10.0 + step}
            for run in runs for step in range(0, run["steps_run"] + 1, run["steps_run"] // 4)]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report.html as the analysis stage writes it from small sweep/curves/runs tables."""
    folder = tmp_path_factory.mktemp("report")
    runs = runs_rows()
    paths = {}
    for kind, rows in (("sweep", sweep_rows()), ("curves", curves_rows(runs)), ("runs", runs)):
        paths[kind] = str(folder / f"{kind}.parquet")
        pq.write_table(make_table(kind, rows, ENV), paths[kind])
    config_json = json.dumps({"name": "browser-check", "analysis": {"bootstrap_samples": 20}})
    run_stage(config_json, "browser", paths["sweep"], paths["curves"], paths["runs"],
              str(folder / "analysis.parquet"), str(folder / "report.html"),
              str(folder / "analysis.md"))
    return folder / "report.html"


def test_report_plots_decode_and_nothing_is_fetched(chromium, report):
    verdict = open_offline(chromium, report)
    assert verdict.problems() == []
    assert len(verdict.images) == report.read_text().count("<img ")


def test_the_answer_is_on_the_first_screen(chromium, report):
    """At 1,280 × 900 px, the recommendation box ends within the first screen."""
    verdict = open_offline(chromium, report)
    assert verdict.card_bottom_px is not None
    assert 0 < verdict.card_bottom_px <= WINDOW[1], verdict.card_bottom_px
    print(f"recommendation box ends at {verdict.card_bottom_px:.0f} px")


def test_detector_flags_network_images_broken_data_and_stylesheet_urls(chromium, tmp_path):
    page = tmp_path / "bad.html"
    page.write_text(
        "<!doctype html><html><head><style>body { background: url(https://example.invalid/b.png) }"
        f'</style></head><body><img src="data:image/png;base64,{PNG_1PX}">'
        '<img src="http://example.invalid/x.png"><img src="data:image/png;base64,AAAAbroken">'
        '<img src="http://127.0.0.1:9/loopback.png"></body></html>')
    verdict = open_offline(chromium, page)
    assert [image["naturalWidth"] > 0 for image in verdict.images] == [True, False, False, False]
    assert sorted(p.split(":", 1)[0] for p in verdict.problems()) == (
        ["fetched from the network"] * 3 + ["image did not decode"] * 3)
    assert set(verdict.fetched) == {"https://example.invalid/b.png",
                                    "http://example.invalid/x.png",
                                    "http://127.0.0.1:9/loopback.png"}


def test_detector_flags_a_page_without_images(chromium, tmp_path):
    page = tmp_path / "empty.html"
    page.write_text("<!doctype html><html><body><p>no plots</p></body></html>")
    assert open_offline(chromium, page).problems() == ["the page has no <img>"]
