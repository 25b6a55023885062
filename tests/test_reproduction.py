"""harness.analysis.reproduction: B/A of the speedups against a margin, differs judged as a family, and an
inconclusive comparison that says what would decide it."""

from __future__ import annotations

import pytest

from harness.analysis import reproduction as rp
from harness.analysis import stats, words
from harness.analysis.records import CellKey
from tests.test_stats import TRUTH, matrix


def analyze(recs: list[dict]) -> stats.RunStats:
    return stats.analyze(recs, "baseline")


def test_speedups_are_judged_not_absolute_rates():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    slower_machine = {k: v * 0.6 for k, v in TRUTH.items()}
    rep = rp.reproduction(a, analyze(matrix(slower_machine, 8, noise=0.01, seed=2)))
    assert rep.counts() == {"n/a": 2, "reproduces": 4} and rep.fingerprints() == {"identical": 6}
    assert [g.call for g in rep.geomeans] == [rp.Call.REPRODUCES, rp.Call.REPRODUCES]
    assert rep.call is rp.Call.REPRODUCES
    assert all(r.tok_s_ratio == pytest.approx(0.6, rel=0.05) for r in rep.rows)
    text = words.headline(rep)
    assert text.startswith("reproduces: speedups 4 reproduce") and "hardware- and state-dependent" in text


def test_a_relevant_difference_differs_and_decides_the_headline():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    changed = dict(TRUTH)
    changed[("spec", "a")] = 200.0  # 1.33x instead of 1.5x on one task
    b = analyze(matrix(changed, 8, noise=0.01, seed=2,
                       drafts=lambda c, r: (0, 0) if c[0] == "baseline" else (100, 90)))
    rep = rp.reproduction(a, b)
    row = next(r for r in rep.rows if (r.strategy, r.task) == ("spec", "a"))
    assert row.call is rp.Call.DIFFERS and row.interval.low > 1.05 and row.p_adjusted <= 0.05  # 2.0x vs 1.5x
    assert "wholly outside ±5%" in words.row_rule(row, rep.margin)
    assert row.fingerprint is rp.Match.DIFFER
    assert rep.call is rp.Call.DIFFERS and words.headline(rep).startswith("differs")


def test_a_wider_margin_turns_a_small_difference_into_a_reproduction():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    changed = dict(TRUTH)
    changed[("spec", "a")] = 160.0  # 1.6x against 1.5x: +6.7%
    b = analyze(matrix(changed, 8, noise=0.01, seed=2))
    at5 = rp.reproduction(a, b, 0.05)
    at15 = rp.reproduction(a, b, 0.15)
    assert next(r for r in at5.rows if (r.strategy, r.task) == ("spec", "a")).call is not rp.Call.REPRODUCES
    assert at15.call is rp.Call.REPRODUCES


def test_the_headline_reproduces_on_the_geometric_means_while_a_noisy_cell_stays_inconclusive():
    """One cell is one prompt's sample: a cell inconclusive at the margin does not hold the headline back when
    every geometric mean lies inside it and no cell differs."""
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    noisy = matrix(TRUTH, 8, noise=0.01, seed=2)
    for i, r in enumerate(x for x in noisy if (x["strategy"], x["task"]) == ("spec", "a")):
        r["client"]["decode_tok_s"] *= (1.07, 0.94)[i % 2]  # this cell's B/A interval straddles ±5%
    rep = rp.reproduction(a, analyze(noisy), 0.05)
    row = next(r for r in rep.rows if (r.strategy, r.task) == ("spec", "a"))
    assert row.call is rp.Call.INCONCLUSIVE and not any(r.call is rp.Call.DIFFERS for r in rep.rows)
    assert all(g.call is rp.Call.REPRODUCES for g in rep.geomeans) and rep.call is rp.Call.REPRODUCES


def test_inconclusive_says_the_smallest_margin_and_the_rounds_a_margin_needs():
    a = analyze(matrix(TRUTH, 6, noise=0.06, seed=1))
    b = analyze(matrix(TRUTH, 3, noise=0.06, seed=3))
    rep = rp.reproduction(a, b)
    assert rep.call is rp.Call.INCONCLUSIVE
    assert rep.smallest_margin is not None and rep.smallest_margin > 0.05
    text = words.headline(rep)
    assert f"these rounds could confirm the geometric means within ±{rep.smallest_margin:.1%}" in text
    assert ("needs about" in text) == (rep.rounds_needed is not None)
    # With many more rounds on both sides the same truth reproduces within ±15%.
    wide = rp.reproduction(analyze(matrix(TRUTH, 10, noise=0.06, seed=1)), analyze(matrix(TRUTH, 10, noise=0.06,
                                                                                             seed=4)), 0.15)
    assert wide.call is rp.Call.REPRODUCES


def test_rounds_needed_in_b_are_enough():
    a = analyze(matrix(TRUTH, 12, noise=0.03, seed=1))
    b = analyze(matrix(TRUTH, 3, noise=0.03, seed=5))
    rep = rp.reproduction(a, b)
    assert rep.call is rp.Call.INCONCLUSIVE and rep.rounds_needed is not None and rep.rounds_needed > 3
    more = analyze(matrix(TRUTH, rep.rounds_needed + 2, noise=0.03, seed=5))
    assert rp.reproduction(a, more).call is rp.Call.REPRODUCES


def test_independent_replicates_rarely_differ():
    """Ten strategies on four tasks, 3 rounds, the demo's noise: replicates of one truth are compared 20 times."""
    truth = {("baseline", f"t{i}"): 100.0 for i in range(4)}
    truth.update({(f"s{j}", f"t{i}"): 100.0 * (0.5 + 0.1 * j) for j in range(10) for i in range(4)})
    calls = [rp.reproduction(analyze(matrix(truth, 3, noise=0.066, seed=2 * k)),
                             analyze(matrix(truth, 3, noise=0.066, seed=2 * k + 1))).call for k in range(20)]
    assert calls.count(rp.Call.DIFFERS) <= 2


def test_a_cell_missing_in_b_keeps_the_headline_from_reproducing():
    a = analyze(matrix(TRUTH, 8, noise=0.01, seed=1))
    b_recs = [r for r in matrix(TRUTH, 8, noise=0.01, seed=2) if (r["strategy"], r["task"]) != ("other", "b")]
    rep = rp.reproduction(a, analyze(b_recs))
    missing = next(r for r in rep.rows if (r.strategy, r.task) == ("other", "b"))
    assert missing.call is rp.Call.MISSING and rep.call is not rp.Call.REPRODUCES
    assert CellKey("local", "other", "b") not in analyze(b_recs).table.cells
