"""harness.analysis.reproduction: B/A of the speedups against a margin (each cell against the cell margin),
differs judged as a family, one estimator on both sides, a headline that names the cells it could not confirm,
and an inconclusive comparison that says what would decide it."""

from __future__ import annotations

import math

import pytest

from harness.analysis import inference as inf
from harness.analysis import reproduction as repro
from harness.analysis import stats, words
from harness.analysis.records import CellKey
from tests.test_stats import TRUTH, matrix


def analyze(recs: list[dict]) -> stats.RunStats:
    return stats.analyze(recs, "baseline")


def _row(rep: repro.Reproduction, strategy: str, task: str) -> repro.Row:
    return next(r for r in rep.rows if (r.strategy, r.task) == (strategy, task))


def test_speedups_are_judged_not_absolute_rates():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    slower_machine = {k: v * 0.6 for k, v in TRUTH.items()}
    rep = repro.reproduction(a, analyze(matrix(slower_machine, 8, noise=0.01, seed=2)))
    assert rep.counts() == {"n/a": 2, "reproduces": 4} and rep.fingerprints() == {"identical": 6}
    assert [g.call for g in rep.geomeans] == [repro.Call.REPRODUCES, repro.Call.REPRODUCES]
    assert rep.call is repro.Call.REPRODUCES and rep.unresolved == [] and rep.worst is None
    assert all(r.tok_s_ratio == pytest.approx(0.6, rel=0.05) for r in rep.rows)
    text = words.headline(rep)
    assert text.startswith("reproduces: speedups 4 reproduce (B/A within ±10%)") and "hardware- and state" in text


def test_a_relevant_difference_differs_and_decides_the_headline():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    changed = dict(TRUTH)
    changed[("spec", "a")] = 200.0  # 1.33x instead of 1.5x on one task
    b = analyze(matrix(changed, 8, noise=0.01, seed=2,
                       drafts=lambda c, r: (0, 0) if c[0] == "baseline" else (100, 90)))
    rep = repro.reproduction(a, b)
    row = _row(rep, "spec", "a")
    assert row.call is repro.Call.DIFFERS and row.interval.low > 1.10 and row.p_adjusted <= 0.05  # 2.0x vs 1.5x
    assert row.margin == pytest.approx(0.10) and "wholly outside ±10%" in words.row_rule(row)
    assert row.fingerprint is repro.Match.DIFFER
    assert rep.call is repro.Call.DIFFERS and words.headline(rep).startswith("differs")


def test_a_wider_margin_turns_a_small_difference_into_a_reproduction():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    changed = dict(TRUTH)
    changed[("spec", "a")] = 165.0  # 1.65x against 1.5x: +10%
    b = analyze(matrix(changed, 8, noise=0.01, seed=2))
    at5 = repro.reproduction(a, b, 0.05)
    at15 = repro.reproduction(a, b, 0.15)
    assert _row(at5, "spec", "a").call is not repro.Call.REPRODUCES and at5.call is not repro.Call.REPRODUCES
    assert at15.call is repro.Call.REPRODUCES and at15.cell_margin == pytest.approx(0.30)


def test_a_regressed_cell_keeps_the_headline_from_reproducing_and_is_named():
    """One task of one strategy 30% slower in B: the geometric means still lie within ±15%, but the cell's B/A does
    not lie within the cell margin (±30%): measured precisely it differs, measured noisily the headline says which
    cell it could not confirm."""
    truth = {("baseline", f"t{i}"): 100.0 for i in range(6)}
    truth.update({("spec", f"t{i}"): 150.0 for i in range(6)})
    a = analyze(matrix(truth, 5, noise=0.01, seed=1))
    changed = dict(truth)
    changed[("spec", "t3")] = 150.0 * 0.7
    precise = repro.reproduction(a, analyze(matrix(changed, 5, noise=0.01, seed=2)), 0.15)
    assert [g.call for g in precise.geomeans] == [repro.Call.REPRODUCES]  # 0.7^(1/6) = 0.94: inside ±15%
    assert _row(precise, "spec", "t3").call is repro.Call.DIFFERS and precise.call is repro.Call.DIFFERS
    wobble = (1.25, 0.8, 1.2, 0.85, 1.1)  # B's regressed cell measured noisily: its interval straddles 1/1.3
    b = analyze(matrix(changed, 5, noise=0.01, seed=2,
                       cell_factor=lambda c, r: wobble[r - 1] if c == ("spec", "t3") else 1.0))
    rep = repro.reproduction(a, b, 0.15)
    assert [g.call for g in rep.geomeans] == [repro.Call.REPRODUCES]
    assert rep.call is repro.Call.GEOMEANS_REPRODUCE and [(r.strategy, r.task) for r in rep.unresolved] == [
        ("spec", "t3")]
    worst = rep.worst
    iv = worst.interval
    assert worst.call is repro.Call.INCONCLUSIVE and iv.low < 1 / 1.3 < iv.high < 1
    text = words.headline(rep)
    assert text.startswith(f"geometric means reproduce; 1 cell unresolved (worst spec / t3 B/A "
                           f"{worst.ratio:.2f}x [{iv.low:.2f}, {iv.high:.2f}], not within ±30%)"), text
    # a cell margin wide enough to hold it lets the headline reproduce
    assert repro.reproduction(a, b, 0.15, 1.0).call is repro.Call.REPRODUCES
    assert repro.reproduction(a, analyze(matrix(truth, 5, noise=0.01, seed=2)), 0.15).call is repro.Call.REPRODUCES


def test_an_inconclusive_cell_is_never_passed_over():
    """A cell whose B/A interval straddles the cell margin leaves the headline at "geometric means reproduce",
    however well the geometric means agree."""
    truth = {("baseline", f"t{i}"): 100.0 for i in range(6)}
    truth.update({("spec", f"t{i}"): 150.0 for i in range(6)})
    a = analyze(matrix(truth, 8, noise=0.01, seed=1))
    noisy = matrix(truth, 8, noise=0.01, seed=2,
                   cell_factor=lambda c, r: (1.3, 0.77)[r % 2] if c == ("spec", "t0") else 1.0)
    rep = repro.reproduction(a, analyze(noisy), 0.10)
    row = _row(rep, "spec", "t0")
    assert row.call is repro.Call.INCONCLUSIVE and not any(r.call is repro.Call.DIFFERS for r in rep.rows)
    assert row.interval.low < 1 / 1.2 and row.interval.high > 1.2
    assert [g.call for g in rep.geomeans] == [repro.Call.REPRODUCES]
    assert rep.call is repro.Call.GEOMEANS_REPRODUCE and rep.worst is row
    assert "1 cell unresolved (worst spec / t0 B/A" in words.headline(rep)


def test_a_cell_without_an_interval_is_unresolved_too():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    b_recs = [r for r in matrix(TRUTH, 8, noise=0.01, seed=2)
              if not ((r["strategy"], r["task"]) == ("spec", "b") and r["round"] > 2)]
    rep = repro.reproduction(a, analyze(b_recs))
    row = _row(rep, "spec", "b")
    assert row.est is None and row.call is repro.Call.INCONCLUSIVE and rep.call is repro.Call.GEOMEANS_REPRODUCE
    assert "worst spec / b without a B/A interval (2 rounds, needs 3)" in words.headline(rep)


def test_one_estimator_on_both_sides():
    """A in 3 rounds, B in 12: both speedups are geometric means (a 12-round trimmed mean against a 3-round mean
    compares two quantities when the ratios are skewed); with 12 rounds a side, both are trimmed means."""
    slow = {("spec", "a"): {3, 7}}  # two slow rounds of twelve in B: the trimmed mean leaves them out
    b_recs = matrix(TRUTH, 12, noise=0.01, seed=2)
    for r in b_recs:
        if r["round"] in slow.get((r["strategy"], r["task"]), ()):
            r["client"]["decode_tok_s"] *= 0.5
    b = analyze(b_recs)
    assert b.table.cells[CellKey("local", "spec", "a")].est.method is inf.Method.TRIMMED  # the report's own
    rep = repro.reproduction(analyze(matrix(TRUTH, 3, noise=0.01, seed=1)), b, 0.15)
    row = _row(rep, "spec", "a")
    assert row.est_a.method is row.est_b.method is inf.Method.MEAN
    logs = [math.log(v) for v in b.table.cells[CellKey("local", "spec", "a")].rounds.values()]
    assert row.est_b.estimate == pytest.approx(sum(logs) / len(logs))  # the plain mean of all twelve
    assert row.ratio == pytest.approx(0.5 ** (2 / 12), rel=0.02)  # the slow rounds count on both sides' terms
    both = repro.reproduction(analyze(matrix(TRUTH, 12, noise=0.01, seed=1)), b, 0.15)
    assert _row(both, "spec", "a").est_a.method is _row(both, "spec", "a").est_b.method is inf.Method.TRIMMED
    assert _row(both, "spec", "a").ratio == pytest.approx(1.0, abs=0.03)
    assert repro.common_method(3, 12) is inf.Method.MEAN and repro.common_method(10, 12) is inf.Method.TRIMMED


def test_inconclusive_says_the_smallest_margin_and_the_rounds_a_margin_needs():
    a = analyze(matrix(TRUTH, 6, noise=0.06, seed=1))
    b = analyze(matrix(TRUTH, 3, noise=0.06, seed=3))
    rep = repro.reproduction(a, b)
    assert rep.call is repro.Call.INCONCLUSIVE
    assert rep.smallest_margin is not None and rep.smallest_margin > 0.05
    text = words.headline(rep)
    assert f"these rounds could confirm the geometric means within ±{rep.smallest_margin:.1%}" in text
    assert ("for the geometric means needs about" in text) == (rep.rounds_needed is not None)
    # With many more rounds on both sides the same truth reproduces within ±15%.
    wide = repro.reproduction(analyze(matrix(TRUTH, 10, noise=0.06, seed=1)), analyze(matrix(TRUTH, 10, noise=0.06,
                                                                                             seed=4)), 0.15)
    assert wide.call is repro.Call.REPRODUCES


def test_rounds_needed_in_b_are_enough():
    a = analyze(matrix(TRUTH, 12, noise=0.03, seed=1))
    b = analyze(matrix(TRUTH, 3, noise=0.03, seed=5))
    rep = repro.reproduction(a, b)
    assert rep.call is repro.Call.INCONCLUSIVE and rep.rounds_needed is not None and rep.rounds_needed > 3
    more = analyze(matrix(TRUTH, max(rep.rounds_needed, rep.cell_rounds_needed or 0) + 2, noise=0.03, seed=5))
    assert repro.reproduction(a, more).call is repro.Call.REPRODUCES


def test_independent_replicates_rarely_differ():
    """Ten strategies on four tasks, 3 rounds, the demo's noise: replicates of one truth are compared 20 times."""
    truth = {("baseline", f"t{i}"): 100.0 for i in range(4)}
    truth.update({(f"s{j}", f"t{i}"): 100.0 * (0.5 + 0.1 * j) for j in range(10) for i in range(4)})
    calls = [repro.reproduction(analyze(matrix(truth, 3, noise=0.066, seed=2 * k)),
                             analyze(matrix(truth, 3, noise=0.066, seed=2 * k + 1))).call for k in range(20)]
    assert calls.count(repro.Call.DIFFERS) <= 2


def test_a_cell_missing_in_b_keeps_the_headline_from_reproducing():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    b_recs = [r for r in matrix(TRUTH, 8, noise=0.01, seed=2) if (r["strategy"], r["task"]) != ("other", "b")]
    rep = repro.reproduction(a, analyze(b_recs))
    missing = _row(rep, "other", "b")
    assert missing.call is repro.Call.MISSING and rep.call is repro.Call.GEOMEANS_REPRODUCE
    assert "worst other / b not measured in B" in words.headline(rep)
    assert CellKey("local", "other", "b") not in analyze(b_recs).table.cells


def test_the_worst_unresolved_cell_is_the_likeliest_to_differ_not_the_noisiest():
    """A regressed cell (B/A 0.70x, its interval reaching into the cell margin) and a noisy cell that agrees (B/A
    1.00x with a wider interval): the headline names the regressed one."""
    truth = {("baseline", f"t{i}"): 100.0 for i in range(6)}
    truth.update({("spec", f"t{i}"): 150.0 for i in range(6)})
    a = analyze(matrix(truth, 5, noise=0.01, seed=1))
    changed = dict(truth)
    changed[("spec", "t3")] = 150.0 * 0.7
    wobble = {"t3": (1.25, 0.8, 1.2, 0.85, 1.1), "t0": (2.0, 0.5, 1.9, 0.52, 1.0)}
    b = analyze(matrix(changed, 5, noise=0.01, seed=2,
                       cell_factor=lambda c, r: wobble[c[1]][r - 1] if c[0] == "spec" and c[1] in wobble else 1.0))
    rep = repro.reproduction(a, b, 0.15)
    noisy, regressed = _row(rep, "spec", "t0"), _row(rep, "spec", "t3")
    assert {r.task for r in rep.unresolved} == {"t0", "t3"} and noisy.reach > regressed.reach
    assert rep.worst is regressed and regressed.p_outside < noisy.p_outside
    assert f"(worst spec / t3 B/A {regressed.ratio:.2f}x" in words.headline(rep)
