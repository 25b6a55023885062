"""harness.analysis.stats and its parts on synthetic series with known answers, and on a committed demo run."""

from __future__ import annotations

import gzip
import json
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from harness import ROOT
from harness.analysis import contamination as ct
from harness.analysis import convergence as cv
from harness.analysis import speedups as sp
from harness.analysis import stability as st
from harness.analysis import stats, words
from harness.analysis.records import CellIndex, CellKey
from harness.analysis.speedups import Verdict

#: The first committed demo run (4 strategies x 8 tasks x 3 runs), whose baselines a climb rule once called warm.
DEMO = ROOT / "tests" / "data" / "demo-cpu-96.jsonl.gz"


def record(strategy: str, task: str, rnd: int, order: int, tok_s: float, drafts: tuple[int, int] = (0, 0),
           sha: str = "out", host: str = "local", protocol: str = "fresh-container", **extra) -> dict:
    return {"strategy": strategy, "task": task, "round": rnd, "run_index": rnd, "order": order, "host": host,
            "protocol": protocol, "status": "ok", "client": {"decode_tok_s": tok_s},
            "measurement_id": f"{host}-{strategy}-{task}-{rnd}-{order}",
            "server": {"draft_n": drafts[0], "draft_n_accepted": drafts[1]}, "output": {"sha256": sha}, **extra}


def matrix(truth: dict[tuple[str, str], float], rounds: int, *, noise: float = 0.01, round_factor=None,
           cell_factor=None, drafts=None, seed: int = 0) -> list[dict]:
    """Every cell once per round in shuffled order: tok/s = truth x round factor x cell factor x log-normal
    noise. `round_factor(r)`, `cell_factor(cell, r)` and `drafts(cell, r)` default to 1, 1 and fixed counts."""
    rng = np.random.default_rng(seed)
    shuffle = random.Random(seed)
    recs, order = [], 0
    for r in range(1, rounds + 1):
        cells = list(truth)
        shuffle.shuffle(cells)
        for cell in cells:
            v = truth[cell] * (round_factor(r) if round_factor else 1.0) * \
                (cell_factor(cell, r) if cell_factor else 1.0) * math.exp(rng.normal(0, noise))
            d = drafts(cell, r) if drafts else ((0, 0) if cell[0] == "baseline" else (100, 80))
            recs.append(record(cell[0], cell[1], r, order, round(v, 3), d))
            order += 1
    return recs


TRUTH = {("baseline", "a"): 100.0, ("baseline", "b"): 50.0, ("spec", "a"): 150.0, ("spec", "b"): 50.0,
         ("other", "a"): 90.0, ("other", "b"): 45.0}


def cell(rs: stats.RunStats, strategy: str, task: str, host: str = "local") -> stats.CellStats:
    return rs.cell(CellKey(host, strategy, task))


# -- paired speedups ------------------------------------------------------------------------------------------

def test_pure_drift_cancels_in_paired_speedups_and_is_not_contamination():
    # The whole machine speeds up 12% per round: every cell of a round scaled together.
    rs = stats.analyze(matrix(TRUTH, 8, noise=0.01, round_factor=lambda r: 1.12 ** r), "baseline")
    spec_a = cell(rs, "spec", "a")
    assert spec_a.speedup.estimate == pytest.approx(1.5, rel=0.03)
    assert spec_a.speedup.verdict is Verdict.FASTER
    assert cell(rs, "spec", "b").speedup.verdict is Verdict.EQUIVALENT
    assert cell(rs, "other", "a").speedup.verdict is Verdict.SLOWER
    for c in rs.cells:
        assert c.contamination.kind is ct.Kind.NONE, words.contamination(c.contamination)
        assert c.contamination.trend.testable
    # Raw tok/s climbs 2.2x over the run and varies far above 10%; the warning says the rounds explain it.
    disp = [w for w in cell(rs, "baseline", "a").warnings if w.kind is st.WarningKind.DISPERSION]
    assert disp and "after removing the round effect" in words.warning(disp[0])


def test_genuine_cell_specific_climb_is_drift_with_identical_counts():
    recs = matrix(TRUTH, 8, noise=0.01, cell_factor=lambda c, r: 1.08 ** r if c == ("spec", "a") else 1.0)
    rs = stats.analyze(recs, "baseline")
    c = cell(rs, "spec", "a").contamination
    text = words.contamination(c)
    assert c.kind is ct.Kind.DRIFT, text
    assert c.trend.change > 0.3 and c.trend_p < 0.05 and c.family == 12  # 6 cells: trend and noise tests
    assert "rose" in text and "not a carried-over cache" in text and "Holm-adjusted" in text
    assert all(x.contamination.kind is ct.Kind.NONE for x in rs.cells if x.key != CellKey("local", "spec", "a"))


def test_no_drift_flags_on_clean_data_in_a_large_run():
    """Fresh containers without drift, 96 cells and 10 rounds: the family keeps the flags away (the old per-cell
    rule flagged at least one cell in 90% of such runs)."""
    truth = {(s, f"t{i}"): 100.0 for s in ("baseline", *(f"s{j}" for j in range(11))) for i in range(8)}
    flagged = 0
    for seed in range(5):
        rs = stats.analyze(matrix(truth, 10, noise=0.066, seed=seed), "baseline")
        flagged += any(c.contamination.flagged for c in rs.cells)
    assert flagged <= 1


def test_climb_with_rising_acceptance_is_warm_cache_and_baseline_never_is():
    def drafts(c, r):
        if c[0] == "baseline":
            return (0, 0)
        return (100 + 10 * r, 50 + 10 * r) if c == ("spec", "a") else (100, 80)
    climbing = {("baseline", "a"), ("spec", "a")}
    recs = matrix(TRUTH, 8, noise=0.01, drafts=drafts, cell_factor=lambda c, r: 1.08 ** r if c in climbing else 1.0)
    rs = stats.analyze(recs, "baseline")
    spec = cell(rs, "spec", "a").contamination
    assert spec.kind is ct.Kind.WARM_CACHE
    assert "drafted/accepted 110/60, 120/70" in words.contamination(spec)
    assert cell(rs, "baseline", "a").contamination.kind is ct.Kind.DRIFT


def test_changing_output_in_fresh_containers_is_unstable():
    recs = matrix(TRUTH, 3, noise=0.01)
    for r in recs:
        if (r["strategy"], r["task"], r["round"]) == ("baseline", "b", 3):
            r["output"]["sha256"] = "different"
    c = cell(stats.analyze(recs, "baseline"), "baseline", "b").contamination
    assert c.kind is ct.Kind.UNSTABLE and "output changed from run 3" in words.contamination(c)


def test_reuse_server_is_naive_with_the_draft_counts():
    counts = {1: (165, 147), 2: (291, 168), 3: (256, 195)}
    recs = [record("ngram-mod", "a", r, r - 1, 300.0 + r, counts[r], sha="x" if r == 1 else "y",
                   protocol="reuse-server") for r in (1, 2, 3)]
    c = ct.judge(CellIndex(recs))[CellKey("local", "ngram-mod", "a")]
    assert c.kind is ct.Kind.NAIVE and c.flagged
    assert "drafted/accepted 165/147, 291/168, 256/195; output changed from run 2" in words.contamination(c)


def test_two_rounds_are_too_few_for_an_interval_or_a_verdict():
    rs = stats.analyze(matrix(TRUTH, 2, noise=0.03), "baseline")
    c = cell(rs, "spec", "a")
    assert c.speedup.verdict is Verdict.TOO_FEW and not c.speedup.interval.available
    assert c.speedup.estimate == pytest.approx(1.5, rel=0.1)
    assert "too few rounds (2)" in words.verdict_rule(c.speedup)
    assert any(w.kind is st.WarningKind.FEW_ROUNDS for w in c.warnings)
    assert "too few to test a trend" in words.contamination(c.contamination)


def test_one_outlier_and_a_first_run_effect():
    def bump(c, r):
        if c == ("spec", "a") and r == 5:
            return 0.6
        if c == ("other", "b") and r == 1:
            return 1.5
        return 1.0
    rs = stats.analyze(matrix(TRUTH, 8, noise=0.01, cell_factor=bump), "baseline")
    out = [w for c in rs.cells for w in c.warnings if w.kind in (st.WarningKind.OUTLIER, st.WarningKind.FIRST_RUN)]
    assert [(w.kind.value, w.key.strategy, w.key.task, w.evidence["run"]) for w in out] == \
        [("outlier", "spec", "a", 5), ("first-run", "other", "b", 1)]
    assert out[0].evidence["deviation"] == pytest.approx(-0.4, abs=0.04) and "slower" in words.warning(out[0])
    assert "caches? start-up?" in words.warning(out[1])


def test_no_outliers_in_plain_noise():
    rs = stats.analyze(matrix(TRUTH, 8, noise=0.05, seed=4), "baseline")
    assert not [w for c in rs.cells for w in c.warnings if w.kind in (st.WarningKind.OUTLIER,
                                                                      st.WarningKind.FIRST_RUN)]


def test_disturbed_runs_are_left_out_and_a_retake_takes_their_place():
    recs = matrix(TRUTH, 4, noise=0.01)
    victim = next(r for r in recs if (r["strategy"], r["task"], r["round"]) == ("spec", "a", 2))
    victim["client"]["decode_tok_s"] /= 3
    victim["interference"] = {"disturbed": True, "others_cores": 1.1}
    rs = stats.analyze(recs, "baseline")
    c = cell(rs, "spec", "a")
    assert sorted(c.speedup.rounds) == [1, 3, 4] and c.speedup.estimate == pytest.approx(1.5, rel=0.03)
    w = next(w for w in c.warnings if w.kind is st.WarningKind.DISTURBED)
    assert w.evidence["runs"] == [2] and "left out" in words.warning(w)
    retake = dict(record("spec", "a", 2, 99, 151.0), retake_of=victim["measurement_id"])
    rs = stats.analyze(recs + [retake], "baseline")
    c = cell(rs, "spec", "a")
    assert sorted(c.speedup.rounds) == [1, 2, 3, 4] and c.speedup.rounds[2] == pytest.approx(1.5, rel=0.03)
    assert "1 retaken" in words.warning(next(w for w in c.warnings if w.kind is st.WarningKind.DISTURBED))


def test_a_host_busy_throughout_keeps_its_runs_and_says_so():
    recs = matrix(TRUTH, 4, noise=0.01)
    for r in recs[: len(recs) * 3 // 4]:
        r["interference"] = {"disturbed": True, "others_cores": 1.9}
    index = CellIndex(recs)
    assert index.busy == {"local": (18, 24)}
    rs = stats.analyze(index, "baseline")
    c = cell(rs, "spec", "a")
    assert c.speedup.interval.n == 4  # nothing left out: leaving out 75% would leave a busy machine unmeasured
    w = next(w for w in c.warnings if w.kind is st.WarningKind.DISTURBED)
    assert w.evidence["kept"] and "describe a busy machine" in words.warning(w)


def test_geomean_over_tasks_and_a_task_with_too_few_rounds():
    rs = stats.analyze(matrix(TRUTH, 4, noise=0.02), "baseline")
    g = next(g for g in rs.geomeans if g.strategy == "spec")
    assert g.estimate == pytest.approx(math.sqrt(1.5), rel=0.03) and g.tasks == ("a", "b") and not g.left_out
    assert g.interval.low < g.estimate < g.interval.high
    recs = [r for r in matrix(TRUTH, 4, noise=0.02) if not (r["task"] == "b" and r["round"] > 2)]
    g = next(g for g in stats.analyze(recs, "baseline").geomeans if g.strategy == "spec")
    assert g.tasks == ("a",) and g.left_out == ("b",) and g.estimate == pytest.approx(1.5, rel=0.03)


@settings(max_examples=40, deadline=None)
@given(hs.integers(0, 10_000), hs.integers(3, 6), hs.sets(hs.tuples(hs.integers(1, 6), hs.sampled_from("ab")),
                                                          max_size=4))
def test_a_geomean_is_never_outside_its_interval(seed, rounds, dropped):
    """Whatever rounds are missing (disturbed and dropped), estimate and interval are of one quantity."""
    recs = [r for r in matrix(TRUTH, rounds, noise=0.15, seed=seed)
            if (r["round"], r["task"]) not in dropped or r["strategy"] == "baseline"]
    for g in stats.analyze(recs, "baseline").geomeans:
        if g.interval.available:
            assert g.interval.low <= g.estimate <= g.interval.high


def test_marks_are_judged_as_one_family():
    rs = stats.analyze(matrix(TRUTH, 4, noise=0.02), "baseline")
    fam = rs.table.family_size
    assert fam == 12  # 4 cells with a baseline and 2 geometric means, two tests each: one family
    s = cell(rs, "spec", "a").speedup
    assert s.judgement.family == fam and s.judgement.p_adjusted <= 0.05
    assert f"Holm over {fam} tests" in words.verdict_rule(s)


# -- adaptive runs ------------------------------------------------------------------------------------------

def test_convergence_names_cells_and_their_baselines():
    quiet = matrix(TRUTH, 6, noise=0.005, seed=1)
    for r in quiet:  # one noisy cell
        if (r["strategy"], r["task"]) == ("other", "b"):
            r["client"]["decode_tok_s"] *= math.exp(np.random.default_rng(r["order"]).normal(0, 0.3))
    conv = cv.convergence(CellIndex(quiet), stats.baseline_map("baseline", ["baseline", "spec", "other"]), 0.05)
    assert conv.pending == [CellKey("local", "other", "b")]
    assert conv.to_run == [CellKey("local", "other", "b"), CellKey("local", "baseline", "b")]
    noisy = next(c for c in conv.cells if c.key == CellKey("local", "other", "b"))
    assert noisy.half_width > 0.05 and noisy.rounds_estimate > 6 and not conv.done
    # Three quiet rounds are narrow enough but too few to stop on.
    bases = stats.baseline_map("baseline", ["baseline", "spec", "other"])
    early = cv.convergence(CellIndex(matrix(TRUTH, 3, noise=0.001)), bases)
    assert not early.done and all(c.half_width < 0.05 and c.rounds_estimate == 5 for c in early.cells)
    assert cv.convergence(CellIndex(matrix(TRUTH, 6, noise=0.005)), bases).done


def test_a_converged_cell_never_shows_an_interval_wider_than_the_target():
    """--until stops a cell on the interval the report shows for it: with noise that differs from cell to cell
    (log-normal spread 0.6), cells whose variance the table's prior would have let stop show wider intervals;
    they stay open, with more rounds estimated than they have."""
    truth = {("baseline", f"t{i}"): 100.0 for i in range(8)}
    truth.update({(f"s{j}", f"t{i}"): 100.0 * (0.6 + 0.1 * j) for j in range(4) for i in range(8)})
    bases = stats.baseline_map("baseline", ["baseline"] + [f"s{j}" for j in range(4)])
    rng = np.random.default_rng(39)
    extra = {c: 0.02 * math.exp(rng.normal(0, 0.6)) for c in truth}
    noise = np.random.default_rng([39, 8])
    index = CellIndex(matrix(truth, 8, noise=0.005, seed=39,
                             cell_factor=lambda c, r: math.exp(noise.normal(0, extra[c]))))
    conv = cv.convergence(index, bases, 0.05)
    table = sp.table(index, bases)
    shown = {k: s.interval.half_width(s.estimate) for k, s in table.cells.items()}
    done = [c for c in conv.cells if c.converged]
    assert len(done) > 20 and all(shown[c.key] <= 0.05 for c in done)
    assert all(c.half_width == pytest.approx(shown[c.key], abs=1e-4) for c in conv.cells)
    wide = [c for c in conv.cells if not c.converged and shown[c.key] > 0.05]
    assert wide and all(c.rounds_estimate > c.rounds for c in wide)


def test_rounds_needed():
    assert cv.rounds_needed(None) is None and cv.rounds_needed(0.0) == 1
    # sd 10%: below 10 rounds t x 0.1 / sqrt(m); from 10 the trimmed mean's factor 1/((h/m)^2 m) on top
    m = cv.rounds_needed(0.1 ** 2)
    assert 30 < m < 75
    # a known variance needs fewer where the cell's own degrees of freedom are few; it never needs more
    assert cv.rounds_needed(0.03 ** 2, df_prior=math.inf) < cv.rounds_needed(0.03 ** 2)
    assert cv.rounds_needed(0.1 ** 2, df_prior=math.inf) == m


# -- the committed demo run ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo() -> tuple[list[dict], stats.RunStats]:
    recs = [json.loads(line) for line in gzip.decompress(DEMO.read_bytes()).decode().splitlines()]
    return recs, stats.analyze(recs, "baseline")


def test_demo_false_baseline_flags_are_gone(demo):
    recs, rs = demo
    assert len(recs) == 96 and len(rs.cells) == 32
    for task in ("en-prose", "long-ctx"):  # flagged "warm-cache contamination suspected" by the 1.2x climb rule
        c = cell(rs, "baseline", task).contamination
        assert c.kind is ct.Kind.NONE and "too few to test a trend" in words.contamination(c)
    assert not [c for c in rs.cells if c.contamination.flagged]
    assert all(c.fingerprint.identical for c in rs.cells)


def test_demo_verdicts(demo):
    _, rs = demo
    verdicts = {(c.key.strategy, c.key.task): c.speedup for c in rs.cells if c.speedup}
    assert len(verdicts) == 24 and rs.table.family_size == 54  # 24 cells and 3 geometric means
    for s in verdicts.values():
        assert s.interval.n == 3 and s.interval.low < s.estimate < s.interval.high
    # Quiet cells borrow the table's noise; a cell noisier than the table keeps its own (wide, fewer df).
    own = [s for s in verdicts.values() if not s.interval.moderated]
    borrowed = [s for s in verdicts.values() if s.interval.moderated]
    assert own and borrowed and min(s.est.se for s in own) > np.median([s.est.se for s in borrowed]) / 2
    assert all(s.interval.df >= 2 for s in verdicts.values())
    # The geometric mean of the paired ratios (2.44, 2.67, 2.23 by round).
    ngram = verdicts[("ngram-mod", "json-out")]
    assert ngram.estimate == pytest.approx(math.exp(np.mean(np.log(list(ngram.rounds.values())))))
    assert ngram.verdict is Verdict.FASTER
    # Judged as a family of 54 tests (cells and geometric means), only the largest speedup of this noisy early run
    # keeps its mark; a cell whose own interval excludes 1 says why it has none.
    assert {k for k, s in verdicts.items() if s.verdict is Verdict.FASTER} == {("ngram-mod", "json-out")}
    edit = verdicts[("ngram-mod", "code-edit")]
    assert edit.interval.low > 1 and edit.verdict is Verdict.NOT_SIGNIFICANT
    assert "not at the table's family level" in words.verdict_rule(edit)
    for g in rs.geomeans:
        assert g.interval.low < g.estimate < g.interval.high


# -- what a table can say: power, tasks like these, one run 3x slower ---------------------------------------------

def test_the_rounds_projection_uses_the_median_noise_and_grows_as_the_square_of_the_noise():
    """96 cells of one noise at 3 rounds: the table's per-round noise is the paired variance (2 x 5%^2) within its
    bounds, and a noise twice as large needs nearly four times the rounds (fewer: its degrees of freedom grow
    too; bench/rounds_projection.py checks the share marked at the stated rounds)."""
    truth = {(s, f"t{i}"): 100.0 for s in ("baseline", *(f"s{j}" for j in range(11))) for i in range(8)}
    t = sp.table(CellIndex(matrix(truth, 3, noise=0.05, seed=5)), {"baseline": None} | {
        f"s{j}": "baseline" for j in range(11)})
    noise = sp.table_noise(list(t.cells.values()), t.family_size)
    assert noise.low <= 2 * 0.05 ** 2 <= noise.high and 0.7 < noise.variance / (2 * 0.05 ** 2) < 1.4
    n = sp.rounds_to_mark(noise, math.log(1.10))
    louder = sp.rounds_to_mark(sp.Noise(4 * noise.variance, 0, 0, noise.df_share, noise.family), math.log(1.10))
    assert n is not None and louder is not None and 2.5 < louder / n < 4
    assert sp.rounds_to_mark(noise, math.log(1.10), "low") <= n <= sp.rounds_to_mark(noise, math.log(1.10), "high")


def test_half_marked_takes_the_spread_of_a_few_rounds_standard_error_into_account():
    """At 3 unmoderated rounds an estimate's standard error falls below the truth more than half the time, so the
    value marked half the time is the bare threshold times the median of sqrt(chi2_2 / 2) (0.83);
    bench/builds_power.py checks it on the committed builds run (46% and 55%)."""
    noise = sp.Noise(0.04, 0.03, 0.05, 1.0, 18)
    bare = sp.inf.smallest_marked(sp.inf.Estimate(0.0, math.sqrt(0.04 / 3), 2.0, 3, sp.inf.Method.MEAN, True), 18)
    assert sp.half_marked(noise, 3) == pytest.approx(bare * math.sqrt(math.log(4) / 2), rel=1e-9)
    assert sp.half_marked(noise, 2) is None


def test_one_run_three_times_slower_makes_its_cell_unstable_and_no_other():
    """96 cells as in the demo, 3 rounds, 5% noise (in 10 seeds: found 10 times; with 48 cells 8 times)."""
    truth = {(s, f"t{i}"): 100.0 for s in ("baseline", *(f"s{j}" for j in range(11))) for i in range(8)}
    recs = matrix(truth, 3, noise=0.05, seed=3)
    slow = next(r for r in recs if (r["strategy"], r["task"], r["round"]) == ("s2", "t5", 2))
    slow["client"]["decode_tok_s"] /= 3
    rs = stats.analyze(recs, "baseline")
    flagged = {(c.key.strategy, c.key.task): c.contamination for c in rs.cells if c.contamination.flagged}
    assert list(flagged) == [("s2", "t5")] and flagged[("s2", "t5")].why == "noisy"
    assert "improbable under the run's own noise" in words.contamination(flagged[("s2", "t5")])


def test_a_committed_table_states_its_power_and_its_geomeans_for_tasks_like_these():
    from harness.analysis.summary import summarize  # noqa: PLC0415
    from harness.store.rundir import RunDir  # noqa: PLC0415

    s = summarize(RunDir.open(ROOT / "results" / "demo-cpu"))
    fam = s["family"]
    assert fam["tests"] == 2 * (fam["cells"] + fam["geomeans"]) and fam["geomeans"] == len(s["geomeans"])
    power = fam["power"]
    assert 1 < power["geomeans"] < power["cells"] <= power["noisiest_quarter"]
    assert f"a cell is marked ▲ from {power['cells']:.2f}x" in power["sentence"]
    assert "1.10x needs about" in power["sentence"]
    low, high = power["rounds_range"]["1.10"]
    assert power["rounds"] < low <= power["rounds_for"]["1.10"] <= high
    for g in s["geomeans"]:
        tasks, prompts = g["between_tasks"], g["interval"]
        assert g["interval_scope"] == "these prompts" and tasks["scope"] == "tasks like these"
        assert tasks["low"] <= prompts["low"] and prompts["high"] <= tasks["high"]  # tasks differ more than prompts
    quiet = [c for c in s["cells"] if c["verdict"] and c["verdict"]["kind"] == "not significant"]
    assert quiet and all("these rounds mark this cell from" in c["verdict"]["rule"] for c in quiet)
    assert all(c["verdict"]["smallest_marked"] > 1 for c in quiet)
