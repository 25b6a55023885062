"""From a run folder's records to the sweep and serving figures: which setting (harness/analysis/sweep.py) and
for how many users (harness/analysis/serving.py). Reads run.json (typed) and the records; the statistics are in
those two modules, which take plain numbers, and in the speedup table (harness/analysis/speedups.py), whose
figures a sweep shows.

Selection and confirmation rounds are kept apart (`split`): the run's tables describe the selection rounds (the
planned ones and --until's), the sweep's confirmation rounds have a table of their own, so no figure mixes the
rounds that chose a combination with the rounds that confirm it.

A run without a sweep or several concurrency levels adds nothing to its summary."""

from __future__ import annotations

import math
from collections import defaultdict

from harness import formatter as fm
from harness.analysis import serving, sweep
from harness.analysis import speedups as sp
from harness.analysis.records import CellIndex, CellKey
from harness.analysis.speedups import paired_logs
from harness.store import result, shapes
from harness.store.runmeta import RunMeta, StrategyMeta


def swept(meta: RunMeta) -> dict[str, list[StrategyMeta]]:
    """The swept entries of a run: family -> its combinations at the entry's lowest level (at least two)."""
    out: dict[str, list[StrategyMeta]] = defaultdict(list)
    for s in meta.planned_strategies():
        if s.sweep:
            out[s.family_id].append(s)
    lowest = {f: min(s.parallel for s in ss) for f, ss in out.items()}
    out = {f: [s for s in ss if s.parallel == lowest[f]] for f, ss in out.items()}
    return {f: ss for f, ss in out.items() if len(ss) > 1}


def confirmed(meta: RunMeta, host: str, members: list[str]) -> list[str]:
    """The combinations of one sweep the run confirmed on a host, best first (as the run chose them)."""
    cells = [c for x in meta.plan.extra_rounds if x.confirms for c in x.cells]
    return list(dict.fromkeys(c[1] for c in cells if c[0] == host and c[1] in members))


def sweep_ratios(index: CellIndex, host: str, members: list[tuple[str, str | None]],
                 tasks: list[str]) -> sweep.Ratios:
    """Per combination (id, its baseline), per task, per round: the paired speedup against the baseline (the
    measurements that count, each prompt paired with itself in the round; harness/analysis/speedups.py)."""
    return {sid: {t: {r: math.exp(v) for r, v in paired_logs(index, CellKey(host, sid, t), base).items()}
                  for t in tasks} for sid, base in members if base}


def split(meta: RunMeta, index: CellIndex) -> tuple[CellIndex, CellIndex | None]:
    """A run's records in its selection rounds (the planned ones and --until's), and in the sweep's confirmation
    rounds (None without any)."""
    first = meta.plan.confirm_from()
    if first is None:
        return index, None
    return (CellIndex([m for m in index.measurements if m.round < first]),
            CellIndex([m for m in index.measurements if m.round >= first]))


def figures(table: sp.SpeedupTable | None, host: str) -> sweep.Figures:
    """Every strategy's figures on a host from a speedup table: per task, and over tasks (None). Where no task has
    the rounds a geometric mean needs, the figure over tasks is the mean of the tasks' log estimates without an
    interval (the table prints none), so a sweep of two rounds still has an order."""
    out: dict[str, dict[str | None, sweep.Figure]] = defaultdict(dict)
    if table is None:
        return out
    for s in [*table.cells.values(), *table.geomeans]:
        if s.host == host:
            iv = s.interval
            out[s.strategy][s.task] = sweep.Figure(s.estimate, iv.low, iv.high, iv.n)
    for figs in out.values():
        tasks = [f for t, f in figs.items() if t is not None and f.estimate]
        if (figs.get(None) is None or figs[None].estimate is None) and tasks:
            figs[None] = sweep.Figure(math.exp(sum(math.log(f.estimate) for f in tasks) / len(tasks)), None, None,
                                      min(f.rounds for f in tasks))
    return out


def sweep_results(meta: RunMeta, index: CellIndex) -> list[sweep.SweepResult]:
    """Every swept entry on every host: the selections from its rounds, with the figures of the selection rounds'
    speedup table, and the confirmation after them, with those of the confirmation rounds' own table."""
    sweeps = swept(meta)
    if not sweeps:
        return []
    selection, confirmation = split(meta, index)
    bases = {s.id: s.baseline for s in meta.planned_strategies()}
    chosen, confirming = sp.table(selection, bases), sp.table(confirmation, bases) if confirmation else None
    out = []
    tasks = meta.plan.tasks
    for host in meta.plan.hosts:
        for family, members in sweeps.items():
            ratios = sweep_ratios(index, host, [(s.id, s.baseline) for s in members], tasks)
            out.append(sweep.analyse(family, host, ratios, tasks, meta.plan.confirm_from(), figures(chosen, host),
                                     figures(confirming, host), confirmed(meta, host, [s.id for s in members])))
    return out


def sample(r: result.ResultRecord, speculative: bool) -> serving.Sample:
    """One record as a serving sample: N streams, aggregate and per-stream rates, latencies, and whether every slot
    speculated (GET /slots) and the streams drafted."""
    conc = r.get("concurrency")
    client = r["client"]
    if conc:
        agg, per, ttft = conc["aggregate_tok_s"], conc["per_stream_tok_s"], conc.get("ttft_s") or [client["ttft_s"]]
        itl, drafted = conc, sum(conc.get("draft_n") or [r["server"]["draft_n"]])
    else:
        n = (r.get("output") or {}).get("n_tokens") or r["server"].get("predicted_n") or 0
        wall = client.get("request_s") or 0
        agg, per, ttft, itl, drafted = (n / wall if wall else 0.0), [client["decode_tok_s"]], [client["ttft_s"]], \
            client, r["server"]["draft_n"]
    spec = None
    if speculative:  # the server's word (GET /slots) where it gave it, else the drafts themselves
        slots = [x for x in (r.get("slots") or {}).get("speculative") or [] if x is not None]
        spec = all(slots) if slots else bool(drafted)
    return serving.Sample(r["strategy"], conc["streams"] if conc else 1, int(r["round"]),
                          f"{r['task']}/{r['prompt']}", float(agg), tuple(x for x in per if x),
                          tuple(x for x in ttft if x is not None), itl.get("itl_p50_s"), itl.get("itl_p99_s"), spec)


def levels_of(meta: RunMeta) -> dict[str, list[StrategyMeta]]:
    """Entries measured at more than one concurrency level: family -> its members by level."""
    by: dict[str, list[StrategyMeta]] = defaultdict(list)
    for s in meta.planned_strategies():
        by[s.family_id].append(s)
    return {f: ss for f, ss in by.items() if len({s.parallel for s in ss}) > 1}


def serving_results(meta: RunMeta, index: CellIndex) -> list[shapes.ServingJson]:
    """Per host, when a baseline was measured at several levels: the curve of every strategy entry measured at
    N clients (a sweep by its confirmed winner, from the confirmation rounds alone, else by its best), and where
    batching overtakes each speculative one."""
    multi = levels_of(meta)
    bases = [f for f, ss in multi.items() if not ss[0].speculative]
    if not bases:
        return []
    results = sweep_results(meta, index)
    winners = {r.family: (r.confirmation.winner if r.confirmation else r.overall.best if r.overall else None)
               for r in results}
    confirmed_families = {r.family for r in results if r.confirmation}
    confirm_rounds = sorted({x.round for x in meta.plan.extra_rounds if x.confirms})
    out = []
    for host in meta.plan.hosts:
        by: dict[str, list[result.ResultRecord]] = defaultdict(list)
        for key, ms in index.usable.items():
            if key.host == host:
                by[key.strategy] += [m.raw for m in ms]
        families: dict[str, list[StrategyMeta]] = defaultdict(list)
        for s in meta.planned_strategies():
            if not s.speculative and s.baseline is not None:  # an A/A control, a model on its own target
                continue
            if s.sweep and (w := winners.get(s.family_id)) and dict(s.sweep) != dict(meta.strategy(w).sweep):
                continue  # a sweep is drawn by its winner's values, at every level measured
            families[s.family_id].append(s)
        # a confirmed winner's figures come from the confirmation rounds alone: the sweep's rounds chose it
        fresh = {f for f in families if f in confirmed_families and confirm_rounds}
        for f in fresh:
            for s in families[f]:
                by[s.id] = [r for r in by[s.id] if int(r["round"]) in confirm_rounds]
        curves = {f: [serving.point([sample(r, s.speculative) for r in by[s.id]]) for s in ss if by[s.id]]
                  for f, ss in families.items()}
        curves = {f: pts for f, pts in curves.items() if pts}
        crossings = []
        rounds: dict[str, list[int]] = {}
        for base in bases:
            base_model = multi[base][0].model
            base_samples = {s.parallel: [sample(r, False) for r in by[s.id]] for s in multi[base]}
            for f, ss in families.items():
                if not ss[0].speculative or ss[0].model != base_model:
                    continue
                spec = {s.parallel: [sample(r, True) for r in by[s.id]] for s in ss}
                name = ss[0].id if len(ss) == 1 else f
                crossings.append(serving.crossover(name, base, spec, base_samples))
                if f in fresh:
                    rounds[name] = confirm_rounds
        out.append({"host": host, "curves": {f: [p.as_dict() for p in pts] for f, pts in curves.items()},
                    "crossovers": [c.as_dict() for c in crossings], "confirmation_rounds": rounds})
    return out


def summary(meta: RunMeta, index: CellIndex) -> shapes.Tuning:
    """The summary's `sweeps` and `serving` parts; empty for a run with neither."""
    out: shapes.Tuning = {}
    sweeps = sweep_results(meta, index)
    if sweeps:
        out["sweeps"] = [s.as_dict() | {"values": {c: [list(p) for p in meta.strategy(c).sweep]
                                                   for c in s.combinations}} for s in sweeps]
        out["rules_sweep"] = SWEEP_RULE
        first = meta.plan.confirm_from()
        if first is not None:
            out["confirmation_rounds"] = sorted({x.round for x in meta.plan.extra_rounds if x.confirms})
            out["selection_rounds"] = sorted({m.round for m in index.measurements if m.round < first})
    curves = serving_results(meta, index)
    if curves:
        out["serving"] = curves
        out["rules_serving"] = SERVING_RULE
    return out


SWEEP_RULE = ("per combination its speedup as the speedup table gives it (same estimate and 95% interval), from the "
              "selection rounds alone; each combination is compared with the best round by round (two-sided t-test "
              "on the log ratio of the two), p-values Holm-adjusted over the sweep (family-wise error "
              f"{fm.pct(sweep.ALPHA)}): a combination is worse than the best when its adjusted p lies below that, else "
              "not distinguishable from it. The best two are then measured again in fresh confirmation rounds, "
              "whose figures come from a table of those rounds alone: the best of many noisy combinations is biased "
              "upward, the confirmation is not. A winner is named only when the best two are distinguishable: in "
              "the confirmation rounds when the 95% interval of the one over the other, paired by round, excludes "
              "1; without them when the runner-up is worse than the best")
SERVING_RULE = ("N clients at once against one fresh server with N slots; aggregate tok/s = all streams' tokens / "
                "wall time from the first request sent to the last token (95% Student-t interval over rounds); "
                "per-stream latency = 1 / the stream's decode rate (time per output token); speculation counts at N "
                "when GET /slots says every slot speculates and the streams drafted; batching overtakes speculation "
                "at the first N where aggregate(speculation at N, or its highest level below N) / aggregate(baseline "
                "at N), paired by round and prompt, has its 95% interval below 1; it does not overtake it at N only "
                "where that interval lies above 1, and at every other N it is not shown either way; a sweep's "
                "confirmed winner is compared in the confirmation rounds alone, which measure it and its baseline "
                "at every concurrency level of their entries")
