"""The load study judged: serving metrics per level with vLLM's definitions, and speculation against the baseline
per level, paired by round, under one Holm family per printed table.

Metrics (vLLM `benchmarks/serve.py`; GuideLLM names two of them the other way round):
- TTFT: send to first token. E2EL: send to last token.
- TPOT: (E2EL − TTFT) / (output tokens − 1), per request with more than one token (GuideLLM's "time per output
  token" includes the first token: E2EL / output tokens).
- ITL: every gap between tokens after the first, pooled over the level's requests (GuideLLM's "inter-token latency"
  is per request, (E2EL − TTFT)/(tokens − 1), which is vLLM's TPOT).
- p50 / p90 / p99: numpy's linear interpolation, as vLLM computes them.
- The level's duration: first send to last answer; request throughput = answered requests / duration; output tok/s
  = output tokens / duration; goodput = requests that meet every SLO given / duration (a failed request meets
  none; a request of one token has TPOT 0 there, as in vLLM).
- Offered against achieved: the schedule's sends and the actual ones. A level whose sends fell behind (more than a
  tenth of its requests sent later than one mean gap, 1/rate, after their time: the concurrency cap or a
  saturated client) could not be offered: it is named, and its rounds are left out of the judgement.

Judgement: per arm (a strategy at a slot count) and level, speculation over the baseline at the same slots and
level, one ratio per round (the same requests at the same times on two fresh servers), each oriented so that
above 1 means speculation serves better: goodput (spec/base, each count + 0.5 so that a level where either
serves none still has a ratio), output tok/s (spec/base) and p99 TPOT (base/spec). Per cell a Student-t interval
on the rounds' log ratios (95%) and a two-sided p; the marks (▲ better, ▼ worse) are Holm's over every cell of
the table (arms × levels × the three figures). The crossover per arm and figure: between the highest offered rate
marked ▲ and the first higher one marked ▼ (the rate where the estimate crosses 1, interpolated in log rate,
named with that bracket); without a ▼ above a ▲ it is "not within the rates measured"."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from harness.analysis.inference import ALPHA, holm_adjusted
from harness.intake.load import Slo
from harness.store import load as store

CONFIDENCE = 0.95
PERCENTILES = (50, 90, 99)
#: A send later than this many mean gaps after its scheduled time is behind; a level with more than BEHIND_SHARE of
#: its requests behind could not be offered.
BEHIND_GAPS = 1.0
BEHIND_SHARE = 0.1
FIGURES = ("goodput", "output_tok_s", "p99_tpot")
#: Which way each figure's ratio is taken: speculation over baseline, or the other way (a latency: lower is better).
SPEC_OVER_BASE = {"goodput": True, "output_tok_s": True, "p99_tpot": False}


@dataclass(frozen=True)
class Achieved:
    """What a level sent and answered against what it offered."""

    offered_rate: float | None
    schedule_rate: float | None  # the seeded schedule's own rate, (n − 1) / (last send time − first)
    send_rate: float | None  # the sends as made
    request_rate: float | None  # answered requests per second of the level's duration
    duration_s: float
    behind: int  # requests sent more than one mean gap late
    sent: int

    @property
    def offered(self) -> bool:
        """Whether the level was offered as asked (a synchronous or throughput level always is)."""
        return self.offered_rate is None or self.behind <= BEHIND_SHARE * max(1, self.sent)


def _rate(times: Sequence[float]) -> float | None:
    return (len(times) - 1) / (max(times) - min(times)) if len(times) > 1 and max(times) > min(times) else None


def achieved(rec: store.Level) -> Achieved:
    reqs = rec["requests"]
    sent = [r for r in reqs if r["sent_s"] is not None]
    done = [r for r in sent if r["error"] is None and r["e2el_s"] is not None]
    start = min((r["sent_s"] for r in sent), default=0.0)
    end = max((r["sent_s"] + r["e2el_s"] for r in done), default=start)
    duration = max(0.0, end - start)
    rate = rec["offered_rate"]
    gap = BEHIND_GAPS / rate if rate else math.inf
    behind = sum(1 for r in sent if r["sent_s"] - r["scheduled_s"] > gap) + (len(reqs) - len(sent))
    return Achieved(rate, _rate([r["scheduled_s"] for r in reqs]), _rate([r["sent_s"] for r in sent]),
                    len(done) / duration if duration > 0 else None, duration, behind, len(sent))


def _pcts(xs: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    if not xs:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    a = np.asarray(xs, dtype=float) * scale
    return {"mean": float(np.mean(a)), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, np.percentile(a, PERCENTILES),
                                                                            strict=True)}}


@dataclass(frozen=True)
class LevelMetrics:
    """One level's serving metrics (milliseconds for latencies)."""

    sent: int
    completed: int
    good: int
    duration_s: float
    request_throughput: float | None
    output_tok_s: float | None
    goodput: float | None
    ttft_ms: dict[str, float | None] = field(default_factory=dict)
    tpot_ms: dict[str, float | None] = field(default_factory=dict)
    itl_ms: dict[str, float | None] = field(default_factory=dict)
    e2el_ms: dict[str, float | None] = field(default_factory=dict)


def tpot_s(r: store.Request) -> float | None:
    """vLLM's TPOT of one request: (E2EL − TTFT) / (tokens − 1); None with one token or none."""
    if r["error"] is not None or r["e2el_s"] is None or r["ttft_s"] is None or r["output_tokens"] < 2:
        return None
    return (r["e2el_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)


def meets(r: store.Request, slo: Slo) -> bool:
    """A request meets the SLOs: answered, and within every one given (TPOT 0 for a single token, as vLLM)."""
    if r["error"] is not None or r["e2el_s"] is None or r["ttft_s"] is None:
        return False
    checks = {"ttft_ms": r["ttft_s"], "tpot_ms": tpot_s(r) or 0.0, "e2el_ms": r["e2el_s"]}
    return all(checks[k] * 1000 <= v for k, v in slo.given().items())


def metrics(requests: Sequence[store.Request], slo: Slo, duration_s: float) -> LevelMetrics:
    sent = [r for r in requests if r["sent_s"] is not None]
    done = [r for r in sent if r["error"] is None and r["e2el_s"] is not None and r["ttft_s"] is not None]
    good = sum(meets(r, slo) for r in done)
    per = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: None)  # noqa: E731
    return LevelMetrics(len(sent), len(done), good, duration_s, per(len(done)),
                        per(sum(r["output_tokens"] for r in done)), per(good),
                        _pcts([r["ttft_s"] for r in done]), _pcts([t for r in done if (t := tpot_s(r)) is not None]),
                        _pcts([g for r in done for g in r.get("itl_s", [])]), _pcts([r["e2el_s"] for r in done]))


def acceptance(rec: store.Level) -> dict[str, float | None]:
    """The level's drafts, drafted and accepted tokens from the server's counters (after minus before,
    harness/run/metrics.py), and the mean acceptance length 1 + accepted / drafts; None where they were not read."""
    c = rec.get("spec_counters") or {}
    if "drafts" not in c:
        return {"drafts": None, "draft_tokens": None, "accepted": None, "mean_length": None}
    d, a = c["drafts"], c["accepted"]
    return {"drafts": d, "draft_tokens": c["draft_tokens"], "accepted": a, "mean_length": 1 + a / d if d else None}


# ---------------------------------------------------------------- the judgement


@dataclass(frozen=True)
class Cell:
    """Speculation over the baseline for one figure at one level: the rounds' geometric mean ratio, its interval,
    its p, and the Holm mark of the table it is printed in (+1 ▲, −1 ▼, 0 none)."""

    figure: str
    estimate: float | None
    low: float | None
    high: float | None
    rounds: int
    p: float
    mark: int = 0


def paired(logs: Sequence[float], figure: str) -> Cell:
    """One cell from the rounds' log ratios: Student t on their mean (p = 1 and no interval below 2 rounds)."""
    x = np.asarray([v for v in logs if math.isfinite(v)], dtype=float)
    if not len(x):
        return Cell(figure, None, None, None, 0, 1.0)
    est = math.exp(float(np.mean(x)))
    if len(x) < 2:
        return Cell(figure, est, None, None, 1, 1.0)
    sd = float(np.std(x, ddof=1))
    if sd == 0:
        return Cell(figure, est, est, est, len(x), 0.0 if np.mean(x) != 0 else 1.0)
    se = sd / math.sqrt(len(x))
    t = float(sps.t.isf((1 - CONFIDENCE) / 2, len(x) - 1))
    p = float(2 * sps.t.sf(abs(float(np.mean(x))) / se, len(x) - 1))
    return Cell(figure, est, math.exp(float(np.mean(x)) - t * se), math.exp(float(np.mean(x)) + t * se), len(x), p)


@dataclass(frozen=True)
class Row:
    """An arm at a level: the offered rate, whether every round offered it, the cells of the three figures."""

    arm: str
    slots: int
    level: str
    offered_rate: float | None
    cells: dict[str, Cell]
    not_offered_rounds: tuple[int, ...]


@dataclass(frozen=True)
class Crossover:
    """Where speculation stops paying for one arm and figure."""

    arm: str
    figure: str
    pays_up_to: float | None  # the highest rate marked ▲ below the first ▼ (None: none)
    worse_from: float | None  # the first rate marked ▼ above it (None: none within the rates measured)
    estimate: float | None  # the rate where the estimate crosses 1 between them, interpolated in log rate


@dataclass(frozen=True)
class Judgement:
    rows: tuple[Row, ...]
    crossovers: tuple[Crossover, ...]
    family: int  # the cells Holm's family counts
    not_offered: tuple[tuple[str, str, int], ...]  # (arm, level, round) whose sends fell behind
    failed: tuple[tuple[str, str, int], ...]  # (arm, level, round) whose server failed


def _figures(rec: store.Level, slo: Slo) -> dict[str, float | None]:
    a = achieved(rec)
    m = metrics(rec["requests"], slo, a.duration_s)
    return {"goodput": (m.good + 0.5) / a.duration_s if a.duration_s > 0 else None,
            "output_tok_s": m.output_tok_s or None, "p99_tpot": m.tpot_ms.get("p99") or None}


def judge(levels: Sequence[store.Level], baseline: str, slo: Slo) -> Judgement:
    """Every speculative arm against the baseline entry's arm at its slot count, per level, paired by round."""
    ok: dict[tuple[str, str, int], store.Level] = {}
    failed, behind = [], []
    for rec in levels:
        key = (rec["strategy"], rec["level"], rec["round"])
        if rec["status"] != "ok":
            failed.append(key)
            continue
        ok[key] = rec
        if not achieved(rec).offered:
            behind.append(key)
    base_arm = {rec["slots"]: rec["strategy"] for rec in ok.values() if rec["entry"] == baseline}
    arms = sorted({(r["slots"], r["strategy"]) for r in ok.values() if r["entry"] != baseline})
    level_rate = {r["level"]: r["offered_rate"] for r in ok.values()}
    order = sorted(level_rate, key=lambda lv: (level_rate[lv] is not None, level_rate[lv] or 0, lv))
    rows: list[Row] = []
    for slots, arm in arms:
        b = base_arm.get(slots)
        for lv in order:
            rounds = sorted({r for (a, x, r) in ok if a == arm and x == lv})
            if not rounds:
                continue
            logs: dict[str, list[float]] = {f: [] for f in FIGURES}
            dropped = []
            for r in rounds:
                bk, sk = (b, lv, r), (arm, lv, r)
                if b is None or bk not in ok:
                    continue
                if bk in behind or sk in behind:
                    dropped.append(r)
                    continue
                fs, fb = _figures(ok[sk], slo), _figures(ok[bk], slo)
                for f in FIGURES:
                    s_, b_ = fs[f], fb[f]
                    if s_ and b_:
                        logs[f].append(math.log(s_ / b_) if SPEC_OVER_BASE[f] else math.log(b_ / s_))
            rows.append(Row(arm, slots, lv, level_rate[lv], {f: paired(logs[f], f) for f in FIGURES},
                            tuple(dropped)))
    cells = [(i, f) for i, row in enumerate(rows) for f in FIGURES if row.cells[f].rounds >= 2]
    adjusted = holm_adjusted([rows[i].cells[f].p for i, f in cells])
    for (i, f), q in zip(cells, adjusted, strict=True):
        c = rows[i].cells[f]
        if q <= ALPHA and c.estimate is not None:
            rows[i].cells[f] = Cell(c.figure, c.estimate, c.low, c.high, c.rounds, c.p, 1 if c.estimate > 1 else -1)
    crossovers = [crossover(arm, f, [r for r in rows if r.arm == arm]) for _, arm in arms for f in FIGURES
                  if f != "output_tok_s"]
    return Judgement(tuple(rows), tuple(crossovers), len(cells), tuple(behind), tuple(failed))


def crossover(arm: str, figure: str, rows: Sequence[Row]) -> Crossover:
    """The bracket where one figure's marks turn from ▲ to ▼ with the offered rate, and the rate where the estimate
    crosses 1 inside it (log-linear); rows of a sweep's synchronous and throughput levels have no offered rate and
    take no part."""
    rated = sorted((r for r in rows if r.offered_rate is not None), key=lambda r: r.offered_rate or 0)
    worse = next((r for r in rated if r.cells[figure].mark < 0), None)
    below = [r for r in rated if worse is None or (r.offered_rate or 0) < (worse.offered_rate or 0)]
    up = next((r for r in reversed(below) if r.cells[figure].mark > 0), None)
    if worse is None or up is None:
        return Crossover(arm, figure, up.offered_rate if up else None, worse.offered_rate if worse else None, None)
    path = [r for r in rated if (up.offered_rate or 0) <= (r.offered_rate or 0) <= (worse.offered_rate or 0)]
    est = None
    for a, b in zip(path, path[1:], strict=False):
        ea, eb = a.cells[figure].estimate, b.cells[figure].estimate
        if ea and eb and ea >= 1 >= eb and a.offered_rate and b.offered_rate:
            la, lb = math.log(a.offered_rate), math.log(b.offered_rate)
            w = 0.0 if ea == eb else math.log(ea) / (math.log(ea) - math.log(eb))
            est = math.exp(la + w * (lb - la))
            break
    return Crossover(arm, figure, up.offered_rate, worse.offered_rate, est)


def by_arm(levels: Sequence[store.Level], slo: Slo) -> Mapping[str, list[tuple[str, float | None, list[dict]]]]:
    """Per arm and level (in offered-rate order), each round's figures: what the table's absolute columns and the
    plot draw."""
    out: dict[str, dict[str, tuple[float | None, list[dict]]]] = {}
    for rec in levels:
        if rec["status"] != "ok":
            continue
        a = achieved(rec)
        m = metrics(rec["requests"], slo, a.duration_s)
        out.setdefault(rec["strategy"], {}).setdefault(rec["level"], (rec["offered_rate"], []))[1].append(
            {"round": rec["round"], "achieved": a, "metrics": m, "acceptance": acceptance(rec)})
    return {arm: sorted(((lv, r, xs) for lv, (r, xs) in lvs.items()), key=lambda t: (t[1] is not None, t[1] or 0))
            for arm, lvs in out.items()}


def band(values: Sequence[float | None]) -> tuple[float | None, float | None, float | None]:
    """The rounds' mean of a figure and a Student-t 95% interval on it (None below 2 values); the interval of a
    figure that cannot be negative (a rate, a throughput) stops at 0."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not len(x):
        return None, None, None
    m = float(np.mean(x))
    if len(x) < 2:
        return m, None, None
    h = float(sps.t.isf((1 - CONFIDENCE) / 2, len(x) - 1)) * float(np.std(x, ddof=1)) / math.sqrt(len(x))
    return m, (max(0.0, m - h) if x.min() >= 0 else m - h), m + h
