"""Acceptance looked at closely: by draft position, request by request in a reused server (the cache trap), and
between hosts, backends or builds that ran the same strategy on the same files (parity).

By position. For a speculative cell, the share of draft calls whose first k drafted tokens were all accepted, for
k = 1..n (the server's own definition: its `acc per pos` line divides by every verification step). From the
record's `spec_counters` (the server's own counters, GET /metrics before and after the request: harness/run/
metrics.py; every backend, any log level), else from its `server_log.draft_calls` (each call's accepted length,
counted from the server's per-call lines, printed with LLAMA_TRACE set: harness/run/server.py), else from the
server's `acc per pos` line (trace level, -lv 4: the GPU backends' servers) weighted by the request's calls;
records with none of these (the CPU backend's before the counters and the per-call lines) have only the
server's mean accepted length per call, and are said to.

Request by request. In a `--reuse-server` run every request of a strategy goes to one server, in round order:
per server, each request's draft counts, acceptance and tok/s by its index, with the same prompt's figures from
fresh containers where a fresh run of the same manifest is in the same report.

Parity. The same strategy (spec type and arguments) on the same model files, prompt, length and sampling, in
several settings: a host, a backend, a build (a record naming its own build is keyed by it, else its run's build).
Acceptance at temperature 0 is a property of the files and the arithmetic: run to run it repeats, so a difference
between settings beyond the run-to-run spread is a finding (the same GGUF accepting 41% on one backend and 92% on
another), not noise. Paired by round and prompt where both settings are in one run; by prompt across runs."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from harness.analysis import inference as inf
from harness.analysis.records import CellIndex, Measurement
from harness.store import result, shapes
from harness.store.runmeta import RunMeta

# ---------------------------------------------------------------- by position

#: Where per-position figures came from.
CALLS, SERVER_SHARES, COUNTERS = "draft calls", "server's acc per pos", "server's counters"


@dataclass
class Positions:
    """Acceptance by draft position of some measurements, pooled over their draft calls."""

    calls: int = 0
    reach: list[float] = field(default_factory=list)  # reach[k-1]: calls with at least k accepted
    accepted_hist: list[int] = field(default_factory=list)  # per-call lines only: calls with exactly i accepted
    requests: int = 0  # measurements with per-position figures
    without: int = 0  # speculative measurements without them
    sources: set[str] = field(default_factory=set)
    mean_lens: list[float] = field(default_factory=list)  # the server's mean accepted length, per request

    @property
    def shares(self) -> list[float]:
        """Share of calls whose first k drafted tokens were all accepted, k = 1..n."""
        return [r / self.calls for r in self.reach] if self.calls else []

    def add(self, m: Measurement) -> None:
        sl = m.raw.get("server_log") or {}
        counted = counters(m)
        if counted is not None:  # the server's own counts of this request: every backend, any log level
            if counted["drafts"]:
                self.mean_lens.append(1 + counted["accepted"] / counted["drafts"])
                self._reach([float(x) for x in counted["accepted_per_pos"]], counted["drafts"])
                self.sources.add(COUNTERS)
            elif m.drafted:
                self.without += 1
            return
        mean_len = (sl.get("draft_acceptance") or {}).get("mean_len")
        if isinstance(mean_len, int | float):
            self.mean_lens.append(float(mean_len))
        calls = sl.get("draft_calls")
        if isinstance(calls, dict) and calls.get("calls"):
            hist = [int(x) for x in calls["accepted"]]
            longest = max(len(hist), len(calls.get("drafted") or [])) - 1  # positions drafted, accepted or not
            self._reach([sum(hist[k:]) for k in range(1, longest + 1)], int(calls["calls"]))
            self.accepted_hist.extend([0] * (len(hist) - len(self.accepted_hist)))
            for i, x in enumerate(hist):
                self.accepted_hist[i] += x
            self.sources.add(CALLS)
            return
        steps = _steps(m)
        per_pos = sl.get("acc_per_pos")
        if isinstance(per_pos, list) and per_pos and steps:
            self._reach([float(x) * steps for x in per_pos], steps)
            self.sources.add(SERVER_SHARES)
            return
        if m.drafted:
            self.without += 1

    def _reach(self, reach: list[float], calls: int) -> None:
        self.reach.extend([0.0] * (len(reach) - len(self.reach)))
        for i, x in enumerate(reach):
            self.reach[i] += x
        self.calls += calls
        self.requests += 1


def counters(m: Measurement) -> result.SpecCounters | None:
    """The request's own counters (GET /metrics before and after it) where the record has them."""
    c = m.raw.get("spec_counters")
    return c if isinstance(c, dict) and isinstance(c.get("drafts"), int) else None  # type: ignore[return-value]


def _steps(m: Measurement) -> int | None:
    """The request's verification steps (draft calls): the server's statistics in a fresh container (its counters
    cover this request alone), else from its mean accepted length (1 + accepted / steps)."""
    counted = counters(m)
    if counted is not None and counted["drafts"]:
        return counted["drafts"]
    sl = m.raw.get("server_log") or {}
    spec = str(m.raw.get("spec_type", ""))
    st = (sl.get("statistics") or {}).get(spec) or {}
    if m.protocol == "fresh-container" and isinstance(st.get("calls_accept"), int) and st["calls_accept"] > 0:
        return int(st["calls_accept"])
    mean_len = (sl.get("draft_acceptance") or {}).get("mean_len")
    if isinstance(mean_len, int | float) and mean_len > 1 and m.accepted:
        return round(m.accepted / (mean_len - 1))
    return None


def positions(index: CellIndex, speculative: set[str]) -> dict[tuple[str, str, str | None], Positions]:
    """Per speculative cell (host, strategy, task) and per strategy over its tasks (task None), from the
    measurements that count."""
    out: dict[tuple[str, str, str | None], Positions] = {}
    for key in index.keys:
        if key.strategy not in speculative:
            continue
        for k in ((key.host, key.strategy, key.task), (key.host, key.strategy, None)):
            pos = out.setdefault(k, Positions())
            for m in index.used(key):
                pos.add(m)
    return out


def positions_dict(p: Positions) -> shapes.PositionCounts:
    """What summary.json keeps of per-position figures."""
    return {"calls": p.calls, "shares": [round(x, 4) for x in p.shares], "accepted_hist": p.accepted_hist,
            "requests": p.requests, "requests_without": p.without, "sources": sorted(p.sources),
            "mean_len": _describe(p.mean_lens)}


def _describe(xs: list[float]) -> shapes.MeanLen:
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None}
    return {"n": len(xs), "median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3)}


# ---------------------------------------------------------------- request by request


def request_rows(index: CellIndex, speculative: set[str]) -> list[shapes.ServerRequest]:
    """A reused server's requests in the order it served them: per server (container), the index of each request
    and its figures. Speculative strategies only (the cache trap is in the drafts)."""
    servers: dict[tuple[str, str], list[Measurement]] = defaultdict(list)
    for m in index.measurements:  # in execution order
        if m.strategy in speculative:
            servers[(m.host, str(m.raw.get("container_id") or m.id))].append(m)
    out = []
    for n, ((host, _), ms) in enumerate(servers.items(), start=1):
        for i, m in enumerate(ms, start=1):
            out.append({"server": n, "host": host, "strategy": m.strategy, "index": i, "task": m.task,
                        "prompt": m.prompt, "ok": m.ok, **_figures([m])})
    return out


def _figures(ms: list[Measurement]) -> shapes.RequestFigures:
    ok = [m for m in ms if m.measured]
    drafted = [m.drafted for m in ok]
    accepted = [m.accepted for m in ok]
    return {"drafted": _median(drafted), "accepted": _median(accepted),
            "acceptance": round(sum(accepted) / sum(drafted), 4) if sum(drafted) else None,
            "tok_s": _median([float(m.tok_s) for m in ok if m.tok_s is not None]),
            "drafted_range": [min(drafted), max(drafted)] if drafted else None}


def _median(xs: list[float] | list[int]) -> float | None:
    return round(float(statistics.median(xs)), 3) if xs else None


def prompt_figures(index: CellIndex, speculative: set[str]) -> list[shapes.PromptFigures]:
    """Per speculative strategy, task and prompt: the median draft counts and tok/s over the runs that count (what
    a reused server's requests are held against)."""
    by: dict[tuple[str, str, str, str], list[Measurement]] = defaultdict(list)
    for key in index.keys:
        if key.strategy in speculative:
            for m in index.used(key):
                by[(key.host, key.strategy, key.task, m.prompt)].append(m)
    return [{"host": h, "strategy": s, "task": t, "prompt": p, "runs": len(ms), **_figures(ms)}
            for (h, s, t, p), ms in by.items()]


# ---------------------------------------------------------------- parity


class What(NamedTuple):
    """What must be the same for two acceptances to be compared: the strategy, the files, the prompt, the length,
    the sampling."""

    spec_type: str
    args: tuple[str, ...]
    parallel: int
    target: str
    draft: str
    task: str
    prompt: str
    n_predict: int
    endpoint: str
    sampling: str


class Where(NamedTuple):
    """A setting acceptance can differ between: the host, the backend, the llama.cpp build."""

    host: str
    backend: str
    build: str


@dataclass
class Unit:
    """One measurement's acceptance, with what it measured and where."""

    what: What
    where: Where
    run: str
    round: int
    acceptance: float
    strategy: str


def build_of(meta: RunMeta, rec: result.ResultRecord | Any) -> str:
    """A record's build: its own (a run over several builds names each record's), else its run's image's."""
    own = rec.get("build") if hasattr(rec, "get") else None
    if isinstance(own, str) and own:
        return own
    if isinstance(own, dict) and own:
        return str(own.get("id") or own.get("commit") or own.get("tag") or sorted(own.items()))
    src = meta.build.source
    return f"b{src['build_number']} ({src.get('commit')})" if src.get("build_number") else str(src.get("commit", "?"))


def units(meta: RunMeta, index: CellIndex) -> list[Unit]:
    """The run's acceptances as parity units, from the measurements that count (fresh containers only: a reused
    server's acceptance carries its earlier requests)."""
    if meta.protocol != "fresh-container":
        return []
    backend = meta.build.backend
    prompts = {(t.id, p.id): (p.sha256, t.n_predict) for t in meta.tasks for p in t.prompts}
    sampling = meta.sampling.words()

    def sha(model: str | None) -> str:
        return (meta.models[model].sha256 if model in meta.models else model) if model else "-"

    out = []
    for key in index.keys:
        s = meta.strategy(key.strategy)
        if not s.speculative:
            continue
        for m in index.used(key):
            if not m.drafted:
                continue
            prompt, n_predict = prompts.get((m.task, m.prompt), (m.prompt, 0))
            what = What(s.spec_type, tuple(s.args), s.parallel, sha(s.model), sha(s.draft), m.task, prompt,
                        n_predict, meta.endpoint, sampling)
            out.append(Unit(what, Where(m.host, backend, build_of(meta, m.raw)), meta.run_id, m.round,
                            m.accepted / m.drafted, m.strategy))
    return out


@dataclass(frozen=True)
class Parity:
    """Acceptance of one strategy on one task in two settings (A, B), B - A with its 95% interval."""

    strategy: str
    task: str
    a: Where
    b: Where
    runs_a: tuple[str, ...]
    runs_b: tuple[str, ...]
    acceptance_a: float
    acceptance_b: float
    difference: float
    low: float | None
    high: float | None
    paired: bool
    units: int  # rounds (paired) or prompts (unpaired) the difference stands on
    p_differs: float | None
    differs: bool = False  # beyond noise, Holm over the report's comparisons


def parity(all_units: list[Unit]) -> list[Parity]:
    """Every pair of settings that ran the same strategy and files on the same task, compared (see the module
    docstring); judged as one family (Holm)."""
    groups: dict[tuple[Any, ...], dict[Where, list[Unit]]] = defaultdict(lambda: defaultdict(list))
    for u in all_units:
        w = u.what
        groups[(w.spec_type, w.args, w.parallel, w.target, w.draft, w.task, w.n_predict, w.endpoint,
                w.sampling)][u.where].append(u)
    found: list[Parity] = []
    for settings in groups.values():
        wheres = sorted(settings)
        for i, a in enumerate(wheres):
            for b in wheres[i + 1:]:
                p = _compare(settings[a], settings[b], a, b)
                if p is not None:
                    found.append(p)
    adjusted = inf.holm_adjusted([p.p_differs if p.p_differs is not None else 1.0 for p in found])
    return [Parity(**{**p.__dict__, "differs": p.p_differs is not None and adj <= inf.ALPHA})
            for p, adj in zip(found, adjusted, strict=True)]


def _compare(ua: list[Unit], ub: list[Unit], a: Where, b: Where) -> Parity | None:
    by_a = _by_prompt(ua)
    by_b = _by_prompt(ub)
    common = sorted(by_a.keys() & by_b.keys())
    if not common:
        return None
    runs_a = tuple(sorted({u.run for u in ua}))
    runs_b = tuple(sorted({u.run for u in ub}))
    paired = runs_a == runs_b and len(runs_a) == 1
    est = _paired(ua, ub, common) if paired else _unpaired(by_a, by_b, common)
    mean_a = statistics.fmean(statistics.fmean(u.acceptance for u in by_a[p]) for p in common)
    mean_b = statistics.fmean(statistics.fmean(u.acceptance for u in by_b[p]) for p in common)
    low = high = p_differs = None
    if est is not None and est.testable:
        low, high = est.interval()
        p_differs = est.p_differs()
    units = (est.n if est is not None else 0) if paired else len(common)
    return Parity(ua[0].strategy, ua[0].what.task, a, b, runs_a, runs_b, mean_a, mean_b, mean_b - mean_a, low, high,
                  paired, units, p_differs)


def _by_prompt(us: list[Unit]) -> dict[str, list[Unit]]:
    out: dict[str, list[Unit]] = defaultdict(list)
    for u in us:
        out[u.what.prompt].append(u)
    return out


def _paired(ua: list[Unit], ub: list[Unit], prompts: list[str]) -> inf.Estimate | None:
    """One run: per round the mean over prompts of B - A, each prompt with itself in the same round."""
    at = {(u.round, u.what.prompt): u.acceptance for u in ua}
    bt = {(u.round, u.what.prompt): u.acceptance for u in ub}
    per: dict[int, list[float]] = defaultdict(list)
    for rp in sorted(at.keys() & bt.keys()):
        if rp[1] in prompts:
            per[rp[0]].append(bt[rp] - at[rp])
    loc = inf.locate([statistics.fmean(v) for v in per.values()])
    return None if loc is None or loc.n < 2 else inf.moderate(loc, inf.NO_PRIOR)


def _unpaired(by_a: dict[str, list[Unit]], by_b: dict[str, list[Unit]], prompts: list[str]) -> inf.Estimate | None:
    """Across runs: per prompt B's mean acceptance minus A's, each with its own run-to-run spread; the mean over
    prompts. None when a side has a single run of a prompt (no spread to judge by)."""
    diffs = []
    for p in prompts:
        la = inf.locate([u.acceptance for u in by_a[p]])
        lb = inf.locate([u.acceptance for u in by_b[p]])
        if la is None or lb is None or la.n < 2 or lb.n < 2:
            return None
        diffs.append(inf.difference(inf.moderate(lb, inf.NO_PRIOR), inf.moderate(la, inf.NO_PRIOR)))
    return inf.combine(diffs)


def parity_dict(p: Parity) -> shapes.ParityJson:
    def r(x: float | None) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, 4)
    return {"strategy": p.strategy, "task": p.task, "a": p.a._asdict(), "b": p.b._asdict(), "runs_a": list(p.runs_a),
            "runs_b": list(p.runs_b), "acceptance_a": r(p.acceptance_a), "acceptance_b": r(p.acceptance_b),
            "difference": r(p.difference), "low": r(p.low), "high": r(p.high), "paired": p.paired, "units": p.units,
            "p_differs": r(p.p_differs), "differs": p.differs}


def speculative_ids(meta: RunMeta) -> set[str]:
    return {s.id for s in meta.strategies if s.speculative}
