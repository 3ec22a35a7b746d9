"""The link between the ranks in the report (``analysis.links``): each run's logged
link in a table, and the link the projection's allreduce model runs on: measured
between hosts, given, or assumed.

Every run is a real log written by ``tests/analysis_fixtures/runs.py``; its run record's
``link`` is what ``distseg.core.link.fit`` makes of allreduces timed by the ring model at
a chosen bandwidth and latency (``measured_link``), so the fit gives them back. The
model has 100,000 parameters: 4e5 gradient bytes.
"""

import json

import pytest
from click.testing import CliRunner

from analysis import links
from analysis.cli import report as report_cmd
from analysis.report import ReportOptions, build, write
from tests.analysis_fixtures.runs import RunSpec, measured_link, note_lines, one_row, write_run

MIB16 = 16 << 20
ONE_RANK = {"link": None}  # a 1-rank run of today logs link: null
TWO_HOSTS = ["a", "a", "b", "b"]


def _np1(tmp_path):
    return write_run(str(tmp_path / "np1"), RunSpec(size=1, params=100_000,
                                                    extra_run_fields=ONE_RANK))


def _net(tmp_path, name="net", size=4, hosts=TWO_HOSTS, bandwidth=10.0, latency=25.0):
    """``size`` ranks on ``hosts``, whose link between hosts runs at ``bandwidth`` Gbit/s
    and ``latency`` us per message."""
    return write_run(str(tmp_path / name), RunSpec(
        size=size, hosts=hosts, params=100_000,
        link=measured_link(size, bandwidth, latency, local=False)))


def _local(tmp_path):
    """2 ranks on one host: the host's own path at 40 Gbit/s, 3 us."""
    return write_run(str(tmp_path / "loc"), RunSpec(size=2, params=100_000,
                                                    link=measured_link(2, 40.0, 3.0, local=True)))


def _comm(ranks, bandwidth_gbps, latency_us):
    return (2 * (ranks - 1) / ranks * 4e5 / (bandwidth_gbps * 1e9 / 8)
            + latency_us * 1e-6 * 2 * (ranks - 1))


# ------------------------------------------------------------------------------ table


def test_the_table_lists_each_runs_link_and_says_what_it_measured(tmp_path):
    runs = [_np1(tmp_path), write_run(str(tmp_path / "old"), RunSpec(size=2)),
            _local(tmp_path), _net(tmp_path)]
    report = build(runs, ReportOptions(), processes=0)
    table = report.tables.links
    assert list(table["run"]) == ["np1", "old", "loc", "net"]
    np1, old = one_row(table, run="np1"), one_row(table, run="old")
    assert (np1["link"], np1["note"]) == ("none (1 rank)", "one rank: nothing to allreduce with")
    assert (old["link"], old["note"]) == (links.NOT_MEASURED,
                                          "older logs: the run record has no link")
    assert old["bandwidth_gbps"] != old["bandwidth_gbps"]  # NaN: nothing made up
    loc = one_row(table, run="loc")
    assert (loc["ranks"], loc["hosts"], loc["local"], loc["link"]) == (
        2, 1, True, "the host's own path (not a network)")
    assert (loc["bandwidth_gbps"], loc["latency_us"]) == (pytest.approx(40.0), pytest.approx(3.0))
    net = one_row(table, run="net")
    assert (net["ranks"], net["hosts"], net["local"], net["link"]) == (
        4, 2, False, "network between 2 hosts")
    assert (net["bandwidth_gbps"], net["latency_us"]) == (pytest.approx(10.0),
                                                          pytest.approx(25.0))
    # The largest of the 3 sizes: 16 MiB, 2 x 3/4 of it through each link in
    # 2 x 3 x 25 us + 1.5 x 16 MiB x 8 / 1e10 s.
    seconds = 150e-6 + 1.5 * MIB16 * 8 / 1e10
    assert (net["sizes_timed"], net["largest_bytes"]) == (3, MIB16)
    assert net["largest_s"] == pytest.approx(seconds)
    assert net["largest_gbps"] == pytest.approx(1.5 * MIB16 * 8 / seconds / 1e9)  # 9.93
    assert net["note"] == ""

    out = tmp_path / "out"
    files = write(report, str(out))
    assert files["links"] == str(out / "links.csv")
    csv = (out / "links.csv").read_text().splitlines()
    assert csv[0] == ",".join(links.LINK_COLUMNS) and len(csv) == 5
    md = (out / "report.md").read_text()
    assert "## Link between the ranks (measured)" in md
    assert "| loc | 2 | 1 | the host's own path (not a network) |" in md
    assert json.loads((out / "report.json").read_text())["tables"]["links"][3]["hosts"] == 2


def test_the_table_says_how_each_runs_gradients_travelled_and_why(tmp_path):
    """A run under ``--compression auto`` logs its decision: the report shows the choice
    and its reason beside the link it was taken on; a run named exact says so; an
    older run's config.json is read where its record holds no decision."""
    slow = measured_link(2, 1.0, 50.0, local=False)
    reason = ("fp16 predicted 1.28x exact float32's samples/s (allreduce 78 ms in float32, "
              "39 ms in fp16, beside 0.090 s of compute, on 1 Gbit/s); taken at 1.10x or more")
    auto = write_run(str(tmp_path / "auto"), RunSpec(
        size=2, hosts=["a", "b"], params=100_000, link=slow,
        extra_run_fields={"compression_decision": {"requested": "auto", "choice": "fp16",
                                                   "speedup": 1.28, "reason": reason}}))
    named = write_run(str(tmp_path / "named"), RunSpec(
        size=2, hosts=["a", "b"], params=100_000, link=slow,
        extra_run_fields={"compression_decision": {"requested": "none", "choice": "none"}}))
    older = write_run(str(tmp_path / "older"), RunSpec(
        size=2, hosts=["a", "b"], params=100_000, link=slow,
        train_fields={"compression": "fp16"}))
    table = build([auto, named, older], ReportOptions(), processes=0).tables.links
    assert (one_row(table, run="auto")["compression"],
            one_row(table, run="auto")["compression_reason"]) == ("fp16 (auto)", reason)
    assert (one_row(table, run="named")["compression"],
            one_row(table, run="named")["compression_reason"]) == ("none", "named by the run's config")
    assert (one_row(table, run="older")["compression"],
            one_row(table, run="older")["compression_reason"]) == (
        "fp16", "config.json (the run record has no decision)")


# ------------------------------------------------------------------------- projection


def test_the_projection_uses_the_link_measured_between_hosts(tmp_path):
    rep = build([_np1(tmp_path), _net(tmp_path)], ReportOptions(project_nodes=(4,)),
                processes=0)
    # 4 ranks on 2 hosts: 2 per node, so 4 nodes are 8 ranks.
    row = one_row(rep.projection.table, kind="projection")
    assert row["ranks"] == 8 and row["allreduce_s"] == pytest.approx(_comm(8, 10.0, 25.0))
    lines = rep.projection.assumptions
    assert ("MEASURED link: B = 10 Gb/s, latency = 25 us per message, from run net, 4 ranks "
            "on 2 hosts (allreduces timed at the run's start, ring model fitted; links.csv)."
            in lines)
    assert not any("ASSUMED" in line for line in lines)
    assert not any("projection" in n for n in note_lines(rep, "warning"))


def test_several_links_between_hosts_give_their_median(tmp_path):
    runs = [_net(tmp_path), _net(tmp_path, "net8", 8, [h for h in "aabbccdd"], 20.0, 35.0)]
    report = build(runs, ReportOptions(), processes=0)
    choice = links.choose(report.tables.links)
    assert (choice.fabric.bandwidth_gbps, choice.fabric.latency_us) == (
        pytest.approx(15.0), pytest.approx(30.0))
    assert choice.runs == ("net", "net8")
    assert choice.lines[0] == ("MEASURED link: B = 15 Gb/s, latency = 30 us per message, the "
                               "median of runs net (4 ranks on 2 hosts) and net8 (8 ranks on 4 "
                               "hosts) (allreduces timed at the run's start, ring model "
                               "fitted; links.csv).")


def test_a_local_link_is_not_used_and_the_defaults_are_flagged_assumed(tmp_path):
    rep = build([_np1(tmp_path), _local(tmp_path)], ReportOptions(project_nodes=(2,)),
                processes=0)
    row = one_row(rep.projection.table, kind="projection")
    assert row["allreduce_s"] == pytest.approx(_comm(4, 100.0, 2.0))  # not 40 Gb/s, 3 us
    assumed = ("ASSUMED link: B = 100 Gb/s (default), latency = 2 us per message (default): "
               "no run measured a link between hosts (a run of 2 or more ranks on more than "
               "one host logs one at its start; links.csv). The default B is an EDR "
               "InfiniBand or Omni-Path class fabric.")
    lines = rep.projection.assumptions
    assert assumed in lines
    assert any(line.startswith("Not used for the projection across nodes: the link loc (2 "
                               "ranks) measured on one host, the host's own path (shared "
                               "memory or loopback), not a network") for line in lines)
    assert f"[warning] projection: {assumed}" in note_lines(rep, "warning")


def test_given_options_win_each_for_its_own_value(tmp_path):
    runs = [_np1(tmp_path), _net(tmp_path)]
    rep = build(runs, ReportOptions(project_nodes=(4,), bandwidth_gbps=8.0), processes=0)
    assert one_row(rep.projection.table, kind="projection")["allreduce_s"] == pytest.approx(
        _comm(8, 8.0, 25.0))
    assert ("Link: B = 8 Gb/s GIVEN (--bandwidth-gbps), latency = 25 us per message MEASURED, "
            "from run net, 4 ranks on 2 hosts (allreduces timed at the run's start, ring model "
            "fitted; links.csv)." in rep.projection.assumptions)
    both = build(runs, ReportOptions(project_nodes=(4,), bandwidth_gbps=8.0, latency_us=0.0),
                 processes=0)
    assert one_row(both.projection.table, kind="projection")["allreduce_s"] == pytest.approx(
        _comm(8, 8.0, 0.0))
    assert ("GIVEN link: B = 8 Gb/s (--bandwidth-gbps), latency = 0 us per message "
            "(--latency-us); the options win over the link measured from run net, 4 ranks on "
            "2 hosts (B = 10 Gb/s, latency = 25 us; allreduces timed at the run's start, ring "
            "model fitted; links.csv)." in both.projection.assumptions)
    assert not any("ASSUMED" in n for n in note_lines(both, "warning"))


def test_the_command_line_passes_only_the_options_given(tmp_path):
    runs = [_np1(tmp_path), _net(tmp_path)]
    res = CliRunner().invoke(report_cmd, [*runs, "--project-nodes", "4", "--latency-us", "5",
                                          "--format", "json", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert (doc["options"]["bandwidth_gbps"], doc["options"]["latency_us"]) == (None, 5.0)
    assert any(line.startswith("Link: B = 10 Gb/s MEASURED, latency = 5 us per message GIVEN "
                               "(--latency-us), from run net")
               for line in doc["projection"]["assumptions"])
    bad = CliRunner().invoke(report_cmd, [*runs, "--bandwidth-gbps", "0"])
    assert bad.exit_code == 2 and "--bandwidth-gbps must be > 0" in bad.output


def test_a_link_without_a_bandwidth_is_listed_but_not_used(tmp_path):
    flat = {**measured_link(4, 10.0, 25.0, local=False), "bandwidth_gbps": None}
    runs = [write_run(str(tmp_path / "flat"), RunSpec(size=4, hosts=TWO_HOSTS, link=flat)),
            write_run(str(tmp_path / "null"), RunSpec(size=2, extra_run_fields=ONE_RANK))]
    table = build(runs, ReportOptions(), processes=0).tables.links
    row = one_row(table, run="flat")
    assert row["note"] == "no bandwidth fitted: the time did not grow with the size"
    assert row["bandwidth_gbps"] != row["bandwidth_gbps"] and row["sizes_timed"] == 3
    assert tuple(one_row(table, run="null")[["link", "note"]]) == (
        links.NOT_MEASURED, "the run record's link is null")
    choice = links.choose(table)
    assert choice.runs == () and choice.lines[0].startswith("ASSUMED link: B = 100 Gb/s")
    assert choice.lines[1] == ("Not used: flat measured a link between hosts without a fitted "
                               "bandwidth (links.csv says why).")


def test_each_runs_compute_is_its_step_less_the_allreduce_on_its_own_link(tmp_path):
    """A 2-rank run on one host went through the host's own path: the compute fitted
    from it takes off that path's allreduce (40 Gbit/s here), not the projected
    network's (1 Gbit/s given), which would take off 25 times more."""
    from analysis import stepmodel
    report = build([_local(tmp_path)], ReportOptions(), processes=0)
    points = stepmodel.fit_points(report.runs, report.tables.time_per_epoch)
    assert len(points) == 1
    assert points[0].link.bandwidth_gbps == pytest.approx(40.0)
    assert points[0].link.latency_us == pytest.approx(3.0)
    slow = stepmodel.Fabric(1.0, 3.0, "ring")
    times = stepmodel.step_times(points, 4e5, slow)
    p = points[0]
    assert times.means()[p.batch] == pytest.approx(p.step_s - _comm(2, 40.0, 3.0), rel=1e-3)


def test_the_table_puts_the_traced_allreduce_beside_the_modelled_one(tmp_path):
    comm = {"steps": 16, "file": "comm-timeline-e1.json", "gradient_s": 0.004,
            "gradient_wait_s": 0.001, "small_s": 1e-4, "small_wait_s": 0.002,
            "gradient_ops": 16, "small_ops": 16}
    traced = write_run(str(tmp_path / "traced"), RunSpec(
        size=2, params=100_000, hosts=["a", "b"],
        link=measured_link(2, 1.0, 10.0, local=False), extra_epoch_fields={"comm": comm}))
    broken = write_run(str(tmp_path / "broken"), RunSpec(
        size=2, params=100_000, link=measured_link(2, 1.0, 10.0, local=True),
        extra_epoch_fields={"comm": {"steps": 16, "file": "x.json", "error": "ValueError: x"}}))
    table = build([traced, broken, _local(tmp_path)], ReportOptions(), processes=0).tables.links
    row = one_row(table, run="traced")
    assert (row["traced_steps"], row["traced_allreduce_s"], row["traced_wait_s"]) == (
        16, pytest.approx(0.004), pytest.approx(0.003))
    assert row["modelled_allreduce_s"] == pytest.approx(_comm(2, 1.0, 10.0))
    for run in ("broken", "loc"):  # a trace not read, and none: empty cells
        assert one_row(table, run=run)[["traced_allreduce_s", "traced_wait_s"]].isna().all()
