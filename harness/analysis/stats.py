"""Statistics behind every verdict: paired speedups over rounds with honest 95% intervals, verdicts with a
practical-equivalence band, contamination judged from deterministic evidence and round-normalised trends,
stability warnings, convergence for adaptive runs, and reproduction judged on what transfers between machines.

Pure functions on measurement records (the dicts of measurements.jsonl) and plain lists; nothing here reads
files or talks to an engine. Each round runs every cell once in shuffled order, so a round is a block: a
strategy's tok/s is divided by the baseline's tok/s of the same task in the same round on the same host, and
whatever the machine did to the whole round cancels.

Intervals (see `median_interval`): a percentile bootstrap of a median is degenerate with few values (with 3 it
can only return order statistics and covers the truth about 75% of the time), so below MIN_BOOTSTRAP_ROUNDS the
interval is a Student-t interval on the log values: wide with few rounds (x4.3 the standard error at 3), never
falsely narrow; from MIN_BOOTSTRAP_ROUNDS on, the hull of the bootstrap and that t-interval.
`python3 bench/interval_coverage.py` measures each method's coverage.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
#: Fewest values for a bootstrap interval of a median; below it, a t-interval on logs (bench/interval_coverage.py).
MIN_BOOTSTRAP_ROUNDS = 10
N_RESAMPLES = 9999
#: Fixed seed: the same records always give the same summary.
BOOTSTRAP_SEED = 20240607
#: Speedups within this fraction of 1 (in log terms) are practically equal.
EQUIVALENCE_BAND = 0.02
#: Two runs' speedups whose ratio interval lies within this band reproduce each other.
REPRODUCE_BAND = 0.05
#: Relative half-width of a speedup interval that `invoke run --until` aims for by default.
CONVERGENCE_TARGET = 0.05
#: Fewest rounds before a cell may stop: the spread of fewer is too uncertain to stop on (two values that happen to
#: agree would end a cell early), and a trend can be tested from 5 (`min_trend_runs`).
MIN_CONVERGED_ROUNDS = 5
#: Kendall's tau p-value below which a trend in execution order is real.
TREND_P = 0.05
#: A trend must move the cell's normalised throughput by at least this much over its runs...
TREND_MIN_CHANGE = 0.05
#: ...and by more than this many times the cell's own noise (robust sd of the residuals around the trend).
TREND_NOISE_FACTOR = 2.0
#: Normalised coefficient of variation above which a cell's throughput is called unstable.
UNSTABLE_CV = 0.25
#: Coefficient of variation of a cell's tok/s above which it is called dispersed (pyperf warns at 10%).
DISPERSION_CV = 0.10
#: Modified z-score above which one run is an outlier (Iglewicz and Hoaglin).
OUTLIER_Z = 3.5
#: Smallest first-run deviation worth a warning, however quiet the other runs.
FIRST_RUN_MIN = 0.05
#: Accepted/drafted rising by this much (absolute) after the first run is the signature of a carried cache.
ACCEPT_CLIMB = 0.10
#: Others (and steal) using more than this many cores on average during the window disturb the measurement:
#: a quarter of a core is well above what an idle host's daemons use, and llama-server keeps every thread busy.
DISTURBED_CORES = 0.25
#: Above this share of disturbed measurements on a host, they are kept (and said so) rather than left out.
MAX_DISTURBED_SHARE = 0.5


# -- records ------------------------------------------------------------------------------------------------

def tok_s(record: dict[str, Any]) -> float | None:
    """The client-side decode rate of one record, None when it has none."""
    return (record.get("client") or {}).get("decode_tok_s")


def _disturbed(r: dict[str, Any]) -> bool:
    return bool((r.get("interference") or {}).get("disturbed"))


def busy_hosts(records: Iterable[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Hosts where more than MAX_DISTURBED_SHARE of the ok records were disturbed: (disturbed, ok) per host.
    There the disturbed records are kept (leaving them out would leave nothing): the figures describe a busy
    machine and say so."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        if r.get("status", "ok") == "ok":
            c = counts[r.get("host", "local")]
            c[0] += _disturbed(r)
            c[1] += 1
    return {h: (d, n) for h, (d, n) in counts.items() if n and d / n > MAX_DISTURBED_SHARE}


def usable(records: Iterable[dict[str, Any]], exclude_disturbed: bool = True) -> list[dict[str, Any]]:
    """Records that count, sorted by execution order: status ok, a positive decode rate, and (by default) not
    disturbed by other work (harness/run/interference.py marks a record's `interference.disturbed`), except on a
    host disturbed for most of the run (`busy_hosts`). Pass the whole run's records: the rule is per host."""
    records = list(records)
    keep_busy = busy_hosts(records) if exclude_disturbed else {}
    out = []
    for r in records:
        v = tok_s(r)
        if r.get("status", "ok") != "ok" or v is None or v <= 0:
            continue
        if exclude_disturbed and _disturbed(r) and r.get("host", "local") not in keep_busy:
            continue
        out.append(r)
    return sorted(out, key=lambda r: r.get("order", 0))


def group_cells(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Records by cell, (host, strategy, task), in the order given."""
    by: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by[(r.get("host", "local"), r["strategy"], r["task"])].append(r)
    return by


def per_round(records: list[dict[str, Any]]) -> dict[int, float]:
    """A cell's tok/s per round (the median when a round holds several records of the cell)."""
    by: dict[int, list[float]] = defaultdict(list)
    for r in records:
        by[int(r.get("round", r.get("run_index", 0)))].append(float(tok_s(r)))
    return {k: statistics.median(v) for k, v in sorted(by.items())}


# -- intervals ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Interval:
    """A confidence interval for a positive figure (a speedup, a rate), with how it was made, in words."""

    low: float | None
    high: float | None
    n: int
    method: str  # "t-log" | "bootstrap+t" | "bootstrap" | "exact" | "none"
    note: str
    confidence: float = CONFIDENCE

    @property
    def available(self) -> bool:
        return self.low is not None and self.high is not None

    def half_width(self, estimate: float | None) -> float | None:
        """The larger distance from the estimate to either end, as a fraction of the estimate."""
        if not self.available or not estimate:
            return None
        return max(self.high / estimate - 1, 1 - self.low / estimate)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rng() -> np.random.Generator:
    return np.random.default_rng(BOOTSTRAP_SEED)


def _t_log(logs: np.ndarray, confidence: float) -> tuple[float, float]:
    ci = sps.ttest_1samp(logs, 0.0).confidence_interval(confidence)
    return math.exp(ci.low), math.exp(ci.high)


def _hull(boot: tuple[float, float], t: tuple[float, float]) -> tuple[float, float]:
    return min(boot[0], t[0]), max(boot[1], t[1])


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE, method: str = "auto",
                    n_resamples: int = N_RESAMPLES) -> Interval:
    """A confidence interval for the median of positive values (per-round speedups, tok/s).

    - 1 value: no interval.
    - 2 to MIN_BOOTSTRAP_ROUNDS-1 values: a Student-t interval on the logs (scipy.stats.ttest_1samp). A percentile
      bootstrap of a median is degenerate there (measured coverage 74% with 3 values, 89% with 4); the t-interval
      covers ~95% and is honestly wide (x12.7 the standard error with 2 values, x4.3 with 3).
    - MIN_BOOTSTRAP_ROUNDS or more: the hull of the percentile bootstrap of the median (scipy.stats.bootstrap;
      BCa is undefined for medians with ties) and the t-interval: the bootstrap alone covers 92-95% there.
    Values that do not vary give a zero-width interval, said so in the note. `method` forces "t-log" or
    "bootstrap" (bench/interval_coverage.py compares them)."""
    xs = np.asarray([float(v) for v in values if v is not None and v > 0], dtype=float)
    n = len(xs)
    if n < 2:
        return Interval(None, None, n, "none", f"{n} value{'s' if n != 1 else ''}: no interval", confidence)
    if np.all(xs == xs[0]):
        return Interval(float(xs[0]), float(xs[0]), n, "exact", f"all {n} values identical", confidence)
    if method == "auto":
        method = "bootstrap+t" if n >= MIN_BOOTSTRAP_ROUNDS else "t-log"
    t = _t_log(np.log(xs), confidence)
    if method == "t-log":
        return Interval(t[0], t[1], n, "t-log", f"{n} values, too few for a bootstrap: Student-t interval on the "
                        "logs (assumes roughly symmetric log noise)", confidence)
    res = sps.bootstrap((xs,), np.median, confidence_level=confidence, n_resamples=n_resamples,
                        method="percentile", vectorized=True, random_state=_rng())
    boot = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if method == "bootstrap":
        return Interval(*boot, n, "bootstrap", f"percentile bootstrap of the median over {n} values", confidence)
    return Interval(*_hull(boot, t), n, "bootstrap+t", f"hull of the percentile bootstrap of the median and the "
                    f"Student-t interval on the logs over {n} values", confidence)


# -- paired speedups ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellVerdict:
    """faster / slower / equivalent / not significant / too few runs, and the rule that decided it, in words."""

    kind: str
    rule: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verdict(interval: Interval, band: float = EQUIVALENCE_BAND) -> CellVerdict:
    """Judge a speedup from its interval: equivalent when the whole interval lies inside the band around 1
    (checked first: a difference smaller than the band does not matter even when it is certain), faster when it
    lies above 1, slower when below, else not significant."""
    if not interval.available:
        return CellVerdict("too few runs", f"{interval.note}; a verdict needs at least 2 paired rounds")
    lo, hi = interval.low, interval.high
    lo_band, hi_band = 1 / (1 + band), 1 + band
    pct = f"{interval.confidence:.0%}"
    span = f"[{lo:.3f}, {hi:.3f}]"
    if lo >= lo_band and hi <= hi_band:
        return CellVerdict("equivalent", f"the {pct} interval {span} lies inside the ±{band:.0%} equivalence band")
    if lo > 1:
        return CellVerdict("faster", f"the {pct} interval {span} lies above 1")
    if hi < 1:
        return CellVerdict("slower", f"the {pct} interval {span} lies below 1")
    return CellVerdict("not significant", f"the {pct} interval {span} contains 1 and reaches outside the "
                       f"±{band:.0%} equivalence band")


@dataclass(frozen=True)
class Speedup:
    """A strategy's speedup over the baseline on one task (or the geometric mean over tasks: task None)."""

    host: str
    strategy: str
    task: str | None
    estimate: float | None
    interval: Interval
    verdict: CellVerdict
    rounds: dict[int, float] = field(default_factory=dict)  # round -> paired ratio (per task; empty for geomean)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rounds"] = {str(k): round(v, 6) for k, v in self.rounds.items()}
        return d


def _by_round_prompt(records: list[dict[str, Any]]) -> dict[tuple[int, str], float]:
    by: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in records:
        by[(int(r.get("round", r.get("run_index", 0))), r.get("prompt", r["task"]))].append(float(tok_s(r)))
    return {k: statistics.median(v) for k, v in by.items()}


def paired_ratios(records: list[dict[str, Any]], host: str, strategy: str, task: str,
                  baseline: str) -> dict[int, float]:
    """Per round: the strategy's tok/s over the baseline's on the same task (and prompt), same host, same round.
    A task with several prompts pairs each prompt with itself; the round's ratio is the geometric mean over
    its prompts."""
    cells = group_cells(usable(records))
    s = _by_round_prompt(cells.get((host, strategy, task), []))
    b = _by_round_prompt(cells.get((host, baseline, task), []))
    per: dict[int, list[float]] = defaultdict(list)
    for key in sorted(s.keys() & b.keys()):
        per[key[0]].append(math.log(s[key] / b[key]))
    return {rd: math.exp(statistics.fmean(logs)) for rd, logs in sorted(per.items())}


def speedup(records: list[dict[str, Any]], host: str, strategy: str, task: str, baseline: str,
            band: float = EQUIVALENCE_BAND) -> Speedup:
    """The median over rounds of the paired speedup, its interval (`median_interval`) and its verdict."""
    ratios = paired_ratios(records, host, strategy, task, baseline)
    est = statistics.median(ratios.values()) if ratios else None
    iv = median_interval(list(ratios.values()))
    return Speedup(host, strategy, task, est, iv, verdict(iv, band), ratios)


def geomean_speedup(records: list[dict[str, Any]], host: str, strategy: str, tasks: Sequence[str], baseline: str,
                    band: float = EQUIVALENCE_BAND) -> Speedup:
    """The geometric mean over tasks of the per-task median speedups, with an interval that resamples whole
    rounds (every task's ratio of a round travels together, so a round's shared disturbance stays shared).

    Fewer than MIN_BOOTSTRAP_ROUNDS rounds: a Student-t interval over rounds of each round's log geometric mean
    across tasks. More: the hull of that and a paired percentile bootstrap over rounds (as `median_interval`)."""
    per_task = {t: paired_ratios(records, host, strategy, t, baseline) for t in tasks}
    per_task = {t: r for t, r in per_task.items() if r}
    if not per_task:
        iv = Interval(None, None, 0, "none", "no paired rounds")
        return Speedup(host, strategy, None, None, iv, verdict(iv, band))
    est = math.exp(statistics.fmean(math.log(statistics.median(r.values())) for r in per_task.values()))
    rounds = sorted(set().union(*(r.keys() for r in per_task.values())))
    matrix = np.array([[per_task[t].get(r, np.nan) for r in rounds] for t in per_task], dtype=float)
    n = len(rounds)
    if n < 2:
        iv = Interval(None, None, n, "none", "1 round: no interval")
    elif np.all(np.nanmax(matrix, axis=1) == np.nanmin(matrix, axis=1)):
        iv = Interval(est, est, n, "exact", f"every task's ratio identical in all {n} rounds")
    elif n >= MIN_BOOTSTRAP_ROUNDS:
        def stat(*rows: np.ndarray, axis: int = -1) -> np.ndarray:
            meds = np.stack([np.nanmedian(row, axis=axis) for row in rows])
            return np.exp(np.nanmean(np.log(meds), axis=0))
        res = sps.bootstrap(tuple(matrix), stat, paired=True, vectorized=True, method="percentile",
                            confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, random_state=_rng())
        boot = float(res.confidence_interval.low), float(res.confidence_interval.high)
        lo, hi = _hull(boot, _t_log(np.nanmean(np.log(matrix), axis=0), CONFIDENCE))
        iv = Interval(lo, hi, n, "bootstrap+t", f"hull of a percentile bootstrap over {n} rounds resampled as "
                      "blocks and a Student-t interval over rounds of each round's log geometric mean")
    else:
        lo, hi = _t_log(np.nanmean(np.log(matrix), axis=0), CONFIDENCE)
        iv = Interval(lo, hi, n, "t-log", f"{n} rounds, too few for a bootstrap: Student-t interval over rounds "
                      "of each round's log geometric mean")
    return Speedup(host, strategy, None, est, iv, verdict(iv, band))


# -- round effect, trend, contamination ---------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One run of a cell: when it ran, its tok/s, the round's common factor, and the normalised tok/s."""

    order: int
    round: int
    tok_s: float
    factor: float
    normalised: float


Key = tuple[str, str, str]  # (host, strategy, task)


def normalise(records: list[dict[str, Any]]) -> dict[Key, list[Point]]:
    """Every cell's tok/s in execution order with the round effect removed.

    A cell's factor for a round is the median, over the OTHER cells of that round on the host, of each cell's
    tok/s in that round divided by its own median over rounds (leave-one-out, so a cell's own climb is not
    absorbed into the factor); the normalised tok/s is tok/s / factor. A round with no other cells has factor 1.
    Disturbed records are left out (see `usable`)."""
    cells = group_cells(usable(records))
    rel: dict[tuple[str, int], dict[Key, float]] = defaultdict(dict)
    for key, recs in cells.items():
        rounds = per_round(recs)
        med = statistics.median(rounds.values())
        for rd, v in rounds.items():
            rel[(key[0], rd)][key] = v / med
    out: dict[Key, list[Point]] = {}
    for key, recs in cells.items():
        pts = []
        for r in recs:
            rd = int(r.get("round", r.get("run_index", 0)))
            others = [v for k, v in rel[(key[0], rd)].items() if k != key]
            f = statistics.median(others) if others else 1.0
            pts.append(Point(int(r.get("order", 0)), rd, float(tok_s(r)), f, float(tok_s(r)) / f))
        out[key] = pts
    return out


def _loo_residuals(points: Sequence[Point]) -> list[float]:
    # Each run's log distance from the median of the cell's OTHER runs: an outlier cannot hide in its own median.
    logs = [math.log(p.normalised) for p in points]
    return [lg - statistics.median(logs[:i] + logs[i + 1:]) for i, lg in enumerate(logs)]


def pooled_noise(series: dict[Key, list[Point]], host: str | None = None) -> float | None:
    """The run's noise level: robust sd (1.4826 x MAD) of every run's leave-one-out log residual, pooled over the
    cells with 3 runs or more (on one host when given). Three runs cannot estimate a cell's own scale; a run of
    many cells can. None when no cell has 3 runs."""
    res = [x for (h, _, _), pts in series.items() if (host is None or h == host) and len(pts) >= 3
           for x in _loo_residuals(pts)]
    if not res:
        return None
    return float(sps.median_abs_deviation(res, scale="normal"))


@dataclass(frozen=True)
class Trend:
    """Kendall's tau of the normalised series against execution order, the Theil-Sen change over the cell's
    span as a fraction of its median, the cell's own noise, and whether that is a trend by the rule."""

    n: int
    tau: float | None
    p: float | None
    change: float | None
    noise: float | None
    significant: bool
    testable: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def min_trend_runs(p: float = TREND_P) -> int:
    """Fewest runs for which a perfect monotone series reaches p (exact two-sided Kendall test: p = 2/n!)."""
    n = 2
    while 2 / math.factorial(n) >= p:
        n += 1
    return n


def trend(points: Sequence[Point]) -> Trend:
    """Is there a trend in execution order beyond the cell's own noise? Kendall's tau p < TREND_P and a Theil-Sen
    change over the span larger than both TREND_MIN_CHANGE and TREND_NOISE_FACTOR x the robust sd of the
    residuals around the Theil-Sen line (both as fractions of the median)."""
    n = len(points)
    if n < min_trend_runs():
        return Trend(n, None, None, None, None, False, False)
    x = np.array([p.order for p in points], dtype=float)
    y = np.array([p.normalised for p in points], dtype=float)
    med = float(np.median(y))
    if np.all(y == y[0]):
        return Trend(n, 0.0, 1.0, 0.0, 0.0, False, True)
    tau, p = sps.kendalltau(x, y)
    ts = sps.theilslopes(y, x)
    change = float(ts.slope * (x[-1] - x[0]) / med)
    resid = y - (ts.intercept + ts.slope * x)
    noise = float(sps.median_abs_deviation(resid, scale="normal") / med)
    sig = bool(p < TREND_P and abs(change) > max(TREND_MIN_CHANGE, TREND_NOISE_FACTOR * noise))
    return Trend(n, round(float(tau), 4), round(float(p), 6), round(change, 4), round(noise, 4), sig, True)


@dataclass(frozen=True)
class Fingerprint:
    """What must not change between identical requests at temperature 0 in fresh servers: per run in execution
    order, (drafted, accepted) and the output's sha256."""

    drafts: list[tuple[int, int]]
    outputs: list[str]

    @property
    def drafting(self) -> bool:
        return any(d for d, _ in self.drafts)

    @property
    def drafts_identical(self) -> bool:
        return len(set(self.drafts)) <= 1

    @property
    def outputs_identical(self) -> bool:
        return len(set(self.outputs)) <= 1

    @property
    def identical(self) -> bool:
        return self.drafts_identical and self.outputs_identical

    def output_changed_at(self) -> int | None:
        """1-based run number where the output first differs from run 1's."""
        return next((i + 1 for i, h in enumerate(self.outputs) if h != self.outputs[0]), None)

    def draft_words(self) -> str:
        if not self.drafting:
            return "nothing drafted"
        if self.drafts_identical:
            d, a = self.drafts[0]
            return f"drafted/accepted {d}/{a} in every run"
        return "drafted/accepted " + ", ".join(f"{d}/{a}" for d, a in self.drafts)

    def output_words(self) -> str:
        at = self.output_changed_at()
        return f"output changed from run {at}" if at else "output identical in every run"

    def as_dict(self) -> dict[str, Any]:
        return {"drafts": [list(d) for d in self.drafts], "outputs": list(self.outputs),
                "identical": self.identical, "output_changed_at": self.output_changed_at()}


def fingerprint(cell_records: list[dict[str, Any]]) -> Fingerprint:
    """The deterministic fingerprint of one cell's ok records, in execution order."""
    recs = sorted((r for r in cell_records if r.get("status", "ok") == "ok"), key=lambda r: r.get("order", 0))
    drafts = [(int((r.get("server") or {}).get("draft_n") or 0), int((r.get("server") or {}).get("draft_n_accepted")
                                                                      or 0)) for r in recs]
    return Fingerprint(drafts, [(r.get("output") or {}).get("sha256", "") for r in recs])


@dataclass(frozen=True)
class Contamination:
    """none / drift / unstable / warm-cache / naive, with the evidence and one sentence."""

    kind: str
    evidence: dict[str, Any]
    sentence: str

    @property
    def flagged(self) -> bool:
        return self.kind != "none"

    def as_dict(self) -> dict[str, Any]:
        return {"check": "contamination", "kind": self.kind, "flagged": self.flagged, "sentence": self.sentence,
                "evidence": self.evidence}


def _acceptance(drafts: list[tuple[int, int]]) -> list[float | None]:
    return [a / d if d else None for d, a in drafts]


def _acceptance_climbed(drafts: list[tuple[int, int]]) -> bool:
    # A cache carried from earlier runs helps every later run: acceptance never below run 1's, and clearly above.
    acc = _acceptance(drafts)
    if len(acc) < 2 or acc[0] is None:
        return False
    later = [a for a in acc[1:] if a is not None]
    return bool(later) and min(later) >= acc[0] and max(later) - acc[0] >= ACCEPT_CLIMB


def contamination(records: list[dict[str, Any]], host: str, strategy: str, task: str,
                  protocol: str | None = None, series: dict[Key, list[Point]] | None = None) -> Contamination:
    """Judge one cell from evidence. The whole run's records are needed for the round effect.

    - naive: the reuse-server protocol, always flagged, with the draft counts as evidence.
    - warm-cache (fresh containers only): draft counts changed and acceptance rose after run 1.
    - unstable: draft counts or outputs changed without that signature (nondeterminism), or the normalised
      throughput varies with a coefficient of variation above UNSTABLE_CV.
    - drift: a trend in the normalised throughput by `trend`, with the deterministic fingerprint unchanged.
    A cell with nothing drafted (a baseline) has no draft counts to climb, so it is never warm-cache.
    `series` is `normalise(records)`, computed once by the caller for speed."""
    all_usable = usable(records, exclude_disturbed=False)
    cell = [r for r in all_usable if (r.get("host", "local"), r["strategy"], r["task"]) == (host, strategy, task)]
    protocol = protocol or (cell[0].get("protocol") if cell else None) or "fresh-container"
    fp = fingerprint(cell)
    points = (normalise(records) if series is None else series).get((host, strategy, task), [])
    tr = trend(points)
    norm = [p.normalised for p in points]
    cv = float(sps.variation(norm, ddof=1)) if len(norm) >= 2 else None
    evidence: dict[str, Any] = {
        "protocol": protocol, "fingerprint": fp.as_dict(),
        "acceptance": [None if a is None else round(a, 4) for a in _acceptance(fp.drafts)],
        "series": [round(p.tok_s, 3) for p in points], "normalised": [round(p.normalised, 3) for p in points],
        "round_factors": [round(p.factor, 4) for p in points], "order": [p.order for p in points],
        "normalised_cv": None if cv is None else round(cv, 4), "trend": tr.as_dict()}
    words = f"{fp.draft_words()}; {fp.output_words()}"
    if protocol == "reuse-server":
        return Contamination("naive", evidence, f"naive protocol: one server for every run, caches carried over "
                             f"({words})")
    if fp.drafting and not fp.drafts_identical and _acceptance_climbed(fp.drafts):
        return Contamination("warm-cache", evidence, f"carried state in fresh containers: acceptance rose after "
                             f"the first run ({words})")
    if not fp.identical:
        return Contamination("unstable", evidence, f"nondeterministic at temperature 0 in fresh containers "
                             f"({words})")
    if tr.significant:
        way = "rose" if tr.change > 0 else "fell"
        return Contamination("drift", evidence, f"throughput {way} {abs(tr.change):.0%} over {tr.n} runs after "
                             f"removing the round effect (Kendall tau {tr.tau:+.2f}, p={tr.p:.3f}; noise "
                             f"{tr.noise:.0%}) with identical draft counts and outputs: this cell drifted, not a "
                             "carried-over cache")
    if cv is not None and cv > UNSTABLE_CV:
        return Contamination("unstable", evidence, f"throughput varies {cv:.0%} (coefficient of variation) across "
                             f"{len(norm)} runs after removing the round effect, with identical draft counts and "
                             "outputs: the figure is noise-dominated")
    how = (f"no trend after removing the round effect (Kendall p={tr.p:.2f})" if tr.testable else
           f"{tr.n} runs: too few to test a trend (needs {min_trend_runs()})")
    return Contamination("none", evidence, f"no evidence of carried state ({words}); {how}")


# -- stability warnings -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StabilityWarning:
    """A warning about one cell's figures, hyperfine-style: kind, the numbers behind it, and a sentence."""

    kind: str  # dispersion | outlier | few-runs | first-run | disturbed
    host: str
    strategy: str
    task: str
    evidence: dict[str, Any]
    sentence: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def stability(records: list[dict[str, Any]], host: str, strategy: str, task: str,
              series: dict[Key, list[Point]] | None = None) -> list[StabilityWarning]:
    """Warnings about one cell (`series`: `normalise(records)`, computed once by the caller for speed):

    - disturbed: runs other work disturbed (harness/run/interference.py), left out of every figure.
    - few-runs: 1 run (no interval) or fewer than MIN_BOOTSTRAP_ROUNDS (a parametric, wide interval).
    - dispersion: the coefficient of variation of tok/s above DISPERSION_CV (pyperf's 10%), with how much of it
      the round effect explains.
    - outlier: a run whose modified z-score, its leave-one-out log residual over the run's pooled robust sd
      (`pooled_noise`; 3 runs cannot estimate a cell's own scale), exceeds OUTLIER_Z, and which is more than
      FIRST_RUN_MIN away; 3 runs or more. Run 1 in execution order is reported as first-run instead."""
    def warn(kind: str, evidence: dict[str, Any], sentence: str) -> StabilityWarning:
        return StabilityWarning(kind, host, strategy, task, evidence, sentence)

    series = normalise(records) if series is None else series
    out: list[StabilityWarning] = []
    key = (host, strategy, task)
    cell_all = [r for r in records if (r.get("host", "local"), r["strategy"], r["task"]) == key]
    disturbed = [r for r in usable(cell_all, exclude_disturbed=False) if _disturbed(r)]
    if disturbed:
        busy = busy_hosts(records).get(host)
        evidence = {"runs": [r.get("run_index") for r in disturbed], "kept": busy is not None,
                    "others_cores": [(r["interference"] or {}).get("others_cores") for r in disturbed]}
        what = (f"kept: {busy[0]} of {busy[1]} measurements on this host were disturbed, so these figures describe "
                "a busy machine" if busy else "left out of the figures")
        out.append(warn("disturbed", evidence, f"{len(disturbed)} run(s) disturbed by other work on the host, "
                        f"{what}"))
    points = series.get(key, [])
    n = len(points)
    raw = [p.tok_s for p in points]
    norm = [p.normalised for p in points]
    if n < 2:
        out.append(warn("few-runs", {"runs": n}, f"{n} usable run{'s' if n != 1 else ''}: no interval"))
        return out
    if n < MIN_BOOTSTRAP_ROUNDS:
        out.append(warn("few-runs", {"runs": n, "needed_for_bootstrap": MIN_BOOTSTRAP_ROUNDS},
                        f"{n} runs: too few for a bootstrap interval; the interval assumes log-normal noise and is "
                        "wide"))
    cv = float(sps.variation(raw, ddof=1))
    cv_norm = float(sps.variation(norm, ddof=1))
    if cv > DISPERSION_CV:
        machine = f"; {cv_norm:.0%} after removing the round effect" if cv_norm < cv / 2 else ""
        out.append(warn("dispersion", {"cv": round(cv, 4), "normalised_cv": round(cv_norm, 4),
                                       "series": [round(x, 3) for x in raw]},
                        f"tok/s varies {cv:.0%} (coefficient of variation) across {n} runs{machine}"))
    scale = pooled_noise(series, host)
    if n >= 3 and scale is not None:
        for i, r in enumerate(_loo_residuals(points)):
            z = r / scale if scale > 0 else (math.inf if r else 0.0)
            dev = math.exp(r) - 1
            if abs(z) <= OUTLIER_Z or abs(dev) <= FIRST_RUN_MIN:
                continue
            evidence = {"run": i + 1, "order": points[i].order, "tok_s": round(raw[i], 3),
                        "deviation": round(dev, 4), "z": None if math.isinf(z) else round(z, 2),
                        "pooled_sd": round(scale, 4), "series": [round(x, 3) for x in raw]}
            way = "slower" if dev < 0 else "faster"
            zs = "" if math.isinf(z) else f", z={z:+.1f}"
            if i == 0:
                out.append(warn("first-run", evidence, f"the first run was {abs(dev):.0%} {way} than the rest "
                                f"({raw[0]:.1f} tok/s{zs}): caches? start-up?"))
            else:
                out.append(warn("outlier", evidence, f"statistical outlier: run {i + 1} was {abs(dev):.0%} {way} "
                                f"than the others ({raw[i]:.1f} tok/s{zs})"))
    return out


# -- one call for a whole run -------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellStats:
    """Everything the statistics say about one cell."""

    host: str
    strategy: str
    task: str
    runs: int
    tok_s_median: float | None
    tok_s_interval: Interval
    speedup: Speedup | None  # None for the baseline itself
    contamination: Contamination
    warnings: list[StabilityWarning]
    fingerprint: Fingerprint

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "strategy": self.strategy, "task": self.task, "runs": self.runs,
                "tok_s_median": self.tok_s_median, "tok_s_interval": self.tok_s_interval.as_dict(),
                "speedup": None if self.speedup is None else self.speedup.as_dict(),
                "contamination": self.contamination.as_dict(),
                "warnings": [w.as_dict() for w in self.warnings], "fingerprint": self.fingerprint.as_dict()}


@dataclass(frozen=True)
class RunStats:
    """Every cell's statistics and each strategy's geometric-mean speedup, per host."""

    baseline: str | None
    cells: list[CellStats]
    geomeans: list[Speedup]

    def cell(self, host: str, strategy: str, task: str) -> CellStats | None:
        return next((c for c in self.cells if (c.host, c.strategy, c.task) == (host, strategy, task)), None)

    def as_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "cells": [c.as_dict() for c in self.cells],
                "geomeans": [g.as_dict() for g in self.geomeans]}


Baselines = str | None | dict[str, str | None]


def baseline_map(baseline: Baselines, strategies: Iterable[str]) -> dict[str, str | None]:
    """Each strategy's baseline (None for a baseline itself): one id for every strategy, or a mapping."""
    if isinstance(baseline, dict):
        return {s: baseline.get(s) for s in strategies}
    return {s: None if s == baseline or baseline is None else baseline for s in strategies}


def prompt_units(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of tasks with several prompts relabelled task -> 'task/prompt': identical requests (the same
    prompt) are what must give identical draft counts and outputs, and what a trend is judged on."""
    prompts: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for r in records:
        prompts[(r.get("host", "local"), r["strategy"], r["task"])].add(r.get("prompt", r["task"]))
    if all(len(v) <= 1 for v in prompts.values()):
        return records
    return [dict(r, task=f"{r['task']}/{r.get('prompt', r['task'])}")
            if len(prompts[(r.get("host", "local"), r["strategy"], r["task"])]) > 1 else r for r in records]


#: Contamination kinds, the strongest evidence first: the kind a cell shows is its worst prompt's.
_KIND_ORDER = ("warm-cache", "naive", "unstable", "drift", "none")


def _cell_checks(units: list[dict[str, Any]], series: dict[Key, list[Point]], host: str, s: str, task: str,
                 unit_tasks: list[str], protocol: str | None) -> tuple[Contamination, list[StabilityWarning]]:
    """Contamination and warnings of a cell from its prompts' units (the cell itself when it has one prompt)."""
    verdicts = []
    warnings: list[StabilityWarning] = []
    for ut in unit_tasks:
        c = contamination(units, host, s, ut, protocol, series)
        w = stability(units, host, s, ut, series)
        if ut != task:
            prompt = ut[len(task) + 1:]
            c = Contamination(c.kind, {**c.evidence, "prompt": prompt}, f"prompt {prompt}: {c.sentence}")
            w = [StabilityWarning(x.kind, host, s, task, {**x.evidence, "prompt": prompt},
                                  f"prompt {prompt}: {x.sentence}") for x in w]
        verdicts.append(c)
        warnings += w
    worst = min(verdicts, key=lambda c: _KIND_ORDER.index(c.kind) if c.kind in _KIND_ORDER else 0)
    return worst, warnings


def analyze(records: list[dict[str, Any]], baseline: Baselines, protocol: str | None = None,
            band: float = EQUIVALENCE_BAND) -> RunStats:
    """Statistics for every cell of a run (cells in first-seen order) and per host each strategy's geomean.
    `baseline`: the baseline's id, or each strategy's baseline (`baseline_map`)."""
    seen: dict[tuple[str, str, str], None] = {}
    for r in sorted(records, key=lambda r: r.get("order", 0)):
        seen.setdefault((r.get("host", "local"), r["strategy"], r["task"]), None)
    bases = baseline_map(baseline, dict.fromkeys(s for _, s, _ in seen))
    by_cell = group_cells(usable(records))
    everything = group_cells(list(records))
    units = prompt_units(list(records))
    unit_tasks: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    for r, u in zip(records, units, strict=True):
        key = (r.get("host", "local"), r["strategy"], r["task"])
        if u["task"] not in unit_tasks[key]:
            unit_tasks[key].append(u["task"])
    series = normalise(units)
    cells = []
    for host, s, t in seen:
        vals = list(per_round(by_cell.get((host, s, t), [])).values())
        b = bases[s]
        sp = speedup(records, host, s, t, b, band) if b is not None else None
        con, warns = _cell_checks(units, series, host, s, t, unit_tasks[(host, s, t)], protocol)
        cells.append(CellStats(host, s, t, len(vals), statistics.median(vals) if vals else None,
                               median_interval(vals), sp, con, warns, fingerprint(everything[(host, s, t)])))
    geomeans = []
    for host in dict.fromkeys(h for h, _, _ in seen):
        tasks = list(dict.fromkeys(t for h, _, t in seen if h == host))
        for s in dict.fromkeys(s for h, s, _ in seen if h == host and bases[s] is not None):
            geomeans.append(geomean_speedup(records, host, s, tasks, bases[s], band))
    return RunStats(baseline if not isinstance(baseline, dict) else None, cells, geomeans)


# -- adaptive runs ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellConvergence:
    """Whether one cell's interval is as narrow as asked: relative half-width against the target."""

    host: str
    strategy: str
    task: str
    rounds: int
    half_width: float | None
    converged: bool
    rounds_estimate: int | None  # see `rounds_needed`

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Convergence:
    """Per cell convergence, the cells not converged, and the cells the next round must run: the unconverged
    ones plus, for pairing, the baseline of every task they belong to."""

    target: float
    cells: list[CellConvergence]
    pending: list[tuple[str, str, str]]
    to_run: list[tuple[str, str, str]]

    @property
    def done(self) -> bool:
        return not self.pending

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "done": self.done, "cells": [c.as_dict() for c in self.cells],
                "pending": [list(k) for k in self.pending], "to_run": [list(k) for k in self.to_run]}


def rounds_needed(values: Sequence[float], target: float = CONVERGENCE_TARGET, limit: int = 1000) -> int | None:
    """Fewest rounds m for which a Student-t interval on the logs, with the spread seen so far, is within
    `target`: t(0.975, m-1) x sd / sqrt(m) <= log(1 + target). An estimate (the spread itself is uncertain);
    None with fewer than 2 values, `limit` when even that many would not do."""
    logs = [math.log(v) for v in values if v and v > 0]
    if len(logs) < 2:
        return None
    sd = statistics.stdev(logs)
    if sd == 0:
        return len(logs)
    goal = math.log1p(target)
    for m in range(max(2, len(logs)), limit + 1):
        if sps.t.ppf(0.5 + CONFIDENCE / 2, m - 1) * sd / math.sqrt(m) <= goal:
            return m
    return limit


def convergence(records: list[dict[str, Any]], baseline: Baselines, target: float = CONVERGENCE_TARGET,
                min_rounds: int = MIN_CONVERGED_ROUNDS) -> Convergence:
    """For `invoke run --until 5%`: is each cell's speedup interval (the tok/s median's interval where there is
    no baseline) within `target` of its estimate on either side? A cell with fewer than `min_rounds` rounds is
    not converged whatever its interval says."""
    seen: dict[tuple[str, str, str], None] = {}
    for r in sorted(records, key=lambda r: r.get("order", 0)):
        seen.setdefault((r.get("host", "local"), r["strategy"], r["task"]), None)
    by_cell = group_cells(usable(records))
    bases = baseline_map(baseline, dict.fromkeys(s for _, s, _ in seen))
    has_baselines = any(b is not None for b in bases.values())
    out = []
    for host, s, t in seen:
        if has_baselines and bases[s] is None:
            continue
        if bases[s] is not None:
            sp = speedup(records, host, s, t, bases[s])
            est, iv, vals = sp.estimate, sp.interval, list(sp.rounds.values())
        else:
            vals = list(per_round(by_cell.get((host, s, t), [])).values())
            est, iv = (statistics.median(vals) if vals else None), median_interval(vals)
        hw = iv.half_width(est)
        ok = hw is not None and hw <= target and iv.n >= min_rounds
        need = rounds_needed(vals, target)
        out.append(CellConvergence(host, s, t, iv.n, None if hw is None else round(hw, 4), ok,
                                   None if need is None else max(need, min_rounds)))
    pending = [(c.host, c.strategy, c.task) for c in out if not c.converged]
    to_run = list(pending)
    to_run += [k for k in dict.fromkeys((h, bases[s], t) for h, s, t in pending if bases[s] is not None)
               if k in seen and k not in to_run]
    return Convergence(target, out, pending, to_run)


# -- reproduction -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CellReproduction:
    """One cell of two runs: speedups A and B with intervals, their ratio B/A with its interval and verdict
    (reproduces / differs / inconclusive / n/a), the deterministic fingerprint (identical / differ) and the
    absolute tok/s ratio, which depends on hardware and machine state and is never judged."""

    host: str
    strategy: str
    task: str
    speedup_a: float | None
    speedup_b: float | None
    interval_a: Interval | None
    interval_b: Interval | None
    ratio: float | None
    ratio_interval: Interval | None
    verdict: str
    rule: str
    fingerprint: str
    fingerprint_detail: str
    tok_s_ratio: float | None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tok_s_ratio_note"] = "hardware- and state-dependent"
        return d


@dataclass(frozen=True)
class Reproduction:
    band: float
    cells: list[CellReproduction]
    counts: dict[str, int]
    fingerprints: dict[str, int]
    sentence: str

    def as_dict(self) -> dict[str, Any]:
        return {"band": self.band, "cells": [c.as_dict() for c in self.cells], "counts": self.counts,
                "fingerprints": self.fingerprints, "sentence": self.sentence}


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """An interval for median(b) / median(a) of two independent sets of positive values (per-round speedups of
    two runs): Welch's t-interval on the difference of the logs; with MIN_BOOTSTRAP_ROUNDS values on each side,
    its hull with a two-sample percentile bootstrap of the ratio of medians; none with fewer than 2 on a side."""
    xa = np.asarray([v for v in a if v and v > 0], dtype=float)
    xb = np.asarray([v for v in b if v and v > 0], dtype=float)
    n = min(len(xa), len(xb))
    if n < 2:
        return Interval(None, None, n, "none", "fewer than 2 rounds in one run: no interval", confidence)
    la, lb = np.log(xa), np.log(xb)
    if np.all(la == la[0]) and np.all(lb == lb[0]):
        r = float(np.exp(lb[0] - la[0]))
        return Interval(r, r, n, "exact", "both runs' values identical within each run", confidence)
    ci = sps.ttest_ind(lb, la, equal_var=False).confidence_interval(confidence)
    t = math.exp(ci.low), math.exp(ci.high)
    if n >= MIN_BOOTSTRAP_ROUNDS:
        def stat(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
            return np.exp(np.median(y, axis=axis) - np.median(x, axis=axis))
        res = sps.bootstrap((la, lb), stat, vectorized=True, method="percentile", confidence_level=confidence,
                            n_resamples=N_RESAMPLES, random_state=_rng())
        boot = float(res.confidence_interval.low), float(res.confidence_interval.high)
        return Interval(*_hull(boot, t), n, "bootstrap+t", "hull of a two-sample percentile bootstrap of the ratio "
                        "of medians and Welch's t-interval on the logs", confidence)
    return Interval(*t, n, "t-log", "Welch t-interval on the logs (few rounds)", confidence)


def _fingerprint_match(fa: Fingerprint, fb: Fingerprint) -> tuple[str, str]:
    if not fa.drafts or not fb.drafts:
        return "missing", "no runs in one of the two"
    same_drafts = set(fa.drafts) == set(fb.drafts)
    same_out = set(fa.outputs) == set(fb.outputs)
    if same_drafts and same_out:
        return "identical", fa.draft_words()
    parts = []
    if not same_drafts:
        parts.append(f"A {fa.draft_words()}; B {fb.draft_words()}")
    if not same_out:
        parts.append("outputs differ")
    return "differ", "; ".join(parts)


def reproduction(a: RunStats, b: RunStats, band: float = REPRODUCE_BAND) -> Reproduction:
    """Judge run B against run A on what transfers between machines: the speedups and the deterministic
    fingerprint. Per cell: reproduces when the interval of speedup B / speedup A lies inside the ±band; differs
    when the two speedup intervals are disjoint; else inconclusive. Cells are matched by host, strategy and
    task; a cell of A on a host B lacks is matched on B's only host when B has one."""
    b_hosts = list(dict.fromkeys(c.host for c in b.cells))
    rows = []
    for ca in a.cells:
        host_b = ca.host if ca.host in b_hosts or len(b_hosts) != 1 else b_hosts[0]
        cb = b.cell(host_b, ca.strategy, ca.task)
        if cb is None:
            rows.append(CellReproduction(ca.host, ca.strategy, ca.task, None, None, None, None, None, None,
                                         "missing", "not measured in B", "missing", "", None))
            continue
        fp, fp_words = _fingerprint_match(ca.fingerprint, cb.fingerprint)
        tok = (cb.tok_s_median / ca.tok_s_median) if ca.tok_s_median and cb.tok_s_median else None
        if ca.speedup is None or cb.speedup is None:
            rows.append(CellReproduction(ca.host, ca.strategy, ca.task, None, None, None, None, None, None, "n/a",
                                         "the baseline: its speedup is 1 by definition", fp, fp_words, tok))
            continue
        sa, sb = ca.speedup, cb.speedup
        riv = ratio_interval(list(sa.rounds.values()), list(sb.rounds.values()))
        ratio = sb.estimate / sa.estimate if sa.estimate and sb.estimate else None
        v, rule = _reproduction_verdict(sa.interval, sb.interval, riv, band)
        rows.append(CellReproduction(ca.host, ca.strategy, ca.task, sa.estimate, sb.estimate, sa.interval,
                                     sb.interval, ratio, riv, v, rule, fp, fp_words, tok))
    counts: dict[str, int] = {}
    fps: dict[str, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
        fps[r.fingerprint] = fps.get(r.fingerprint, 0) + 1
    return Reproduction(band, rows, counts, fps, _reproduction_sentence(rows, counts, fps, band))


def _reproduction_verdict(ia: Interval, ib: Interval, riv: Interval, band: float) -> tuple[str, str]:
    if riv.available and riv.low >= 1 / (1 + band) and riv.high <= 1 + band:
        return "reproduces", (f"the {riv.confidence:.0%} interval of B/A [{riv.low:.3f}, {riv.high:.3f}] lies "
                              f"inside ±{band:.0%}")
    if ia.available and ib.available and (ia.high < ib.low or ib.high < ia.low):
        return "differs", (f"the speedup intervals A [{ia.low:.3f}, {ia.high:.3f}] and B [{ib.low:.3f}, "
                           f"{ib.high:.3f}] do not overlap")
    if not riv.available:
        return "inconclusive", riv.note
    return "inconclusive", (f"the interval of B/A [{riv.low:.3f}, {riv.high:.3f}] reaches outside ±{band:.0%} "
                            "and the speedup intervals overlap")


def _reproduction_sentence(rows: list[CellReproduction], counts: dict[str, int], fps: dict[str, int],
                           band: float) -> str:
    judged = [r for r in rows if r.verdict in ("reproduces", "differs", "inconclusive")]
    n_fp = sum(fps.get(k, 0) for k in ("identical", "differ"))
    if counts.get("differs"):
        head = "differs"
    elif judged and counts.get("reproduces", 0) == len(judged) and not fps.get("differ"):
        head = "reproduces"
    else:
        head = "inconclusive"
    toks = [r.tok_s_ratio for r in rows if r.tok_s_ratio]
    tok_words = (f"; absolute tok/s B/A {min(toks):.2f}-{max(toks):.2f}x (hardware- and state-dependent, not "
                 "judged)") if toks else ""
    missing = f"; {counts['missing']} cells missing in B" if counts.get("missing") else ""
    return (f"{head}: speedups {counts.get('reproduces', 0)} reproduce (B/A within ±{band:.0%}), "
            f"{counts.get('differs', 0)} differ, {counts.get('inconclusive', 0)} inconclusive of {len(judged)}; "
            f"deterministic fingerprint identical in {fps.get('identical', 0)} of {n_fp} cells{missing}{tok_words}")
