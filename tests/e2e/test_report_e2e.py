"""End to end: real ``distseg-train`` runs (1 process and 2 Horovod ranks), then
``distseg-report`` on their logs, then the HTML report in headless Chromium.

Each launch has a timeout, so a hang fails fast. The expected numbers are computed
here from the raw logs (with ``distseg.core.schema`` only), independently of ``analysis``.
"""

import html as htmllib
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from proc_group import horovodrun_cmd, run_group
from support import BIN, command_env, log_records

TIMEOUT = 300
pytestmark = pytest.mark.timeout(3 * TIMEOUT)


def _env():
    return command_env(MPLBACKEND="Agg")


def _run(cmd):
    out = run_group(cmd, timeout=TIMEOUT, env=_env())
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _records(run_dir, rank):
    return log_records(run_dir, rank)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Synthetic data, a 1-process run and a 2-rank Horovod run of 2 epochs each."""
    tmp = tmp_path_factory.mktemp("e2e")
    data = str(tmp / "tiny.h5")
    _run([f"{BIN}/distseg-data", "synth", "--out", data, "--cases", "4", "--size", "32",
          "--seed", "0"])
    r1, r2 = str(tmp / "R1"), str(tmp / "R2")
    args = ["--preset", "smoke", "--data", data, "--epochs", "2"]
    _run([f"{BIN}/distseg-train", *args, "--run-dir", r1])
    _run(horovodrun_cmd("distseg-train", *args, "--run-dir", r2))
    # A loss target that the 2-rank run reaches part-way: its 4th logged loss.
    target = [r["loss"] for r in _records(r2, 0) if r["type"] == "step"][3]
    out = str(tmp / "OUT")
    proc = _run([f"{BIN}/distseg-report", r1, r2, "--target-loss", str(target),
                 "--target-loss", "-1.5", "--out", out])
    return {"tmp": tmp, "data": data, "runs": {"R1": r1, "R2": r2}, "out": out,
            "target": target, "stdout": proc.stdout}


def _csv(study, name):
    return pd.read_csv(os.path.join(study["out"], name))


def test_time_per_epoch_and_scaling_of_real_runs(study):
    tpe = _csv(study, "time_per_epoch.csv")
    assert list(tpe["run"]) == ["R1", "R2"] and list(tpe["ranks"]) == [1, 2]
    assert list(tpe["nodes"]) == [1, 1] and list(tpe["epochs"]) == [2, 2]
    assert list(tpe["steady_epochs"]) == [1, 1]
    runs = [_records(study["runs"][r], 0)[0] for r in ("R1", "R2")]
    assert list(tpe["steps_per_epoch"]) == [r["steps_per_epoch"] for r in runs]
    assert runs[0]["dataset"]["train_samples"] == 48  # 4 cases of 16 slices, 1 for validation
    for run, row in zip(tpe["run"], tpe.itertuples()):
        epochs = {}
        for rank in range(row.ranks):
            for r in _records(study["runs"][run], rank):
                if r["type"] == "epoch":
                    epochs.setdefault(r["epoch"], []).append(r)
        steady = epochs[1]  # epoch 0 is warm-up
        train_s = max(r["train_time"] for r in steady)
        assert row.median_train_s == pytest.approx(train_s)
        assert row.warmup_train_s == pytest.approx(max(r["train_time"] for r in epochs[0]))
        assert row.median_epoch_s == pytest.approx(max(r["epoch_time"] for r in steady))
        assert row.throughput_samples_s == pytest.approx(
            sum(r["samples"] for r in steady) / train_s)
        assert row.samples_per_epoch == 48
    sc = _csv(study, "scaling.csv")
    assert list(sc["base"]) == ["R1", "R1"] and list(sc["scale"]) == [1, 2]
    assert sc["speedup"].iloc[1] == pytest.approx(
        tpe["median_train_s"].iloc[0] / tpe["median_train_s"].iloc[1])


def test_coverage_of_every_epoch_against_the_data_file(study):
    cov = _csv(study, "coverage.csv")
    assert len(cov) == 4 and cov["covered"].all() and cov["digest_matches"].all()
    assert set(cov["reference"]) == {"train split of the data file"}
    assert list(cov["ranks_logged"]) == [1, 1, 2, 2] and set(cov["samples"]) == {48}


def _steps_per_epoch(study, run):
    return _records(study["runs"][run], 0)[0]["steps_per_epoch"]


def test_loss_curve_and_hours_to_target(study):
    curve = _csv(study, "loss_vs_time.csv")
    counts = curve.groupby(["run", "series"]).size().to_dict()
    assert counts == {("R1", "train"): 2 * _steps_per_epoch(study, "R1"), ("R1", "val"): 2,
                      ("R2", "train"): 2 * _steps_per_epoch(study, "R2"), ("R2", "val"): 2}
    hours = _csv(study, "hours_to_target.csv")
    assert len(hours) == 4
    for run, run_dir in study["runs"].items():
        steps = [r for r in _records(run_dir, 0) if r["type"] == "step"]
        hit = next((r for r in steps if r["loss"] <= study["target"]), None)
        row = hours[(hours["run"] == run) & np.isclose(hours["target"], study["target"])].iloc[0]
        if hit is None:
            assert not row["reached"]
        else:
            assert row["reached"] and row["global_step"] == hit["global_step"]
            assert row["hours"] == pytest.approx(hit["t"] / 3600.0)
        never = hours[(hours["run"] == run) & (hours["target"] == -1.5)].iloc[0]
        assert not never["reached"] and never["result"] == "not reached"
    assert hours[hours["run"] == "R2"]["reached"].iloc[0]  # by construction of the target


def _samples_until(run_dir, ranks, global_step=None):
    """Samples of every rank's step records up to ``global_step`` (all when None)."""
    return sum(r["samples"] for rank in range(ranks) for r in _records(run_dir, rank)
               if r["type"] == "step" and (global_step is None or r["global_step"] <= global_step))


def test_samples_to_target_and_statistical_efficiency(study):
    eff = _csv(study, "statistical_efficiency.csv")
    hit = eff[np.isclose(eff["target"], study["target"])].set_index("run")
    for run, ranks in (("R1", 1), ("R2", 2)):
        row = hit.loc[run]
        if row["reached"]:
            expected = _samples_until(study["runs"][run], ranks, row["steps"] - 1)
            assert row["samples"] == expected and str(row["samples_text"]) == f"{expected:,}"
        else:  # not reached: bounded by all it trained on
            expected = _samples_until(study["runs"][run], ranks)
            assert row["samples_lower_bound"] == expected
            assert row["samples_text"] == f"> {expected:,}"
    r1, r2 = hit.loc["R1"], hit.loc["R2"]
    if r1["reached"]:
        assert r2["statistical_efficiency"] == pytest.approx(r1["samples"] / r2["samples"])
        assert r2["time_speedup"] == pytest.approx(r2["throughput_speedup"]
                                                   * r2["statistical_efficiency"]
                                                   * r2["other_factor"])
        assert "statistical efficiency" in r2["summary"] and "throughput" in r2["summary"]
    else:
        assert r2["statistical_efficiency_text"].startswith("> ")
    assert "## Time to target, decomposed" in study["stdout"]


def test_rank_balance_dice_and_notes(study):
    bal = _csv(study, "rank_balance.csv")
    assert list(zip(bal["run"], bal["rank"])) == [("R1", 0), ("R2", 0), ("R2", 1)]
    # the warm-up epoch is left out: one epoch of steps per rank
    one, two = _steps_per_epoch(study, "R1"), _steps_per_epoch(study, "R2")
    assert list(bal["steps"]) == [one, two, two] and (bal["mean_step_s"] > 0).all()
    assert set(bal[bal["run"] == "R2"]["slowest_rank"]) <= {0, 1}
    spread = _csv(study, "val_dice_spread.csv")
    liver = spread[(spread["run"] == "R2") & (spread["class"] == "liver")]
    assert list(liver["epoch"]) == [0, 1] and list(liver["ranks"]) == [2, 2]
    assert ((liver["min"] <= liver["median"]) & (liver["median"] <= liver["max"])).all()
    with open(os.path.join(study["out"], "report.json")) as f:
        doc = json.load(f)
    # Healthy logs: nothing skipped (a field the trainer adds later is only named).
    assert not [n for n in doc["notes"] if n["level"] in ("warning", "skipped")
                and not n["message"].startswith("ignored field(s)")], doc["notes"]
    assert "## Time per epoch" in study["stdout"] and "R2" in study["stdout"]


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}")
                                      else None)
        if path:
            return path
    return None


#: The window the page is checked in: a laptop-sized screen.
WINDOW_WIDTH = 1280

# Appended to a copy of report.html: once everything has loaded (the load event waits
# for the images), it writes what the page looks like into the DOM as JSON, which
# `chromium --dump-dom` prints. No DevTools protocol, no driver, nothing downloaded.
_PROBE = r"""<script>
window.addEventListener("load", function () {
  var sections = [], current = null;
  Array.from(document.body.children).forEach(function (el) {
    if (el.tagName === "H2") {
      current = {title: el.textContent, intro: "", images: [], tables: []};
      sections.push(current);
      return;
    }
    if (!current) return;
    if (el.classList.contains("intro")) current.intro = el.textContent;
    var imgs = el.tagName === "IMG" ? [el] : Array.from(el.querySelectorAll("img"));
    imgs.forEach(function (i) {
      current.images.push({complete: i.complete, naturalWidth: i.naturalWidth,
                           naturalHeight: i.naturalHeight,
                           width: i.getBoundingClientRect().width});
    });
    Array.from(el.querySelectorAll("table")).forEach(function (t) {
      var box = t.parentElement, r = t.getBoundingClientRect();
      current.tables.push({rows: t.tBodies.length ? t.tBodies[0].rows.length : 0,
                           width: r.width, height: r.height,
                           overflow: box.scrollWidth - box.clientWidth});
    });
  });
  var pre = document.createElement("pre");
  pre.id = "distseg-probe";
  pre.textContent = JSON.stringify({
    innerWidth: window.innerWidth, scrollWidth: document.documentElement.scrollWidth,
    images: document.images.length, tables: document.querySelectorAll("table").length,
    sections: sections});
  document.body.appendChild(pre);
});
</script>"""


def _headless(browser, home, *args):
    """One headless Chromium call (--no-sandbox: CI runs as root; its own profile)."""
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={home}",
         *args], capture_output=True, text=True, timeout=120, env=dict(os.environ, HOME=str(home)))


@pytest.fixture(scope="module")
def page(study):
    """report.html as headless Chromium lays it out in a 1280-px-wide window: the
    probe's measurements, per section, and a screenshot of the page."""
    browser = _chromium()
    if browser is None:  # never a skip: CI would then never look at the page
        pytest.fail("no chromium binary on PATH or in /usr/bin: `make test` installs it "
                    "(WITH_TEST_TOOLS=1 scripts/install.sh), or apt-get install chromium")
    home = study["tmp"] / "chromium-home"
    home.mkdir(exist_ok=True)
    html_path = os.path.join(study["out"], "report.html")
    with open(html_path, encoding="utf-8") as f:
        html = f.read()
    probe_path = os.path.join(study["out"], "probe.html")
    with open(probe_path, "w", encoding="utf-8") as f:
        f.write(html.replace("</body>", _PROBE + "</body>"))
    # --virtual-time-budget: the DOM is printed only after the load handler has run.
    proc = _headless(browser, home, f"--window-size={WINDOW_WIDTH},900",
                     "--virtual-time-budget=10000", "--dump-dom", "file://" + probe_path)
    found = re.search(r'<pre id="distseg-probe">(.*?)</pre>', proc.stdout, flags=re.S)
    assert found, f"no measurements in the dumped DOM:\n{proc.stderr[-2000:]}"
    shot = os.path.join(study["out"], "report-screenshot.png")
    proc = _headless(browser, home, "--hide-scrollbars", f"--window-size={WINDOW_WIDTH},3000",
                     f"--screenshot={shot}", "file://" + html_path)
    assert os.path.exists(shot), proc.stderr[-2000:]
    print(f"screenshot: {shot}")
    return {"html": html, "probe": json.loads(htmllib.unescape(found.group(1))), "shot": shot}


def test_html_report_is_self_contained(study):
    with open(os.path.join(study["out"], "report.html"), encoding="utf-8") as f:
        html = f.read()
    # the four plots inline (loss, Dice, statistical efficiency, the 2-rank run's gradient
    # noise scale), nothing fetched elsewhere
    assert html.count('src="data:image/png;base64,') == 4
    assert 'src="http' not in html and "<link" not in html


def test_html_report_shows_both_plots_and_every_table(page):
    probe = page["probe"]
    sections = {s["title"]: s for s in probe["sections"]}
    # Every plot decoded (a broken image has no natural size) and shown large enough to
    # read (they are drawn 570 to 1100 px wide).
    figures = {t: s["images"] for t, s in sections.items() if s["images"]}
    assert set(figures) == {"Loss versus wall-clock time", "Validation Dice across ranks",
                            "Statistical efficiency and samples to target versus ranks",
                            "Gradient noise scale over training"}
    for title, (img,) in figures.items():
        assert img["complete"] and img["naturalWidth"] > 300 and img["naturalHeight"] > 200, title
        assert img["width"] > 300, title
    # Every table of the HTML is laid out, with its rows, in the section it belongs to.
    tables = {t: s["tables"] for t, s in sections.items() if s["tables"]}
    assert probe["tables"] == page["html"].count("<table") == sum(map(len, tables.values()))
    assert {"Runs", "Time per epoch", "Scaling", "Rank balance", "Validation Dice, last epoch",
            "Coverage", "Statistical efficiency"} <= set(tables)
    assert [t for t in tables if "target" in t.lower()], sorted(tables)
    for title, boxes in tables.items():
        for box in boxes:
            assert box["rows"] >= 1 and box["height"] > 20 * box["rows"], (title, box)


def test_html_report_fits_a_1280_px_window(page):
    probe = page["probe"]
    assert probe["innerWidth"] == WINDOW_WIDTH
    assert probe["scrollWidth"] <= WINDOW_WIDTH, "the page scrolls sideways"
    wide = {s["title"]: round(b["width"]) for s in probe["sections"] for b in s["tables"]
            if b["overflow"] > 0}
    assert not wide, f"tables (px wide) that scroll sideways in a {WINDOW_WIDTH}-px window: {wide}"


def test_loss_plot_time_axis_follows_the_run_length(study, page):
    # The runs last seconds: the loss plot's time axis reads seconds (or minutes), not
    # 0.004 h. report.json names the unit; the page says it above the plot.
    with open(os.path.join(study["out"], "report.json")) as f:
        unit = json.load(f).get("time_unit")
    assert unit in ("s", "min"), f"time unit {unit!r} for runs of seconds"
    word = {"s": "seconds", "min": "minutes"}[unit]
    loss = next(s for s in page["probe"]["sections"] if s["title"].startswith("Loss versus"))
    assert f"wall-clock {word}" in loss["intro"], loss["intro"]


def test_html_report_screenshot_is_a_drawn_page(page):
    assert os.path.getsize(page["shot"]) > 50_000
    import matplotlib.image as mpimg

    pixels = mpimg.imread(page["shot"])
    assert pixels.shape[:2] == (3000, WINDOW_WIDTH)
    # Not a blank page: many distinct colours (plot lines, bands, text).
    rgb = (pixels[..., :3] * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert len(colours) > 200
