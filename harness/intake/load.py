"""The `load:` block of a manifest: serving under load as `vllm bench serve` asks it. Offered request rates (req/s)
or `sweep` (GuideLLM's: synchronous, throughput, then rates between), Poisson or gamma arrivals with a burstiness,
seeded; requests per level or a duration; a concurrency cap; the server's slots; SLOs. Prompts are drawn seeded from
the manifest's tasks: the same sequence for every strategy at a level and round.

The block is untrusted: every number is typed and bounded here, and a wrong one is one line naming the file and the
field (`manifests/x.yaml: load.rates[0]: -1: expected ...`). The schema only says the block is a mapping."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from harness import formatter as fm
from harness.intake import builds
from harness.intake.bounded_yaml import ManifestError

#: Offered rates the kit accepts, in requests per second (above 0).
MAX_RATE = 1000.0
MAX_RATES = 20
MAX_REQUESTS = 10_000  # per level
MAX_TOTAL_REQUESTS = 200_000  # every arm, level and round of the study together
MAX_DURATION_S = 3600.0
MAX_WARMUP = 100
MAX_CONCURRENCY = 1024
MAX_SLOTS = 64  # harness/intake/sweep.py's bound on --parallel
MAX_ROUNDS = 50
MAX_SLO_MS = 3_600_000.0
MAX_BURSTINESS = 100.0
MAX_SEED = 2**32 - 1
#: `rates: sweep`: how many rates between the synchronous and the throughput level.
DEFAULT_SWEEP_RATES = 4
MAX_SWEEP_RATES = 10
DEFAULT_WARMUP = 2
#: The estimate of a server's start, load and stop per level when nothing better is known (seconds).
START_ESTIMATE_S = 10.0
ARRIVALS = ("poisson", "gamma")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")
KEYS = {"rates", "sweep_rates", "arrivals", "burstiness", "seed", "requests", "duration_s", "warmup",
        "max_concurrency", "slots", "strategies", "tasks", "rounds", "slo"}


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in milliseconds (None: not given); a request meets them when it meets every one."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def given(self) -> dict[str, float]:
        return {k: v for k in SLO_KEYS if (v := getattr(self, k)) is not None}

    def words(self) -> str:
        g = self.given()
        return ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {fm.plain(v)} ms" for k, v in g.items()) or "none"


@dataclass(frozen=True)
class LoadStudy:
    """A manifest's load study, checked: which strategies at which slot counts, which rates, how many requests."""

    rates: tuple[float, ...] | None  # None: `sweep`
    sweep_rates: int
    arrivals: str
    burstiness: float
    seed: int
    requests: int | None  # per level; None: `duration_s` decides
    duration_s: float | None
    warmup: int
    max_concurrency: int | None
    slots: tuple[int, ...]
    strategies: tuple[str, ...]
    prompts: tuple[tuple[str, str], ...]  # (task, prompt) pairs the requests are drawn from
    rounds: int
    slo: Slo

    @property
    def sweep(self) -> bool:
        return self.rates is None

    def level_names(self) -> list[str]:
        """Each level's name: the offered rate, or for a sweep `synchronous`, `throughput` and the rates between."""
        if self.rates is not None:
            return [fm.plain(r) for r in self.rates]
        return ["synchronous", "throughput", *(f"between-{i + 1}" for i in range(self.sweep_rates))]

    def requests_at(self, rate: float | None) -> int:
        """Timed requests at one level (warm-up excluded): the count given, else the duration at the rate (the
        expected count; a synchronous or throughput level of a duration study sends what the rates between do at
        their highest)."""
        if self.requests is not None:
            return self.requests
        assert self.duration_s is not None
        return max(1, min(MAX_REQUESTS, math.ceil(self.duration_s * (rate or 1.0))))

    def seconds_at(self, rate: float | None) -> float | None:
        """The sending time of one level at an offered rate (None: the level's time depends on the server)."""
        if rate is None:
            return None
        return (self.requests_at(rate) + self.warmup) / rate


def _num(value: Any, fp: str, where: str, what: str, low: float, high: float, *, low_open: bool = True,
         whole: bool = False) -> float:
    """A bounded number from untrusted YAML: a bool, a string, NaN or infinity is not one."""
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (whole and not isinstance(value, int)):
        raise ManifestError(f"{where}: load.{fp}: {fm.visible(repr(value), 60)}: expected {kind} of {what}")
    if not math.isfinite(value) or value > high or (value <= low if low_open else value < low):
        bound = f"above {fm.plain(low)}" if low_open else f"at least {fm.plain(low)}"
        raise ManifestError(f"{where}: load.{fp}: {fm.visible(repr(value), 60)}: expected {kind} of {what} {bound} "
                            f"and at most {fm.plain(high)}")
    return value


def _names(value: Any, fp: str, where: str, known: Sequence[str]) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > 200:
        raise ManifestError(f"{where}: load.{fp}: expected a list of 1 to 200 names")
    for i, x in enumerate(value):
        if not isinstance(x, str) or x not in known:
            raise ManifestError(f"{where}: load.{fp}[{i}]: {fm.visible(repr(x), 80)}: expected one of "
                                f"{list(known)[:40]}")
    return list(dict.fromkeys(value))


def parse(block: Any, strategies: Sequence[Any], tasks: Sequence[Any], runs: int, where: str) -> LoadStudy:
    """The `load:` block resolved against the manifest's strategies (its entries at one slot, each run at every
    slot count of the block) and tasks (every prompt of the tasks named, default all); one line per problem."""
    if not isinstance(block, Mapping):
        raise ManifestError(f"{where}: load: expected a mapping")
    unknown = sorted(str(k) for k in block if k not in KEYS)
    if unknown:
        raise ManifestError(f"{where}: load.{fm.visible(unknown[0], 60)}: unknown field (expected one of "
                            f"{sorted(KEYS)})")
    raw_rates = block.get("rates", "sweep")
    rates: tuple[float, ...] | None
    if raw_rates == "sweep":
        rates = None
    elif isinstance(raw_rates, list) and 1 <= len(raw_rates) <= MAX_RATES:
        rates = tuple(float(_num(r, f"rates[{i}]", where, "requests per second", 0, MAX_RATE))
                      for i, r in enumerate(raw_rates))
        if len(set(rates)) != len(rates):
            raise ManifestError(f"{where}: load.rates: each rate once (got {list(rates)})")
        rates = tuple(sorted(rates))
    else:
        raise ManifestError(f"{where}: load.rates: {fm.visible(repr(raw_rates), 60)}: expected `sweep` or a list of "
                            f"1 to {MAX_RATES} rates in requests per second")
    sweep_rates = int(_num(block.get("sweep_rates", DEFAULT_SWEEP_RATES), "sweep_rates", where,
                           "rates between", 1, MAX_SWEEP_RATES, low_open=False, whole=True))
    arrivals = block.get("arrivals", "poisson")
    if arrivals not in ARRIVALS:
        raise ManifestError(f"{where}: load.arrivals: {fm.visible(repr(arrivals), 60)}: expected one of "
                            f"{list(ARRIVALS)}")
    burstiness = float(_num(block.get("burstiness", 1.0), "burstiness", where, "gamma shape", 0, MAX_BURSTINESS))
    if arrivals == "poisson" and burstiness != 1.0:
        raise ManifestError(f"{where}: load.burstiness: {fm.plain(burstiness)}: Poisson arrivals have burstiness 1; "
                            "expected `arrivals: gamma` for another")
    seed = int(_num(block.get("seed", 0), "seed", where, "a seed", 0, MAX_SEED, low_open=False, whole=True))
    if ("requests" in block) == ("duration_s" in block):
        raise ManifestError(f"{where}: load: expected one of `requests` (per level) or `duration_s`, not "
                            + ("both" if "requests" in block else "neither"))
    requests = duration = None
    if "requests" in block:
        requests = int(_num(block["requests"], "requests", where, "requests per level", 1, MAX_REQUESTS,
                            low_open=False, whole=True))
    else:
        duration = float(_num(block["duration_s"], "duration_s", where, "seconds per level", 0, MAX_DURATION_S))
        if rates is not None and max(rates) * duration > MAX_REQUESTS:
            raise ManifestError(f"{where}: load.duration_s: {fm.plain(duration)} s at {fm.plain(max(rates))} req/s is "
                                f"more than {fm.count(MAX_REQUESTS)} requests per level")
    warmup = int(_num(block.get("warmup", DEFAULT_WARMUP), "warmup", where, "warm-up requests", 0, MAX_WARMUP,
                      low_open=False, whole=True))
    cap = block.get("max_concurrency")
    cap = None if cap is None else int(_num(cap, "max_concurrency", where, "requests in flight", 1,
                                            MAX_CONCURRENCY, low_open=False, whole=True))
    raw_slots = block.get("slots", [1])
    raw_slots = [raw_slots] if isinstance(raw_slots, int) and not isinstance(raw_slots, bool) else raw_slots
    if not isinstance(raw_slots, list) or not 1 <= len(raw_slots) <= 8:
        raise ManifestError(f"{where}: load.slots: expected a slot count or a list of 1 to 8 (--parallel N)")
    slots = tuple(sorted({int(_num(n, f"slots[{i}]", where, "slots", 1, MAX_SLOTS, low_open=False, whole=True))
                          for i, n in enumerate(raw_slots)}))
    # the manifest's strategies at one slot (a sweep's combination by its id); the block gives the slot counts
    one = [s for s in strategies if s.parallel == 1]
    # an entry listed on several builds is named by its entry's name (`baseline`, not `baseline[build=b]`)
    entries = list(dict.fromkeys(builds.across(s.id, s.build) for s in one))
    eligible = list(dict.fromkeys([*entries, *(s.id for s in one)]))
    default = list(dict.fromkeys(builds.across(s.id, s.build) for s in one if one and s.build == one[0].build))
    names = _names(block.get("strategies", default), "strategies", where, eligible)
    chosen = _on_one_build(names, one, where)
    names = [s.id for s in chosen]
    if chosen[0].speculative:
        raise ManifestError(f"{where}: load.strategies[0]: {chosen[0].id!r}: expected the baseline (spec_type none) "
                            "first: every other strategy is judged against it")
    task_ids = _names(block.get("tasks", [t.id for t in tasks]), "tasks", where, [t.id for t in tasks])
    prompts = tuple((t.id, p.id) for t in tasks if t.id in task_ids for p in t.prompts)
    rounds = int(_num(block.get("rounds", runs), "rounds", where, "rounds", 1, MAX_ROUNDS, low_open=False, whole=True))
    raw_slo = block.get("slo", {})
    if not isinstance(raw_slo, Mapping) or any(k not in SLO_KEYS for k in raw_slo):
        bad = next((str(k) for k in raw_slo if k not in SLO_KEYS), "") if isinstance(raw_slo, Mapping) else ""
        raise ManifestError(f"{where}: load.slo{'.' + fm.visible(bad, 40) if bad else ''}: expected a mapping of "
                            f"{list(SLO_KEYS)} in milliseconds")
    slo = Slo(**{k: float(_num(v, f"slo.{k}", where, "milliseconds", 0, MAX_SLO_MS)) for k, v in raw_slo.items()})
    study = LoadStudy(rates, sweep_rates, arrivals, burstiness, seed, requests, duration, warmup, cap, slots,
                      tuple(names), prompts, rounds, slo)
    total = total_requests(study)
    if total > MAX_TOTAL_REQUESTS:
        raise ManifestError(f"{where}: load: {fm.count(total)} requests in all (strategies × slots × levels × rounds "
                            f"× (requests + warm-up)); at most {fm.count(MAX_TOTAL_REQUESTS)}")
    return study


def _on_one_build(names: Sequence[str], one: Sequence[Any], where: str) -> list[Any]:
    """The strategies the names give, all on one build (a load study's servers run one build; the first build that
    every name has, in the manifest's order); ManifestError when the names share no build."""
    found = [[s for s in one if s.id == n or builds.across(s.id, s.build) == n] for n in names]
    order = list(dict.fromkeys(s.build for s in one))
    shared = [b for b in order if all(any(s.build == b for s in f) for f in found)]
    if not shared:
        on = {n: sorted({str(s.build) for s in f}) for n, f in zip(names, found, strict=True)}
        raise ManifestError(f"{where}: load.strategies: the strategies share no build ({fm.visible(str(on), 200)}): "
                            "a load study measures every strategy on one build")
    return [next(s for s in f if s.build == shared[0]) for f in found]


def arms(study: LoadStudy, strategies: Sequence[Any]) -> list[Any]:
    """Each strategy of the study at each slot count: the manifest's strategy with `parallel` set (its server gets
    --parallel N and N times the context, harness/run/server.py), id `<id>@<N>` where the study has several slot
    counts."""
    out = []
    for n in study.slots:
        for sid in study.strategies:
            s = next(x for x in strategies if x.id == sid)
            out.append(replace(s, parallel=n, id=arm_id(sid, n, study)))
    return out


def arm_id(sid: str, slots: int, study: LoadStudy) -> str:
    return f"{sid}@{slots}" if len(study.slots) > 1 else sid


def total_requests(study: LoadStudy) -> int:
    """Every request the study sends, warm-up included."""
    levels = len(study.level_names())
    per = [study.requests_at(r) for r in (study.rates or [None] * levels)]
    return len(study.strategies) * len(study.slots) * study.rounds * sum(p + study.warmup for p in per)


def describe(study: LoadStudy, start_s: float = START_ESTIMATE_S) -> list[str]:
    """`invoke validate`'s lines: each arm's levels, requests and an estimated time (sending time plus a server's
    start per level; a sweep's synchronous and throughput levels take what the server needs, named as unknown)."""
    names = study.level_names()
    rates = study.rates or [None] * len(names)
    per_arm = sum(study.requests_at(r) + study.warmup for r in rates) * study.rounds
    known = sum(s for r in rates if (s := study.seconds_at(r)) is not None) * study.rounds
    arm_s = known + start_s * len(names) * study.rounds
    n_arms = len(study.strategies) * len(study.slots)
    how = (f"{fm.count(study.requests)} requests per level" if study.requests is not None
           else f"{fm.plain(study.duration_s or 0)} s per level")
    arrivals = "Poisson" if study.arrivals == "poisson" else f"gamma (burstiness {fm.plain(study.burstiness)})"
    lines = [f"load study: {n_arms} arm(s) ({len(study.strategies)} strategies × slots "
             f"{', '.join(str(n) for n in study.slots)}), {len(names)} level(s), {study.rounds} round(s); {how}, "
             f"{study.warmup} warm-up request(s) per level not counted; {arrivals} arrivals, seed {study.seed}; "
             f"one fresh server per strategy, level and round; SLOs: {study.slo.words()}"
             + (f"; at most {study.max_concurrency} in flight" if study.max_concurrency else "")]
    levels = ", ".join(names) + (" req/s" if study.rates is not None else
                                 " (the rates between come from the baseline's synchronous and throughput levels)")
    for n in study.slots:
        for sid in study.strategies:
            lines.append(f"  {arm_id(sid, n, study):24} --parallel {n}: levels {levels}; {fm.count(per_arm)} requests; "
                         f"about {fm.fixed(arm_s / 60, 1)} min"
                         + (" plus the synchronous and throughput levels" if study.sweep else ""))
    lines.append(f"  in all: {fm.count(total_requests(study))} requests, about {fm.fixed(arm_s * n_arms / 60, 1)} min"
                 + (" plus the synchronous and throughput levels" if study.sweep else "")
                 + f" (sending time, and {fm.plain(start_s)} s per server start; a level past what its slots serve "
                   "takes longer to drain)")
    return lines
