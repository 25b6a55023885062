"""harness.analysis.inference: locations, the robust empirical-Bayes prior, the two parts of a paired variance,
intervals and tests that agree with each other, Holm's procedure, the family-wise error rate
of a whole table on simulated A/A data, power, and the instability test."""

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
    # 20% trimmed each side: 6 kept; 0.8 x (h - 1) degrees of freedom (the winsorized variance's tails)
    assert hit.method is inf.Method.TRIMMED and hit.df == pytest.approx(4.0)
    assert abs(hit.estimate - clean.estimate) < 0.03
    assert hit.interval()[0] > 0  # still clearly faster; the mean would not be
    mean_lo = sps.ttest_1samp(xs, 0.0).confidence_interval(0.95).low
    assert mean_lo < 0


def test_no_values_no_location_and_one_value_no_interval():
    assert inf.locate([]) is None
    one = inf.moderate(inf.locate([0.2]), inf.NO_PRIOR)
    assert not one.testable and one.p_differs() == 1.0 and not inf.Interval.of(one).available


def test_the_prior_sees_agreeing_and_differing_variances_and_its_weight_is_bounded():
    rng = np.random.default_rng(1)
    same = [(float(np.var(rng.normal(0, 0.1, 3), ddof=1)), 2) for _ in range(200)]
    p = inf.fit_prior(same)
    assert p.d0 == pytest.approx(inf.PRIOR_WEIGHT * 2) and p.sd == pytest.approx(0.1, rel=0.15)
    spread = [(float(np.var(rng.normal(0, s, 3), ddof=1)), 2) for s in np.exp(rng.uniform(-4, 0, 200))]
    assert inf.fit_prior(spread).d0 < 2
    assert inf.fit_prior(same[:3]) == inf.NO_PRIOR  # too few cells to say how variances differ
    assert inf.fit_prior(same, weight=0.5).d0 == pytest.approx(1.0)


def test_the_prior_is_fitted_on_the_central_cells():
    """A fifth of the cells ten times noisier moves the prior's scale little: they keep their own."""
    rng = np.random.default_rng(3)
    quiet = [(float(np.var(rng.normal(0, 0.05, 5), ddof=1)), 4) for _ in range(80)]
    loud = [(float(np.var(rng.normal(0, 0.5, 5), ddof=1)), 4) for _ in range(20)]
    assert inf.fit_prior(quiet + loud).sd < 0.07


def test_moderation_pulls_a_quiet_cell_up_and_never_narrows_a_noisy_one():
    loc = inf.locate([0.0, 0.01, 0.02])
    prior = inf.Prior(10.0, 0.01, 50)
    est = inf.moderate(loc, prior)
    own = inf.moderate(loc, inf.NO_PRIOR)
    assert est.se > own.se and est.moderated
    # Satterthwaite: a variance borrowed almost wholly from the prior has about the prior's weight in df
    assert 10 <= est.df < 12
    loud = inf.locate([0.0, 0.3, 0.6])
    kept = inf.moderate(loud, prior)
    assert kept.se == pytest.approx(inf.moderate(loud, inf.NO_PRIOR).se) and not kept.moderated
    assert kept.df == 2  # its own variance with its own degrees of freedom: its own t-interval
    # an unbounded prior is worth at most MAX_DF
    assert inf.moderate(loc, inf.Prior(math.inf, 0.01, 50)).df == pytest.approx(inf.MAX_DF, rel=0.01)


def test_a_cell_much_noisier_than_the_table_keeps_its_own_variance():
    rng = np.random.default_rng(2)
    locs = [inf.locate(list(rng.normal(0, 0.05, 3))) for _ in range(40)] + [inf.locate([-0.6, 0.0, 0.6])]
    ests, prior = inf.estimates(locs)
    assert ests[-1].se == pytest.approx(inf.moderate(locs[-1], inf.NO_PRIOR).se)
    assert not ests[-1].moderated and any(e.moderated for e in ests[:-1])


def test_round_effects_leave_the_cells_own_units_out():
    rng = np.random.default_rng(4)
    rho = {1: 0.3, 2: -0.2, 3: 0.0, 4: 0.1}
    series = {u: {r: 5.0 + f + rng.normal(0, 0.01) for r, f in rho.items()} for u in range(8)}
    eff = inf.RoundEffects(series)
    f = eff.factors(frozenset({0, 1}))
    assert f is not None and f[1] - f[2] == pytest.approx(0.5, abs=0.02)
    assert max(abs(x) for x in eff.residuals(0, f).values()) < 0.05
    assert eff.factors(frozenset(range(5))) is None  # 3 other units: too few for a round's factor


def _demo_like(rng, rounds, base_sd, strat_sd, tasks=8, strategies=10, truth=0.0):
    """Log tok/s of baselines and strategies (one prompt per task) with a round factor, as inf.Paired cells."""
    rho = rng.normal(0, 0.05, rounds)
    base = {t: 7.0 + rho + rng.normal(0, base_sd[t], rounds) for t in range(tasks)}
    strat = {(s, t): 7.0 + truth + rho + rng.normal(0, strat_sd, rounds) for s in range(strategies)
             for t in range(tasks)}
    series = {("b", t): dict(enumerate(v)) for t, v in base.items()} | {k: dict(enumerate(v)) for k, v in
                                                                       strat.items()}
    eff = inf.RoundEffects(series)
    cells = []
    for (s, t), v in strat.items():
        f = eff.factors(frozenset({(s, t), ("b", t)}))
        cells.append(inf.Paired(list(v - base[t]), list(eff.residuals((s, t), f).values()),
                                list(eff.residuals(("b", t), f).values()), t))
    return cells


def test_a_noisy_baseline_widens_every_cell_of_its_task():
    """Two parts: a baseline 6x noisier than the others is not pooled away; its task's cells are wide, the others
    carry up to twice the paired ratios' degrees of freedom."""
    rng = np.random.default_rng(6)
    base_sd = {t: 0.3 if t == 0 else 0.05 for t in range(8)}
    ests, priors = inf.paired_estimates(_demo_like(rng, 3, base_sd, 0.05))
    noisy = [e.se for i, e in enumerate(ests) if i % 8 == 0]
    quiet = [e.se for i, e in enumerate(ests) if i % 8 != 0]
    assert min(noisy) > 3 * float(np.median(quiet))
    assert priors.strategy.cells == 80 and priors.baseline.cells == 8
    assert float(np.median([e.df for i, e in enumerate(ests) if i % 8])) > 2


def test_without_other_units_a_cell_goes_by_its_paired_variance():
    est, priors = inf.paired_estimates([inf.Paired([0.1, 0.2, 0.15])])
    own = inf.moderate(inf.locate([0.1, 0.2, 0.15]), inf.NO_PRIOR)
    assert est[0].se == pytest.approx(own.se) and est[0].df == 2 and priors.main == inf.NO_PRIOR


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
    lo90, hi90 = est.interval(0.90)  # two one-sided tests at 5%: the 90% interval
    if min(abs(abs(lo90) - band), abs(abs(hi90) - band)) > eps:
        assert (est.p_equivalent(band) <= 0.05) == (-band < lo90 and hi90 < band)
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


def test_the_smallest_marked_effect_sits_at_the_first_holm_step():
    e = inf.Estimate(0.0, 0.05, 6.0, 7, inf.Method.MEAN, False)
    d = inf.smallest_marked(e, 40)
    at = inf.Estimate(d, 0.05, 6.0, 7, inf.Method.MEAN, False)
    assert at.p_differs() == pytest.approx(0.05 / 40)
    assert inf.smallest_marked(e, 80) > d and inf.smallest_marked(inf.Estimate(0, 0.05, math.nan, 1,
                                                                                inf.Method.MEAN, False), 4) is None


def test_between_tasks_is_a_t_interval_over_the_task_estimates():
    xs = [-0.3, -0.1, -0.5, 0.0, -0.2]
    b = inf.between(xs)
    ci = sps.ttest_1samp(xs, 0.0).confidence_interval(0.95)
    assert b.interval() == pytest.approx((ci.low, ci.high)) and inf.between([0.1]) is None


def test_combine_and_difference():
    a = inf.Estimate(0.2, 0.1, 4, 5, inf.Method.MEAN, False)
    b = inf.Estimate(0.4, 0.1, 4, 5, inf.Method.MEAN, False)
    g = inf.combine([a, b])
    assert g.estimate == pytest.approx(0.3) and g.se == pytest.approx(math.sqrt(0.005)) and g.df == pytest.approx(8)
    d = inf.difference(b, a)
    assert d.estimate == pytest.approx(0.2) and d.se == pytest.approx(math.sqrt(0.02)) and d.df == pytest.approx(8)


def _aa_table(rng: np.random.Generator, rounds: int, spread: float = 0.0) -> list[inf.Estimate]:
    """80 cells of true speedup 1 sharing 8 baselines, as in the demo; per-unit noise log-normal around 5%."""
    base_sd = {t: 0.05 * math.exp(rng.normal(0, spread)) for t in range(8)}
    return inf.paired_estimates(_demo_like(rng, rounds, base_sd, 0.05))[0]


@pytest.mark.parametrize("rounds", [3, 10])
def test_a_table_of_true_nulls_has_no_false_mark_in_most_tables(rounds):
    """The whole table is one family."""
    rng = np.random.default_rng(11)
    tables = 100
    with_false = 0
    for _ in range(tables):
        ests = _aa_table(rng, rounds, 0.6)
        ps = [e.p_differs() for e in ests] + [e.p_equivalent(math.log(1.02)) for e in ests]
        with_false += any(inf.holm(ps)[: len(ests)])
    assert with_false <= 8  # nominal 5%
    # Judged one cell at a time, most tables would show a false mark.
    rng = np.random.default_rng(11)
    single = sum(any(e.p_differs() <= 0.05 for e in _aa_table(rng, rounds)) for _ in range(20))
    assert single >= 12


def test_a_heavy_tailed_run_of_one_scale_raises_no_noise_flag_and_one_slow_run_does():
    rng = np.random.default_rng(8)
    flagged = 0
    for _ in range(40):
        groups = [list(x) for x in rng.standard_t(3, (96, 5)) * 0.03]
        flagged += any(inf.holm(inf.noisier_p(groups)))
    assert flagged <= 4
    groups = [list(x) for x in rng.normal(0, 0.05, (96, 3))]
    groups[7][1] -= math.log(3)  # one run 3x slower
    p = inf.noisier_p(groups)
    assert inf.holm(p)[7] and sum(inf.holm(p)) == 1
    assert inf.noisier_p([[0.1, 0.2]] * 10) == [1.0] * 10  # two runs: nothing to test
