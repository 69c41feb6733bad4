"""``rollcall report DIR``: the numbers behind each figure, the figures, the page in a browser.

The directories are made here by the real commands on the sim
(scenarios/quickstart.yaml with a random failure rate, so the U-curve has
a trade-off to draw), a compare of 2 seeds and two small sweeps, then
reported; the page is rendered by headless Chromium (the Debian package
``chromium-headless-shell``, which tools/debian-packages.sh installs) and
checked: not blank, every image loaded.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from rollcall import interrupts
from rollcall.app import analysis as an
from rollcall.app import cli
from rollcall.app.report import REPORT_FILE, ReportError, build
from rollcall.app.report import data, figures, source
from rollcall.results import LATEST_LINK, prepare_out_dir, update_latest
from rollcall.scenario import load_scenario
from rollcall.app.stats import mean_interval
from polling import wait_for

ROOT = Path(__file__).resolve().parent.parent
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
MTBF = ["--set", "failures.worker_mtbf_s=400"]  # a few random failures in a ~60 s job
CHROMIUM = shutil.which("chromium-headless-shell")
BROWSER_TIMEOUT_S = 60


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A compare, a two-key sweep, a one-key interval sweep and a run, made by the CLI."""
    root = tmp_path_factory.mktemp("report")
    code, out, _ = _cli("compare", QUICK, "--seeds", "2", "--out", str(root / "cmp"), *MTBF)
    assert code == 0
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    (root / "verdict.txt").write_text(verdict.removeprefix("verdict: "))
    code, _, _ = _cli("sweep", QUICK, "--grid", "cluster.workers=4,8", "--grid",
                      "failures.worker_mtbf_s=300,20000", "--seeds", "2", "--jobs", "1",
                      "--quiet", "--out", str(root / "sweep2"))
    assert code == 0
    code, _, _ = _cli("sweep", QUICK, "--grid", "strategy.checkpoint_interval_steps=10,50,150",
                      "--seeds", "2", "--jobs", "1", "--quiet", "--out", str(root / "sweep1"),
                      *MTBF)
    assert code == 0
    code, _, _ = _cli("run", QUICK, "--out", str(root / "run"), "--quiet", *MTBF)
    assert code == 0
    return {"root": root, "compare": root / "cmp", "sweep2": root / "sweep2",
            "sweep1": root / "sweep1", "run": root / "run"}


# --------------------------------------------------------------------------- what DIR is

def test_kind_of_each_directory(dirs: dict[str, Path]) -> None:
    assert source.kind_of(dirs["run"]) == "run"
    assert source.kind_of(dirs["compare"]) == "compare"
    assert source.kind_of(dirs["sweep2"]) == "sweep"
    assert source.load(dirs["sweep2"]).keys == ("cluster.workers", "failures.worker_mtbf_s")


@pytest.mark.parametrize("case", ["missing", "file", "empty", "unfinished", "empty-csv"])
def test_bad_dir_is_one_line_and_exit_2(case: str, tmp_path: Path) -> None:
    d = tmp_path / "d"
    if case == "file":
        d.write_text("x")
    elif case != "missing":
        d.mkdir()
    if case == "unfinished":
        (d / "history.jsonl").write_text('{"f":"start","t":0.0}\n')
    if case == "empty-csv":
        (d / "compare.csv").write_text("")
    with pytest.raises(ReportError):
        build(d)
    code, out, err = _cli("report", str(d))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "d" / REPORT_FILE).exists()


def test_the_command_prints_the_path(dirs: dict[str, Path]) -> None:
    code, out, err = _cli("report", str(dirs["run"]))
    assert code == 0, err
    assert out.strip() == str(dirs["run"] / REPORT_FILE)
    assert (dirs["run"] / "timeline.png").is_file()


# --------------------------------------------------------------------------- numbers

def test_compare_report_states_the_verdict_compare_printed(dirs: dict[str, Path]) -> None:
    printed = (dirs["root"] / "verdict.txt").read_text()
    src = source.load(dirs["compare"])
    assert data.verdict_sentence(src) == printed
    page = build(dirs["compare"]).read_text(encoding="utf-8")
    assert f'<p class="verdict">{html.escape(printed)}</p>' in page


def test_break_even_is_the_paired_difference_per_point(dirs: dict[str, Path]) -> None:
    src = source.load(dirs["sweep2"])
    be = data.break_even(src)
    assert len(be) == 4 and set(be.pairs) == {2}
    runs = pd.read_csv(dirs["sweep2"] / "sweep.csv")
    for _, row in be.iterrows():
        at = runs[(runs["cluster.workers"] == row["cluster.workers"])
                  & (runs["failures.worker_mtbf_s"] == row["failures.worker_mtbf_s"])]
        el = at[at.strategy == "elastic"].set_index("seed").elapsed_s
        cr = at[at.strategy == "checkpoint-restart"].set_index("seed").elapsed_s
        assert row["d_mean"] == pytest.approx((el - cr).mean())
        assert row["rel_pct"] == pytest.approx(100 * (el - cr).mean() / cr.mean())
        assert row["d_lo"] <= row["d_mean"] <= row["d_hi"]
    sentence = data.sweep_sentence(be)
    faster = int((be.d_mean < 0).sum())
    assert sentence.startswith(f"over 4 grid points: elastic is faster at {faster} ")


def test_sweep_sentence_without_pairs() -> None:
    empty = pd.DataFrame(columns=["d_mean", "significant", "verdict"])
    assert data.sweep_sentence(empty).startswith("no verdict")
    # a sweep of one strategy has no pairs, and says so
    src = source.Source("sweep", Path("."), pd.DataFrame(
        {"strategy": ["elastic"] * 2, "seed": [0, 1], "run_dir": ["a", "b"],
         "elapsed_s": [1.0, 2.0], "completed": [True, True], "valid": [True, True]}))
    assert data.break_even(src).empty


def test_u_curve_has_its_minimum_at_daly(dirs: dict[str, Path]) -> None:
    curve = data.u_curve(source.load(dirs["compare"]))
    assert isinstance(curve, data.UCurve)
    p = curve.params
    assert curve.marks["Young"] == pytest.approx(an.young_interval(p["delta"], p["M"]))
    best = curve.marks["minimum"]
    lo, hi = curve.frame.tau_s.min(), curve.frame.tau_s.max()
    assert lo < best < hi, "the minimum is inside the drawn range"
    assert best == pytest.approx(an.daly_interval(p["delta"], p["M"]), rel=0.1)
    assert curve.wall_s(best) < min(curve.wall_s(best / 3), curve.wall_s(best * 3))
    # the interval compare gives checkpoint-restart: Daly's exact optimum, in whole steps
    sc = load_scenario(dirs["compare"] / "scenario.yaml")
    assert curve.marks["compare"] == pytest.approx(round(best / sc.ideal_step_s) * sc.ideal_step_s,
                                                   abs=sc.ideal_step_s)


def test_no_u_curve_without_random_failures(tmp_path: Path) -> None:
    code, _, _ = _cli("run", QUICK, "--out", str(tmp_path / "r"), "--quiet")
    assert code == 0
    why = data.u_curve(source.load(tmp_path / "r"))
    assert isinstance(why, str) and "no random failures" in why


def test_measured_intervals_overlay(dirs: dict[str, Path]) -> None:
    src = source.load(dirs["sweep1"])
    curve = data.u_curve(src)
    assert isinstance(curve, data.UCurve)
    m = data.measured_intervals(src, curve)
    step = curve.params["step_s"]
    assert list(m.tau_s) == pytest.approx([10 * step, 50 * step, 150 * step])
    runs = pd.read_csv(dirs["sweep1"] / "sweep.csv")
    cr = runs[(runs.strategy == "checkpoint-restart")
              & (runs["strategy.checkpoint_interval_steps"] == 50)]
    assert m["mean"].iloc[1] == pytest.approx(cr.elapsed_s.mean())
    assert set(m.n) == {2}


def test_per_strategy_intervals(dirs: dict[str, Path]) -> None:
    stats = data.per_strategy(source.load(dirs["compare"]))
    runs = pd.read_csv(dirs["compare"] / "compare.csv")
    for strategy, sub in runs.groupby("strategy"):
        row = stats[stats.strategy == strategy].iloc[0]
        assert row.goodput_mean == pytest.approx(sub.goodput.mean())
        expected = mean_interval(sub.goodput, "ratio")  # inside [0, 1]
        assert (row.goodput_lo, row.goodput_hi) == pytest.approx((expected.lo, expected.hi))
        assert 0.0 <= row.goodput_lo <= row.goodput_hi <= 1.0 and row.goodput_method == "logit t"


# --------------------------------------------------------------------------- figures

def test_member_spans_are_the_generations_members(dirs: dict[str, Path]) -> None:
    spans = an.member_spans(dirs["run"])
    gens = an.generations(dirs["run"])
    for g in gens.itertuples(index=False):
        mine = spans[spans.gen == g.gen]
        ids = tuple(i for lo, hi in zip(mine.lo, mine.hi) for i in range(lo, hi + 1))
        assert ids == g.members
        assert set(mine.start) == {g.t_rel} and set(mine.end) == {g.t_end_rel}


def _wide_history(path: Path, workers: int, gens: int) -> Path:
    """A 2,048-worker-sized history: every generation loses one worker (a crash) and regains it."""
    recs = []
    for g in range(1, gens + 1):
        hole = (g * 37) % workers
        members = [[0, hole - 1], [hole + 1, workers - 1]] if 0 < hole < workers - 1 else \
            [[0, workers - 1]]
        recs.append({"t": 10.0 * g, "f": "round", "type": "invoke", "gen": g, "process": "keeper"})
        recs.append({"t": 10.0 * g + 1, "f": "generation", "type": "ok", "gen": g,
                     "members": members, "reason": "failure", "process": "keeper"})
        recs.append({"t": 10.0 * g + 5, "f": "fault", "type": "info", "kind": "crash",
                     "workers": [hole], "process": "nemesis"})
    recs.append({"t": 10.0 * gens + 10, "f": "end", "type": "info", "process": "driver"})
    path.mkdir()
    (path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_timeline_draws_id_runs_not_workers(tmp_path: Path) -> None:
    run = _wide_history(tmp_path / "wide", 2048, 300)
    fig = figures.timelines([("wide", run)])
    ax = fig.axes[0]
    spans = an.member_spans(run)
    distinct = len(spans.drop_duplicates(["lo", "hi"]))
    # one collection per distinct id run, plus stall/roll-call shading; never one per worker
    assert distinct <= len(ax.collections) <= distinct + 3
    assert len(ax.collections) < 2048
    assert sum(len(c.get_paths()) for c in ax.collections[:distinct]) == len(spans)
    assert ax.get_yticks().size < 32, "no tick per worker at 2,048 workers"
    figures.save(fig, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000


def _be(values: list[float], significant: list[bool | None]) -> pd.DataFrame:
    xs = [4, 8, 4, 8]
    ys = [60, 60, 600, 600]
    return pd.DataFrame({"w": xs, "m": ys, "rel_pct": values, "significant": significant,
                         "pairs": 2, "d_mean": values, "cr_mean": 100.0,
                         "rel_lo_pct": [v - 1 for v in values],
                         "rel_hi_pct": [v + 1 for v in values]})


def test_heatmap_draws_the_zero_contour_only_where_the_sign_changes() -> None:
    crossing = figures.break_even_heatmap(_be([-20.0, -5.0, 10.0, 30.0], [True] * 4), ["w", "m"])
    assert any(type(c).__name__.endswith("ContourSet") or "Contour" in type(c).__name__
               for c in crossing.axes[0].get_children()), "zero contour drawn"
    texts = {t.get_text() for t in crossing.axes[0].texts}
    assert {"-20.0%", "+30.0%"} <= texts
    same_sign = figures.break_even_heatmap(_be([-20.0, -5.0, -10.0, -30.0],
                                               [True, False, None, True]), ["w", "m"])
    assert not any("Contour" in type(c).__name__ for c in same_sign.axes[0].get_children())
    texts = {t.get_text() for t in same_sign.axes[0].texts}
    assert "-5.0%\nn.s." in texts and "-10.0%\nno claim" in texts


def test_break_even_line_and_metrics_figures(dirs: dict[str, Path]) -> None:
    be = data.break_even(source.load(dirs["sweep1"]))
    fig = figures.break_even_line(be, "strategy.checkpoint_interval_steps")
    ax = fig.axes[0]
    assert len(ax.containers) == 1  # one errorbar series
    assert any(line.get_ydata()[0] == 0.0 for line in ax.lines if len(line.get_ydata()) == 2)
    stats = data.per_strategy(source.load(dirs["sweep2"]))
    mfig = figures.metrics(stats, ("cluster.workers", "failures.worker_mtbf_s"))
    assert [a.get_title() for a in mfig.axes][:2] == ["goodput", "ettr"]
    assert all(len(a.containers) == 2 for a in mfig.axes)  # both strategies, with error bars


# --------------------------------------------------------------------------- pages

def test_reports_have_every_part(dirs: dict[str, Path]) -> None:
    for name, expect in (("compare", {"timeline.png", "metrics.png", "u-curve.png"}),
                         ("sweep2", {"timeline.png", "metrics.png", "break-even.png",
                                     "u-curve.png"}),
                         ("sweep1", {"timeline.png", "metrics.png", "break-even.png",
                                     "u-curve.png"})):
        page = build(dirs[name]).read_text(encoding="utf-8")
        imgs = set(re.findall(r'<img src="([^"]+)"', page))
        assert imgs == expect, name
        assert all((dirs[name] / i).stat().st_size > 1000 for i in imgs)
        assert not re.search(r"(src|href)=\"(https?:)?//", page), "no network fetch"
        assert "<script" not in page
    page = (dirs["compare"] / REPORT_FILE).read_text(encoding="utf-8")
    assert "one cell (this compare)" in page


def test_an_interrupted_run_gets_a_marked_report(tmp_path: Path) -> None:
    from sim.driver import run

    # the sim polls stop() every 1,024 events: a run with more than that
    sc = load_scenario(ROOT / "scenarios" / "llama3-54d.yaml", [], seed=0)
    out = prepare_out_dir(tmp_path / "cut", sc)
    stop = interrupts.Stop()
    stop.signum = signal.SIGINT  # as a first signal leaves it: the run is asked to stop
    summary = run(sc, out, stop=stop)
    assert summary["result"] == "interrupted"
    page = build(out).read_text(encoding="utf-8")
    assert "INTERRUPTED" in page and "was interrupted" in page


# --------------------------------------------------------------------------- runs/latest

def test_update_latest_links_only_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    a, b = root / "q" / "a", root / "q" / "b"
    a.mkdir(parents=True)
    b.mkdir()
    link = update_latest(a, root)
    assert link == root / LATEST_LINK and os.readlink(link) == os.path.join("q", "a")
    assert update_latest(b, root) == link and link.resolve() == b.resolve()
    assert update_latest(tmp_path / "elsewhere", root) is None
    assert link.resolve() == b.resolve()
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == [], "no temp left"


def test_a_directory_named_latest_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    (root / LATEST_LINK / "stamp").mkdir(parents=True)
    (root / "q").mkdir()
    assert update_latest(root / "q", root) is None
    assert (root / LATEST_LINK).is_dir() and not (root / LATEST_LINK).is_symlink()


def test_commands_point_runs_latest_at_their_directory(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _cli("run", QUICK, "--quiet")[0] == 0
    latest = tmp_path / "runs" / LATEST_LINK
    assert latest.is_symlink() and not os.path.isabs(os.readlink(latest))
    assert (latest / "summary.json").is_file()
    first = latest.resolve()
    assert _cli("run", QUICK, "--quiet", "--out", str(tmp_path / "mine"))[0] == 0
    assert latest.resolve() == first, "an --out outside runs/ leaves the link"
    assert _cli("compare", QUICK, "--seeds", "1")[0] == 0
    assert (latest / "compare.csv").is_file()
    code, out, _ = _cli("report", "runs/latest")
    assert code == 0 and Path(out.strip()).is_file()


# --------------------------------------------------------------------------- in a browser

def _live_in_group(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that still run (zombies waiting for init are not)."""
    import psutil

    live = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                live.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return live


def _browser(args: list[str], cwd: Path) -> str:
    """Run headless Chromium in ``cwd`` (its profile there too), bounded; its stdout.

    It runs in a session of its own, so its helpers are found by group id
    afterwards: each still running is killed by PID, and the test waits
    (bounded) until none is left.
    """
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--no-sandbox", "--headless", f"--user-data-dir={cwd / 'profile'}", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=BROWSER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"chromium did not finish in {BROWSER_TIMEOUT_S} s") from None
    finally:
        for pid in _live_in_group(proc.pid):  # helpers the browser left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not _live_in_group(proc.pid), 10.0, "chromium's helpers to exit")
    assert proc.returncode == 0, f"chromium exited {proc.returncode}"
    return out


_COUNT_IMAGES = ("<script>window.addEventListener('load', function () { var n = 0;"
                 " for (var i of document.images) { if (i.complete && i.naturalWidth > 0) n++; }"
                 " document.title = 'loaded:' + n; });</script>")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium-headless-shell is not installed "
                    "(tools/debian-packages.sh installs it when run as root)")
@pytest.mark.parametrize("name", ["compare", "sweep2"])
def test_report_renders_in_chromium(name: str, dirs: dict[str, Path], tmp_path: Path) -> None:
    report = build(dirs[name])
    page = report.read_text(encoding="utf-8")
    shot = tmp_path / "shot.png"
    _browser([f"--screenshot={shot}", "--window-size=1280,4000", report.as_uri()], tmp_path)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (4000, 1280)
    assert pixels.std() > 10, "the screenshot is blank"
    check = report.with_name("report-check.html")  # beside it: the same relative image paths
    check.write_text(page.replace("</body>", _COUNT_IMAGES + "</body>"), encoding="utf-8")
    try:
        dom = _browser(["--dump-dom", check.as_uri()], tmp_path)
    finally:
        check.unlink()
    title = re.search(r"<title>([^<]*)</title>", dom)
    assert title is not None
    assert title.group(1) == f"loaded:{page.count('<img ')}", title.group(1)
    assert page.count("<img ") >= 3


def test_a_compare_reported_from_another_directory(dirs: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """compare.csv names its runs relative to where compare ran; the report finds them in DIR."""
    monkeypatch.chdir(tmp_path)
    assert _cli("compare", QUICK, "--seeds", "1", "--out", "c", *MTBF)[0] == 0
    moved = tmp_path / "elsewhere"
    (tmp_path / "c").rename(moved)
    page = build(moved).read_text(encoding="utf-8")
    assert '<img src="timeline.png"' in page
    assert source.load(moved).runs.run_dir.map(lambda d: Path(d).parent == moved).all()
