"""Why a strategy is faster or slower: its speedup split into tokens per target pass and target passes per second,
each against its baseline, so a reader sees which of the two decides the verdict.

Per measurement, tokens per pass T = predicted / (predicted - accepted) (each target pass yields one token plus the
drafts it accepted: harness/analysis/checks.py) and the pass rate P = tok/s / T (target passes per second). A
strategy's tok/s over its baseline's is then T_s/T_b x P_s/P_b exactly, and in logs a sum. Both factors are paired
by round and prompt as the speedup is (harness/analysis/speedups.py): per round, log speedup = log T ratio + log
pass-rate ratio, to the last bit.

Estimates. The tokens-per-pass factor is the location of its per-round logs (harness/analysis/inference.py: the
mean, from TRIM_FROM rounds the trimmed mean), its interval moderated toward the table's other cells as the
speedup's is. The pass-rate factor is the speedup over it, so that the two multiply back to the speedup exactly;
its interval is that of its own per-round logs, moderated the same way. At temperature 0 in fresh containers the
drafts repeat run after run, so tokens per pass barely varies and the timing noise is all in the pass rate.

What decides. A strategy gains T (tokens per pass, at most what it drafted: every drafted token accepted would
give 1 + drafted/passes) and pays 1/P (a step, draft and verification, costs 1/P baseline passes). For a cell that
is marked slower, the factor further from its ideal in logs decides: log(offered T / T) for acceptance (acceptance
too low), -log P for the step (each step too expensive). A cell marked faster is carried by its tokens per pass,
one marked equivalent balances the two. A cell without a mark (not significant, too few rounds) is not explained:
which side of 1 its estimate fell on is the noise of its rounds (simulated on the demo's noise, 16 of 73 such
explanations flipped in more than a tenth of tables); only "nothing drafted" is said of it, a fact of its records.

Where the server's trace-level statistics give them (`dur(b,g,a)`, the GPU backends' -lv 4), the draft's share of
the decode time and the time of one verifying target pass, beside the baseline's time per pass."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from harness.analysis import checks
from harness.analysis import inference as inf
from harness.analysis.records import CellIndex, CellKey, Measurement
from harness.analysis.speedups import MIN_ROUNDS, SpeedupTable, Verdict
from harness.store import shapes


class Cause(StrEnum):
    """What decides a cell's verdict."""

    PAYS = "tokens per pass pay"  # faster: the tokens per pass outweigh the step's cost
    ACCEPTANCE = "acceptance too low"
    STEP = "each step too expensive"
    NOTHING_DRAFTED = "nothing drafted"
    BALANCED = "gain and cost balance"  # equivalent: within the band either way
    UNDECIDED = "not decided"  # no mark: which side of 1 the estimate fell on is the rounds' noise


@dataclass(frozen=True)
class Factor:
    """One factor of a speedup: its estimate and 95% interval (ratios against the baseline)."""

    estimate: float
    interval: inf.Interval


@dataclass(frozen=True)
class Decomposition:
    """A speculative cell's speedup as tokens per pass x pass rate, and what decides its verdict."""

    key: CellKey
    speedup: float
    tokens_per_pass: Factor
    pass_rate: Factor
    rounds: int
    cause: Cause
    acceptance: float | None  # accepted of drafted, pooled over the cell's measurements
    offered_tokens_per_pass: float  # with every drafted token accepted
    draft_share: float | None = None  # of the decode time (server statistics)
    verify_pass_ms: float | None = None  # one target pass of the strategy, its draft's time taken out
    baseline_pass_ms: float | None = None  # one target pass of the baseline

    @property
    def step_cost(self) -> float:
        """What one step costs, in baseline passes."""
        return 1 / self.pass_rate.estimate


def tokens_per_pass(m: Measurement) -> float | None:
    sv = m.raw.get("server") or {}
    return checks.tokens_per_pass(sv.get("predicted_n") or 0, m.accepted)


def round_logs(index: CellIndex, key: CellKey, baseline: str) -> dict[int, tuple[float, float]] | None:
    """Per round, (log tokens-per-pass ratio, log pass-rate ratio), each the mean over the cell's prompts paired
    with the baseline's in the same round; their sum is the round's log speedup. None when a measurement lacks the
    server's token counts."""
    own = _by_round_prompt(index.used(key))
    base = _by_round_prompt(index.used(CellKey(key.host, baseline, key.task)))
    if own is None or base is None:
        return None
    per: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for rp in sorted(own.keys() & base.keys()):
        (tok_s, tpp), (b_tok_s, b_tpp) = own[rp], base[rp]
        a = math.log(tpp / b_tpp)
        per[rp[0]].append((a, math.log(tok_s / b_tok_s) - a))
    return {rd: (statistics.fmean(a for a, _ in v), statistics.fmean(b for _, b in v)) for rd, v in sorted(per.items())}


def _by_round_prompt(ms: list[Measurement]) -> dict[tuple[int, str], tuple[float, float]] | None:
    by: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for m in ms:
        tpp = tokens_per_pass(m)
        if tpp is None:
            return None
        by[(m.round, m.prompt)].append((float(m.tok_s), tpp))
    return {k: (statistics.median(t for t, _ in v), statistics.median(p for _, p in v)) for k, v in by.items()}


def decompose(index: CellIndex, baselines: Mapping[str, str | None],
              table: SpeedupTable) -> dict[CellKey, Decomposition]:
    """Every speculative cell with a speedup estimate, decomposed (see the module docstring)."""
    keys = [k for k, s in table.cells.items() if s.est is not None and _speculative(index, k)]
    logs = {k: round_logs(index, k, str(baselines[k.strategy])) for k in keys}
    keys = [k for k in keys if logs[k]]
    est_t: dict[CellKey, inf.Estimate | None] = {}
    est_p: dict[CellKey, inf.Estimate | None] = {}
    for host in dict.fromkeys(k.host for k in keys):
        hk = [k for k in keys if k.host == host]
        for pos, out in ((0, est_t), (1, est_p)):
            found, _ = inf.estimates([inf.locate([v[pos] for v in logs[k].values()]) for k in hk])
            out.update(zip(hk, found, strict=True))
    made = {}
    for k in keys:
        t, p = est_t[k], est_p[k]
        total = table.cells[k].est
        if t is None or p is None or total is None:
            continue
        p = dataclasses.replace(p, estimate=total.estimate - t.estimate)  # the factors multiply back exactly
        made[k] = _decomposition(index, k, str(baselines[k.strategy]), total.estimate, t, p, len(logs[k]),
                                 table.cells[k].verdict.value)
    return made


def _speculative(index: CellIndex, key: CellKey) -> bool:
    return any(str(m.raw.get("spec_type", "none")) != "none" for m in index.of(key))


def _factor(est: inf.Estimate, rounds: int) -> Factor:
    iv = inf.Interval.of(est) if rounds >= MIN_ROUNDS else inf.Interval(None, None, rounds, "none", None, False)
    return Factor(math.exp(est.estimate), iv)


def _decomposition(index: CellIndex, key: CellKey, baseline: str, log_speedup: float, t: inf.Estimate,
                   p: inf.Estimate, rounds: int, verdict: str) -> Decomposition:
    ms = index.used(key)
    predicted = sum(int((m.raw.get("server") or {}).get("predicted_n") or 0) for m in ms)
    accepted = sum(m.accepted for m in ms)
    drafted = sum(m.drafted for m in ms)
    passes = max(1, predicted - accepted)
    offered = 1 + drafted / passes
    tpp = Factor(math.exp(t.estimate), _factor(t, rounds).interval)
    rate = _factor(p, rounds)
    speedup = math.exp(log_speedup)
    if not drafted:
        cause = Cause.NOTHING_DRAFTED
    elif verdict == Verdict.FASTER:
        cause = Cause.PAYS
    elif verdict == Verdict.EQUIVALENT:
        cause = Cause.BALANCED
    elif verdict != Verdict.SLOWER:  # no mark: the estimate's side of 1 is noise, nothing to explain
        cause = Cause.UNDECIDED
    else:
        short_accept = math.log(offered / max(1.0, tpp.estimate)) if offered > 0 else 0.0
        cause = Cause.ACCEPTANCE if short_accept >= -p.estimate else Cause.STEP
    share, verify_ms = _timing_split(ms)
    base = [m.raw.get("server") or {} for m in index.used(CellKey(key.host, baseline, key.task))]
    per_pass = [sv["predicted_ms"] / sv["predicted_n"] for sv in base
                if sv.get("predicted_ms") and sv.get("predicted_n")]
    return Decomposition(key, speedup, tpp, rate, rounds, cause, accepted / drafted if drafted else None, offered,
                         share, verify_ms, statistics.median(per_pass) if per_pass and share is not None else None)


def _timing_split(ms: list[Measurement]) -> tuple[float | None, float | None]:
    """Median draft share of the decode time and median verifying pass (ms), from the server's per-type
    `dur(b,g,a)` (trace level); None without them. Only fresh containers: a reused server's counters add up over
    its requests."""
    shares, verify = [], []
    for m in ms:
        r = m.raw
        stats = (r.get("server_log") or {}).get("statistics") or {}
        durs = [s["dur_ms"] for s in stats.values() if isinstance(s, dict) and isinstance(s.get("dur_ms"), dict)]
        decode_ms = (r.get("server") or {}).get("predicted_ms")
        predicted = (r.get("server") or {}).get("predicted_n")
        if not durs or not decode_ms or not predicted or m.protocol != "fresh-container":
            continue
        draft_ms = sum(float(d.get(x) or 0.0) for d in durs for x in ("begin", "draft", "accept"))
        passes = predicted - m.accepted
        if passes <= 0 or draft_ms > decode_ms:
            continue
        shares.append(draft_ms / decode_ms)
        verify.append((decode_ms - draft_ms) / passes)
    if not shares:
        return None, None
    return statistics.median(shares), statistics.median(verify)


def as_dict(d: Decomposition) -> shapes.DecompositionJson:
    """What summary.json keeps of a decomposition."""
    def factor(f: Factor) -> shapes.FactorJson:
        iv = f.interval
        # six places: the two factors of a small pass rate still multiply back to the speedup's four
        return {"estimate": round(f.estimate, 6), "low": None if iv.low is None else round(iv.low, 6),
                "high": None if iv.high is None else round(iv.high, 6), "n": iv.n}
    return {"host": d.key.host, "strategy": d.key.strategy, "task": d.key.task, "speedup": round(d.speedup, 4),
            "tokens_per_pass": factor(d.tokens_per_pass), "pass_rate": factor(d.pass_rate), "rounds": d.rounds,
            "cause": d.cause.value, "acceptance": None if d.acceptance is None else round(d.acceptance, 4),
            "offered_tokens_per_pass": round(d.offered_tokens_per_pass, 3),
            "step_cost_passes": round(d.step_cost, 3),
            "draft_share": None if d.draft_share is None else round(d.draft_share, 4),
            "verify_pass_ms": None if d.verify_pass_ms is None else round(d.verify_pass_ms, 4),
            "baseline_pass_ms": None if d.baseline_pass_ms is None else round(d.baseline_pass_ms, 4)}
