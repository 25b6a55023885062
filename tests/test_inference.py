"""harness.analysis.inference: locations, the empirical-Bayes prior, intervals and tests that agree with each
other, Holm's procedure, and the family-wise error rate of a whole table on simulated A/A data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from scipy import stats as sps

from harness.analysis import inference as inf


def test_below_ten_values_the_location_is_the_mean_with_its_t_interval():
    xs = [0.10, 0.25, 0.32, 0.18]
    loc = inf.locate(xs)
    assert loc.method is inf.Method.MEAN and loc.estimate == pytest.approx(np.mean(xs)) and loc.df == 3
    est = inf.moderate(loc, inf.NO_PRIOR)
    lo, hi = est.interval()
    ci = sps.ttest_1samp(xs, 0.0).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ci.low, ci.high))
    assert est.p_differs() == pytest.approx(sps.ttest_1samp(xs, 0.0).pvalue)


def test_from_ten_values_a_trimmed_mean_shrugs_off_one_slow_round():
    rng = np.random.default_rng(5)
    xs = list(math.log(1.3) + rng.normal(0, 0.05, 10))
    clean = inf.moderate(inf.locate(xs), inf.NO_PRIOR)
    xs[4] -= math.log(3)  # one measurement 3x slower
    hit = inf.moderate(inf.locate(xs), inf.NO_PRIOR)
    assert hit.method is inf.Method.TRIMMED and hit.df == 5  # 20% trimmed each side: 6 kept
    assert abs(hit.estimate - clean.estimate) < 0.03
    assert hit.interval()[0] > 0  # still clearly faster; the mean would not be
    mean_lo = sps.ttest_1samp(xs, 0.0).confidence_interval(0.95).low
    assert mean_lo < 0


def test_no_values_no_location_and_one_value_no_interval():
    assert inf.locate([]) is None
    one = inf.moderate(inf.locate([0.2]), inf.NO_PRIOR)
    assert not one.testable and one.p_differs() == 1.0 and not inf.Interval.of(one).available


def test_the_prior_sees_agreeing_and_differing_variances():
    rng = np.random.default_rng(1)
    same = [(float(np.var(rng.normal(0, 0.1, 3), ddof=1)), 2) for _ in range(200)]
    p = inf.fit_prior(same)
    assert p.d0 > 30 and p.sd == pytest.approx(0.1, rel=0.15)
    spread = [(float(np.var(rng.normal(0, s, 3), ddof=1)), 2) for s in np.exp(rng.uniform(-4, 0, 200))]
    assert inf.fit_prior(spread).d0 < 10
    assert inf.fit_prior(same[:3]) == inf.NO_PRIOR  # too few cells to say how variances differ


def test_moderation_pulls_a_cell_toward_the_table():
    loc = inf.locate([0.0, 0.01, 0.02])
    prior = inf.Prior(10.0, 0.01, 50)
    est = inf.moderate(loc, prior)
    own = inf.moderate(loc, inf.NO_PRIOR)
    assert est.df == 12 and est.se > own.se and est.moderated
    assert inf.moderate(loc, inf.Prior(math.inf, 0.01, 50)).se == pytest.approx(math.sqrt(0.01 / 3))


def test_a_cell_much_noisier_than_the_table_keeps_its_own_variance():
    rng = np.random.default_rng(2)
    locs = [inf.locate(list(rng.normal(0, 0.05, 3))) for _ in range(40)] + [inf.locate([-0.6, 0.0, 0.6])]
    ests, prior = inf.estimates(locs)
    assert ests[-1].se == pytest.approx(inf.moderate(locs[-1], inf.NO_PRIOR).se)
    assert ests[0].moderated and not ests[-1].moderated


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.floats(-1, 1, allow_nan=False), min_size=3, max_size=15),
       hs.floats(0.001, 0.3), hs.floats(-0.5, 0.5))
def test_tests_and_intervals_say_the_same_thing(xs, band, shift):
    xs = [x + shift for x in xs]
    est = inf.moderate(inf.locate(xs), inf.NO_PRIOR)
    if not est.testable or est.se == 0 or not math.isfinite(est.se):
        return
    lo, hi = est.interval()
    eps = 1e-9
    if abs(lo) > eps and abs(hi) > eps:
        assert (est.p_differs() <= 0.05) == (lo > 0 or hi < 0)
    if min(abs(abs(lo) - band), abs(abs(hi) - band)) > eps:
        assert (est.p_within(band) <= 0.05) == (-band < lo and hi < band)
        assert (est.p_outside(band) <= 0.05) == (lo > band or hi < -band)


def test_holm():
    p = [0.01, 0.04, 0.03, 0.005]
    assert inf.holm(p) == [True, False, False, True]
    adj = inf.holm_adjusted(p)
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [a <= 0.05 for a in adj] == inf.holm(p)
    assert inf.holm([]) == [] and inf.holm([0.5]) == [False]


def test_combine_and_difference():
    a = inf.Estimate(0.2, 0.1, 4, 5, inf.Method.MEAN, False)
    b = inf.Estimate(0.4, 0.1, 4, 5, inf.Method.MEAN, False)
    g = inf.combine([a, b])
    assert g.estimate == pytest.approx(0.3) and g.se == pytest.approx(math.sqrt(0.005)) and g.df == pytest.approx(8)
    d = inf.difference(b, a)
    assert d.estimate == pytest.approx(0.2) and d.se == pytest.approx(math.sqrt(0.02)) and d.df == pytest.approx(8)


def _aa_table(rng: np.random.Generator, rounds: int, cells: int = 88, noise: float = 0.066) -> list[inf.Estimate]:
    base = rng.normal(0, noise, (8, rounds))
    logs = [rng.normal(0, noise, rounds) - base[i % 8] for i in range(cells)]
    return inf.estimates([inf.locate(list(x)) for x in logs])[0]


@pytest.mark.parametrize("rounds", [3, 10])
def test_a_table_of_true_nulls_has_no_false_mark_in_most_tables(rounds):
    """88 cells of true speedup 1 sharing baselines, as in the demo: the whole table is one family."""
    rng = np.random.default_rng(11)
    tables = 100
    with_false = 0
    for _ in range(tables):
        ests = _aa_table(rng, rounds)
        ps = [e.p_differs() for e in ests] + [e.p_within(math.log(1.02)) for e in ests]
        with_false += any(inf.holm(ps)[: len(ests)])
    assert with_false <= 8  # nominal 5%
    # Judged one cell at a time, nearly every table would show a false mark.
    rng = np.random.default_rng(11)
    single = sum(any(e.p_differs() <= 0.05 for e in _aa_table(rng, rounds)) for _ in range(20))
    assert single >= 15
