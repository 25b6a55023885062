"""harness.analysis.stats on synthetic series with known answers, and on the committed demo run."""

from __future__ import annotations

import gzip
import json
import math
import random

import numpy as np
import pytest
from scipy.stats import t as t_dist

from harness import ROOT
from harness.analysis import stats

#: The first committed demo run (4 strategies x 8 tasks x 3 runs), whose baselines a climb rule once called warm.
DEMO = ROOT / "tests" / "data" / "demo-cpu-96.jsonl.gz"


def record(strategy: str, task: str, rnd: int, order: int, tok_s: float, drafts: tuple[int, int] = (0, 0),
           sha: str = "out", host: str = "local", protocol: str = "fresh-container", **extra) -> dict:
    return {"strategy": strategy, "task": task, "round": rnd, "run_index": rnd, "order": order, "host": host,
            "protocol": protocol, "status": "ok", "client": {"decode_tok_s": tok_s},
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


# -- intervals and verdicts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("lo, hi, kind", [(0.99, 1.015, "equivalent"), (1.05, 1.2, "faster"), (0.8, 0.9, "slower"),
                                          (0.9, 1.1, "not significant"), (1.005, 1.03, "faster")])
def test_verdict_rules(lo, hi, kind):
    v = stats.verdict(stats.Interval(lo, hi, 5, "t-log", ""))
    assert v.kind == kind
    assert f"[{lo:.3f}, {hi:.3f}]" in v.rule


def test_verdict_without_interval_is_too_few_runs():
    v = stats.verdict(stats.median_interval([1.2]))
    assert v.kind == "too few runs" and "2 paired rounds" in v.rule


def test_few_values_get_a_wide_t_interval_never_a_degenerate_bootstrap():
    xs = [1.10, 1.25, 1.32]
    t = stats.median_interval(xs)
    boot = stats.median_interval(xs, method="bootstrap")
    assert t.method == "t-log" and t.n == 3
    # The bootstrap of 3 values cannot reach beyond them; the honest interval does.
    assert boot.low >= min(xs) and boot.high <= max(xs)
    assert t.low < min(xs) and t.high > max(xs)


def test_two_values_give_a_very_wide_interval():
    iv = stats.median_interval([1.2, 1.3])
    assert iv.method == "t-log"
    assert iv.low < 0.8 and iv.high > 1.9  # t(0.975, 1 df) = 12.7


def test_many_values_use_the_hull_of_bootstrap_and_t():
    rng = np.random.default_rng(3)
    xs = list(1.3 * np.exp(rng.normal(0, 0.1, 12)))
    iv = stats.median_interval(xs)
    t = stats.median_interval(xs, method="t-log")
    b = stats.median_interval(xs, method="bootstrap")
    assert iv.method == "bootstrap+t"
    assert iv.low == min(t.low, b.low) and iv.high == max(t.high, b.high)
    assert iv.low < 1.3 < iv.high
    assert stats.median_interval(xs) == iv  # fixed seed: the same records give the same summary


# -- paired speedups ------------------------------------------------------------------------------------------

def test_pure_drift_cancels_in_paired_speedups_and_is_not_contamination():
    # The whole machine speeds up 12% per round: every cell of a round scaled together.
    recs = matrix(TRUTH, 6, noise=0.01, round_factor=lambda r: 1.12 ** r)
    rs = stats.analyze(recs, "baseline")
    spec_a = rs.cell("local", "spec", "a")
    assert spec_a.speedup.estimate == pytest.approx(1.5, rel=0.03)
    assert spec_a.speedup.verdict.kind == "faster"
    assert rs.cell("local", "spec", "b").speedup.verdict.kind == "equivalent"
    assert rs.cell("local", "other", "a").speedup.verdict.kind == "slower"
    for c in rs.cells:
        assert c.contamination.kind == "none", c.contamination.sentence
        assert c.contamination.evidence["trend"]["testable"]
    # Raw tok/s climbs 1.76x over the run and varies far above 10%; the warning says the rounds explain it.
    disp = [w for w in rs.cell("local", "baseline", "a").warnings if w.kind == "dispersion"]
    assert disp and "after removing the round effect" in disp[0].sentence


def test_genuine_cell_specific_climb_is_drift_with_identical_counts():
    recs = matrix(TRUTH, 6, noise=0.01, cell_factor=lambda c, r: 1.08 ** r if c == ("spec", "a") else 1.0)
    rs = stats.analyze(recs, "baseline")
    c = rs.cell("local", "spec", "a").contamination
    assert c.kind == "drift", c.sentence
    assert c.evidence["trend"]["change"] > 0.3 and c.evidence["trend"]["p"] < 0.05
    assert "rose" in c.sentence and "not a carried-over cache" in c.sentence
    assert all(x.contamination.kind == "none" for x in rs.cells if (x.strategy, x.task) != ("spec", "a"))


def test_climb_with_rising_acceptance_is_warm_cache_and_baseline_never_is():
    def drafts(cell, r):
        if cell[0] == "baseline":
            return (0, 0)
        return (100 + 10 * r, 50 + 10 * r) if cell == ("spec", "a") else (100, 80)
    climbing = {("baseline", "a"), ("spec", "a")}
    recs = matrix(TRUTH, 6, noise=0.01, drafts=drafts,
                  cell_factor=lambda c, r: 1.08 ** r if c in climbing else 1.0)
    rs = stats.analyze(recs, "baseline")
    spec = rs.cell("local", "spec", "a").contamination
    assert spec.kind == "warm-cache"
    assert "drafted/accepted 110/60, 120/70" in spec.sentence
    base = rs.cell("local", "baseline", "a").contamination
    assert base.kind == "drift"


def test_changing_output_in_fresh_containers_is_unstable():
    recs = matrix(TRUTH, 3, noise=0.01)
    for r in recs:
        if (r["strategy"], r["task"], r["round"]) == ("baseline", "b", 3):
            r["output"]["sha256"] = "different"
    c = stats.analyze(recs, "baseline").cell("local", "baseline", "b").contamination
    assert c.kind == "unstable"
    assert "output changed from run 3" in c.sentence


def test_reuse_server_is_naive_with_the_draft_counts():
    counts = {1: (165, 147), 2: (291, 168), 3: (256, 195)}
    recs = [record("ngram-mod", "a", r, r - 1, 300.0 + r, counts[r], sha="x" if r == 1 else "y",
                   protocol="reuse-server") for r in (1, 2, 3)]
    c = stats.contamination(recs, "local", "ngram-mod", "a")
    assert c.kind == "naive" and c.flagged
    assert "drafted/accepted 165/147, 291/168, 256/195; output changed from run 2" in c.sentence


def test_constant_series():
    recs = [record(s, "a", r, 2 * r + i, v) for r in (1, 2, 3) for i, (s, v) in
            enumerate((("baseline", 100.0), ("spec", 150.0)))]
    rs = stats.analyze(recs, "baseline")
    c = rs.cell("local", "spec", "a")
    assert c.speedup.estimate == 1.5
    assert c.speedup.interval.method == "exact" and c.speedup.verdict.kind == "faster"
    assert c.contamination.kind == "none"
    assert [w.kind for w in c.warnings] == ["few-runs"]


def test_two_rounds():
    recs = matrix(TRUTH, 2, noise=0.03)
    rs = stats.analyze(recs, "baseline")
    c = rs.cell("local", "spec", "a")
    assert c.speedup.interval.n == 2 and c.speedup.interval.method == "t-log"
    assert c.speedup.interval.low < 1.5 < c.speedup.interval.high
    assert not c.contamination.evidence["trend"]["testable"]
    assert "too few to test a trend" in c.contamination.sentence
    assert any(w.kind == "few-runs" for w in c.warnings)


def test_one_outlier_and_a_first_run_effect():
    def bump(cell, r):
        if cell == ("spec", "a") and r == 5:
            return 0.6
        if cell == ("other", "b") and r == 1:
            return 1.5
        return 1.0
    rs = stats.analyze(matrix(TRUTH, 8, noise=0.01, cell_factor=bump), "baseline")
    out = [w for c in rs.cells for w in c.warnings if w.kind in ("outlier", "first-run")]
    assert [(w.kind, w.strategy, w.task, w.evidence["run"]) for w in out] == \
        [("outlier", "spec", "a", 5), ("first-run", "other", "b", 1)]
    assert out[0].evidence["deviation"] == pytest.approx(-0.4, abs=0.04) and "slower" in out[0].sentence
    assert out[1].evidence["deviation"] == pytest.approx(0.5, abs=0.05) and "caches? start-up?" in out[1].sentence


def test_no_outliers_in_plain_noise():
    rs = stats.analyze(matrix(TRUTH, 8, noise=0.05, seed=4), "baseline")
    assert not [w for c in rs.cells for w in c.warnings if w.kind in ("outlier", "first-run")]


def test_disturbed_runs_are_left_out_and_named():
    recs = matrix(TRUTH, 4, noise=0.01)
    for r in recs:
        if (r["strategy"], r["task"], r["round"]) == ("spec", "a", 2):
            r["client"]["decode_tok_s"] /= 3
            r["interference"] = {"disturbed": True, "others_cores": 1.1}
    rs = stats.analyze(recs, "baseline")
    c = rs.cell("local", "spec", "a")
    assert sorted(c.speedup.rounds) == [1, 3, 4]
    assert c.speedup.estimate == pytest.approx(1.5, rel=0.03)
    assert [w.evidence["runs"] for w in c.warnings if w.kind == "disturbed"] == [[2]]
    assert "left out" in next(w.sentence for w in c.warnings if w.kind == "disturbed")


def test_a_host_busy_throughout_keeps_its_runs_and_says_so():
    recs = matrix(TRUTH, 4, noise=0.01)
    for r in recs[: len(recs) * 3 // 4]:
        r["interference"] = {"disturbed": True, "others_cores": 1.9}
    assert stats.busy_hosts(recs) == {"local": (18, 24)}
    rs = stats.analyze(recs, "baseline")
    c = rs.cell("local", "spec", "a")
    assert c.speedup.interval.n == 4  # nothing left out: leaving out 75% would leave a busy machine unmeasured
    w = next(w for w in c.warnings if w.kind == "disturbed")
    assert w.evidence["kept"] and "describe a busy machine" in w.sentence


def test_geomean_over_tasks():
    small = stats.analyze(matrix(TRUTH, 3, noise=0.02), "baseline")
    g = next(g for g in small.geomeans if g.strategy == "spec")
    assert g.estimate == pytest.approx(math.sqrt(1.5), rel=0.03)
    assert g.interval.method == "t-log" and g.interval.low < g.estimate < g.interval.high
    big = stats.analyze(matrix(TRUTH, 12, noise=0.02), "baseline")
    g = next(g for g in big.geomeans if g.strategy == "spec")
    assert g.interval.method == "bootstrap+t" and g.verdict.kind == "faster"
    assert g.interval.low < math.sqrt(1.5) < g.interval.high


def test_summary_is_plain_json():
    rs = stats.analyze(matrix(TRUTH, 4, noise=0.05), "baseline")
    text = json.dumps(rs.as_dict(), allow_nan=False)
    assert '"verdict"' in text and '"contamination"' in text


# -- adaptive runs ------------------------------------------------------------------------------------------

def test_convergence_names_cells_and_their_baselines():
    quiet_a = matrix(TRUTH, 6, noise=0.005, cell_factor=None, seed=1)
    for r in quiet_a:  # one noisy cell
        if (r["strategy"], r["task"]) == ("other", "b"):
            r["client"]["decode_tok_s"] *= math.exp(np.random.default_rng(r["order"]).normal(0, 0.3))
    conv = stats.convergence(quiet_a, "baseline", target=0.05)
    assert conv.pending == [("local", "other", "b")]
    assert conv.to_run == [("local", "other", "b"), ("local", "baseline", "b")]
    noisy = next(c for c in conv.cells if (c.strategy, c.task) == ("other", "b"))
    assert noisy.half_width > 0.05 and noisy.rounds_estimate > 6
    assert not conv.done
    assert stats.convergence(matrix(TRUTH, 6, noise=0.005), "baseline").done
    # Three quiet rounds are narrow enough but too few to stop on.
    early = stats.convergence(matrix(TRUTH, 3, noise=0.001), "baseline")
    assert not early.done and all(c.half_width < 0.05 and c.rounds_estimate == 5 for c in early.cells)
    assert stats.convergence(matrix(TRUTH, 3, noise=0.001), "baseline", min_rounds=3).done


def test_rounds_needed():
    assert stats.rounds_needed([1.5]) is None
    assert stats.rounds_needed([1.5, 1.5, 1.5]) == 3
    # The smallest m whose t-interval with the spread seen so far is within 5%.
    xs = list(np.exp(np.array([-0.1, 0.1, -0.1, 0.1, 0.0]) + 0.3))
    sd = np.std(np.log(xs), ddof=1)
    m = stats.rounds_needed(xs)
    assert 5 < m < 1000
    assert t_dist.ppf(0.975, m - 1) * sd / math.sqrt(m) <= math.log(1.05) < \
        t_dist.ppf(0.975, m - 2) * sd / math.sqrt(m - 1)


# -- reproduction -------------------------------------------------------------------------------------------

def test_reproduction_judges_speedups_not_absolute_rates():
    a = stats.analyze(matrix(TRUTH, 8, noise=0.01, seed=1), "baseline")
    slower_machine = {k: v * 0.6 for k, v in TRUTH.items()}
    b = stats.analyze(matrix(slower_machine, 8, noise=0.01, seed=2), "baseline")
    rep = stats.reproduction(a, b)
    assert rep.counts == {"n/a": 2, "reproduces": 4}
    assert rep.fingerprints == {"identical": 6}
    assert all(c.tok_s_ratio == pytest.approx(0.6, rel=0.05) for c in rep.cells)
    assert rep.sentence.startswith("reproduces: speedups 4 reproduce")
    assert "hardware- and state-dependent" in rep.sentence


def test_reproduction_differs_and_inconclusive():
    a = stats.analyze(matrix(TRUTH, 8, noise=0.01, seed=1), "baseline")
    changed = dict(TRUTH)
    changed[("spec", "a")] = 200.0
    b = stats.analyze(matrix(changed, 8, noise=0.01, seed=2,
                             drafts=lambda c, r: (0, 0) if c[0] == "baseline" else (100, 90)), "baseline")
    rep = stats.reproduction(a, b)
    row = next(c for c in rep.cells if (c.strategy, c.task) == ("spec", "a"))
    assert row.verdict == "differs" and "do not overlap" in row.rule
    assert row.fingerprint == "differ" and "100/80" in row.fingerprint_detail
    assert rep.sentence.startswith("differs")
    noisy = stats.analyze(matrix(TRUTH, 3, noise=0.2, seed=3), "baseline")
    rep = stats.reproduction(a, noisy)
    assert rep.counts.get("inconclusive", 0) >= 3


# -- the committed demo run ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo() -> tuple[list[dict], stats.RunStats]:
    recs = [json.loads(line) for line in gzip.decompress(DEMO.read_bytes()).decode().splitlines()]
    return recs, stats.analyze(recs, "baseline")


def test_demo_false_baseline_flags_are_gone(demo):
    recs, rs = demo
    assert len(recs) == 96 and len(rs.cells) == 32
    for task in ("en-prose", "long-ctx"):  # flagged "warm-cache contamination suspected" by the 1.2x climb rule
        c = rs.cell("local", "baseline", task).contamination
        assert c.kind == "none", c.sentence
        assert "too few to test a trend" in c.sentence
    assert not [c for c in rs.cells if c.contamination.kind in ("warm-cache", "drift", "naive")]
    # Draft counts and outputs were identical run to run in every cell.
    assert all(c.fingerprint.identical for c in rs.cells)


def test_demo_verdicts(demo):
    _, rs = demo
    verdicts = {(c.strategy, c.task): c.speedup for c in rs.cells if c.speedup}
    assert len(verdicts) == 24
    for sp in verdicts.values():
        assert sp.interval.method == "t-log" and sp.interval.n == 3
        assert sp.interval.low < sp.estimate < sp.interval.high
    # Only the large, consistent speedups survive three noisy rounds.
    faster = sorted(k for k, sp in verdicts.items() if sp.verdict.kind == "faster")
    assert faster == [("draft-simple", "json-out"), ("ngram-mod", "code-edit"), ("ngram-mod", "json-out")]
    # The median of the paired ratios (2.23, 2.67, 2.44), not a ratio of medians.
    assert verdicts[("ngram-mod", "json-out")].estimate == pytest.approx(542.413 / 222.368, rel=1e-6)  # round 3 of 3
    assert {sp.verdict.kind for k, sp in verdicts.items() if k not in faster} == {"not significant"}
    geo = {g.strategy: g for g in rs.geomeans}
    assert all(g.interval.low < g.estimate < g.interval.high for g in geo.values())
    assert every_cell_says_few_runs(rs)


def every_cell_says_few_runs(rs: stats.RunStats) -> bool:
    return all(any(w.kind == "few-runs" for w in c.warnings) for c in rs.cells)
