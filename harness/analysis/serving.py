"""The serving question: throughput against per-stream latency at N concurrent clients, and the number of users
at which batching (the baseline with N slots) overtakes speculation.

Pure functions of plain numbers. One `Sample` is one measurement: N clients at once against one fresh server,
the aggregate rate (all streams' tokens over the wall time from the first request sent to the last token), the
per-stream decode rates, times to first token, inter-token latencies, and whether every slot speculated
(GET /slots) and the streams drafted.

- A curve point (a strategy at N): the aggregate tok/s, the geometric mean over rounds of each round's geometric
  mean over prompts, with a Student-t interval on those logs (scipy.stats.ttest_1samp), beside the median
  per-stream rate, time per output token, time to first token and the inter-token latency p50 / p99 (medians over
  measurements).
- Batching against speculation: at each level N of the baseline, the speculative strategy at N where it was
  measured and speculated (else at its highest level below N that did: N clients with fewer slots wait for one),
  paired with the baseline at N by round and prompt: aggregate(speculation) / aggregate(baseline at N), a
  Student-t interval over rounds of each round's mean log ratio. Batching overtakes speculation at the first N
  whose interval lies below 1; the first N whose estimate lies below 1 is named too, as not yet certain. That it
  does not overtake is said only where the intervals show it: at every level, the interval above 1; a level whose
  interval reaches 1 (or that has none) is one where it is not shown either way."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from harness import formatter as fm
from harness.analysis.inference import NO_FIGURE, Figure
from harness.store import shapes

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Sample:
    """One measurement of a strategy at N concurrent clients."""

    strategy: str
    streams: int
    round: int
    prompt: str  # task/prompt: what pairs two strategies within a round
    aggregate_tok_s: float
    per_stream_tok_s: tuple[float, ...]
    ttft_s: tuple[float, ...]
    itl_p50_s: float | None
    itl_p99_s: float | None
    speculating: bool | None  # every slot speculated and the streams drafted; None for a baseline or unknown


def _round_logs(pairs: Sequence[tuple[int, float]]) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r, v in pairs:
        if v and v > 0:
            by.setdefault(r, []).append(math.log(v))
    return {r: statistics.fmean(xs) for r, xs in sorted(by.items())}


def band(pairs: Sequence[tuple[int, float]]) -> Figure:
    """(round, value) pairs: the geometric mean over rounds of each round's geometric mean, and a Student-t
    interval on those logs."""
    logs = np.asarray(list(_round_logs(pairs).values()), dtype=float)
    if not len(logs):
        return NO_FIGURE
    est = math.exp(float(np.mean(logs)))
    if len(logs) < 2:
        return Figure(est, None, None, len(logs))
    if np.all(logs == logs[0]):
        return Figure(est, math.exp(logs[0]), math.exp(logs[0]), len(logs))
    ci = sps.ttest_1samp(logs, 0.0).confidence_interval(CONFIDENCE)
    return Figure(est, math.exp(ci.low), math.exp(ci.high), len(logs))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


@dataclass(frozen=True)
class Point:
    """A strategy at N clients: throughput, per-stream latency, and whether it speculated there."""

    strategy: str
    streams: int
    aggregate: Figure
    per_stream_tok_s: float | None
    tpot_ms: float | None
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    speculating: bool | None
    measurements: int

    def as_dict(self) -> shapes.PointJson:
        return {"strategy": self.strategy, "streams": self.streams, "aggregate_tok_s": self.aggregate.as_dict(),
                "per_stream_tok_s": fm.rounded(self.per_stream_tok_s, 3), "tpot_ms": fm.rounded(self.tpot_ms, 3),
                "ttft_ms": fm.rounded(self.ttft_ms, 3), "itl_p50_ms": fm.rounded(self.itl_p50_ms, 3),
                "itl_p99_ms": fm.rounded(self.itl_p99_ms, 3), "speculating": self.speculating,
                "measurements": self.measurements}


def point(samples: Sequence[Sample]) -> Point:
    """One strategy's samples at one level, as a point of its curve."""
    s0 = samples[0]
    per = _median([x for s in samples for x in s.per_stream_tok_s])
    spec = [s.speculating for s in samples if s.speculating is not None]
    return Point(s0.strategy, s0.streams, band([(s.round, s.aggregate_tok_s) for s in samples]), per,
                 None if not per else 1000 / per, _ms(_median([x for s in samples for x in s.ttft_s])),
                 _ms(_median([s.itl_p50_s for s in samples])), _ms(_median([s.itl_p99_s for s in samples])),
                 (all(spec) if spec else None), len(samples))


@dataclass(frozen=True)
class Level:
    """Speculation against batching at N clients: which level of the speculative strategy stands for N, and the
    ratio of its aggregate rate to the baseline's at N."""

    streams: int
    speculative_streams: int | None
    ratio: Figure

    def as_dict(self) -> shapes.LevelJson:
        return {"streams": self.streams, "speculative_streams": self.speculative_streams,
                "ratio": self.ratio.as_dict()}


@dataclass(frozen=True)
class Crossover:
    """Where batching overtakes one speculative strategy: per level the ratio, the first N whose interval lies
    below 1 (certain), and the first whose estimate does (not yet certain)."""

    strategy: str
    baseline: str
    levels: tuple[Level, ...]
    overtaken_at: int | None
    estimate_below_at: int | None

    @property
    def ahead_at(self) -> list[int]:
        """The levels where speculation is ahead of batching: the interval lies above 1."""
        return [x.streams for x in self.levels if x.ratio.low is not None and x.ratio.low > 1]

    @property
    def not_shown_at(self) -> list[int]:
        """The levels where the interval reaches 1, or where there is none: neither ahead nor overtaken."""
        return [x.streams for x in self.levels
                if x.ratio.low is None or x.ratio.high is None or x.ratio.low <= 1 <= x.ratio.high]

    def as_dict(self) -> shapes.CrossoverJson:
        return {"strategy": self.strategy, "baseline": self.baseline, "levels": [x.as_dict() for x in self.levels],
                "overtaken_at": self.overtaken_at, "estimate_below_at": self.estimate_below_at,
                "ahead_at": self.ahead_at, "not_shown_at": self.not_shown_at}


def crossover(name: str, baseline: str, spec: dict[int, Sequence[Sample]],
              base: dict[int, Sequence[Sample]]) -> Crossover:
    """`spec` and `base`: samples by level. At each baseline level N, the speculative level that stands for it
    (N, else the highest measured level below N that speculated), paired by round and prompt."""
    usable = sorted(n for n, ss in spec.items() if ss and all(s.speculating is not False for s in ss))
    levels = []
    for n in sorted(base):
        stand = max((m for m in usable if m <= n), default=None)
        if stand is None:
            levels.append(Level(n, None, NO_FIGURE))
            continue
        b = {(s.round, s.prompt): s.aggregate_tok_s for s in base[n]}
        pairs = [(s.round, s.aggregate_tok_s / b[(s.round, s.prompt)]) for s in spec[stand]
                 if b.get((s.round, s.prompt))]
        levels.append(Level(n, stand, band(pairs)))
    over = next((x.streams for x in levels if x.ratio.high is not None and x.ratio.high < 1), None)
    below = next((x.streams for x in levels if x.ratio.estimate is not None and x.ratio.estimate < 1), None)
    return Crossover(name, baseline, tuple(levels), over, below)
