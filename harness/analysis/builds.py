"""One run of several llama.cpp builds: each later build against the first, strategy by strategy.

Every build's strategies are cells of one plan, shuffled together in the same rounds, so a build's effect is
paired by round like a strategy's: for the same strategy, task and prompt in the same round, on the same host,

- B/A of tok/s: build B's decode rate over build A's. What the build did to throughput, the machine's drift of
  the round cancelled.
- B/A of speedup: B's paired speedup (over B's baseline in that round) over A's paired speedup (over A's
  baseline in that round). What the build did to speculation itself, its effect on plain decoding cancelled.

Each is estimated per cell like a speedup (harness/analysis/speedups.py `table_of`: moderated intervals, the
cells of a printed table and its geometric means over tasks one family under Holm's procedure), so "not
significant" is an answer here too. Beside them, the deterministic fingerprint per build: at temperature 0 the
same request gives the same output on one build; a build whose output differs from the first build's for the same
strategy and prompt changed it, and a baseline that differs means the build changed greedy decoding itself.

Reads the run's typed run.json and its CellIndex; a run of one build has no such section (None)."""

from __future__ import annotations

from collections.abc import Mapping

from harness import formatter as fm
from harness.analysis import checks, words
from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis.records import CellIndex, CellKey, Measurement
from harness.intake.builds import across
from harness.store import shapes
from harness.store.buildrecord import BuildRecord
from harness.store.runmeta import RunMeta, StrategyMeta

RULE = ("B/A of tok/s: the same strategy, task and prompt on build B over build A in the same round on the same "
        "host (paired: the round's drift cancels). B/A of speedup: B's speedup over its own baseline in that round "
        "over A's speedup over A's baseline in that round (the build's effect on plain decoding cancels). Each cell "
        "is the geometric mean over rounds with a 95% interval; the marks of one printed table, cells and geometric "
        "means over tasks alike, are judged as one family with Holm's procedure (▲ B higher, ▼ B lower, ≈ within "
        "±2%, · not significant, ? too few rounds).")


#: The llama.cpp build whose server behaviour the kit's fixed sentences were measured on (/work/shared/DESIGN.md:
#: acceptance by draft position at trace level only, exact-match verification by default).
MEASURED_BUILD = 11434


def build_names(meta: RunMeta) -> list[str]:
    """The run's builds as llama.cpp names them ('b11434'), in the run's order, each once."""
    return list(dict.fromkeys(f"b{r.source.get('build_number')}" for r in meta.build_records().values()))


def measured_on(names: list[str]) -> str:
    """Which build a fact of the server was measured on, said against the run's own builds: 'this run's build
    (b11434)' where they are the one measured, else the measured build with the run's named as not checked."""
    measured = f"b{MEASURED_BUILD}"
    if names == [measured]:
        return f"this run's build ({measured})"
    others = [n for n in names if n != measured]
    return f"{measured} (where the kit measured it; not checked on this run's {', '.join(others)})"


def source_text(record: BuildRecord) -> str:
    """A build record's source in a few words: llama.cpp build, commit, and where the tree came from."""
    src = record.source
    kind = src.get("kind")
    where = (f"sdist {src.get('package')}=={src.get('version')} (sha256 {str(src.get('sha256', ''))[:12]})"
             if kind == "sdist" else f"git {src.get('repo')} {str(src.get('commit', ''))[:12]}" if kind == "git"
             else "local folder")
    return f"llama.cpp b{src.get('build_number')} ({src.get('commit')}), {where}"


def summary(meta: RunMeta, index: CellIndex) -> shapes.BuildsJson | None:
    """The builds part of a run's summary: each build's image and source, and each later build against the first
    (tok/s and speedup tables, output changes); None for a run of one build."""
    names = list(meta.builds)
    if len(names) < 2:
        return None
    reference = names[0]
    return {"reference": reference,
            "builds": [{"name": n, "tag": r.tag, "image_id": r.image_id, "source": source_text(r),
                        "cmake_args": [a for a in r.plan["cmake_args"]
                                       if not a.startswith(("-DLLAMA_BUILD_NUMBER", "-DLLAMA_BUILD_COMMIT"))],
                        "strategies": [s.id for s in meta.planned_strategies() if s.build == n]}
                       for n, r in meta.builds.items()],
            "comparisons": [compare(meta, index, reference, b) for b in names[1:]],
            "rule": RULE}


def pairs(meta: RunMeta, a: str, b: str) -> list[tuple[str, StrategyMeta, StrategyMeta]]:
    """(name across builds, A's strategy, B's strategy) of every planned strategy measured on both builds."""
    planned = meta.planned_strategies()
    on_b = {across(s.id, b): s for s in planned if s.build == b}
    return [(key, s, on_b[key]) for s in planned if s.build == a and (key := across(s.id, a)) in on_b]


def paired(meta: RunMeta, index: CellIndex, a: str, b: str
           ) -> tuple[dict[CellKey, dict[int, float]], dict[CellKey, dict[int, float]], dict[str, str]]:
    """Per cell (named across builds) and round: log of B's tok/s over A's, and log of B's speedup over A's; with
    each cell's A strategy (what `table_of` calls its baseline)."""
    ps = pairs(meta, a, b)
    hosts, tasks = meta.plan.hosts, meta.plan.tasks
    tok_logs: dict[CellKey, dict[int, float]] = {}
    speed_logs: dict[CellKey, dict[int, float]] = {}
    for host in hosts:
        for key, sa, sb in ps:
            for t in tasks:
                k = CellKey(host, key, t)
                tok_logs[k] = sp.paired_logs(index, CellKey(host, sb.id, t), sa.id)
                if sa.baseline and sb.baseline:
                    la = sp.paired_logs(index, CellKey(host, sa.id, t), sa.baseline)
                    lb = sp.paired_logs(index, CellKey(host, sb.id, t), sb.baseline)
                    speed_logs[k] = {r: lb[r] - la[r] for r in sorted(lb.keys() & la.keys())}
    return tok_logs, speed_logs, {key: sa.id for key, sa, _ in ps}


def compare(meta: RunMeta, index: CellIndex, a: str, b: str) -> shapes.BuildComparison:
    """Build b against build a: B/A of tok/s and of speedup per strategy and task (and over tasks), and where
    the output changed."""
    ps = pairs(meta, a, b)
    hosts, tasks = meta.plan.hosts, meta.plan.tasks
    tok_logs, speed_logs, against = paired(meta, index, a, b)
    tok = sp.table_of(tok_logs, against, hosts)
    speed = sp.table_of(speed_logs, against, hosts)
    names = {key: (sa.id, sb.id) for key, sa, sb in ps}
    return {"build": b, "against": a,
            "tok_s": _table(tok, names), "speedup": _table(speed, names),
            "output": outputs(index, hosts, ps, tasks, a, b)}


def _table(t: sp.SpeedupTable, names: Mapping[str, tuple[str, str]]) -> shapes.BuildTable:
    return {"cells": [_figure(s, names) for s in t.cells.values()],
            "geomeans": [_figure(g, names) for g in t.geomeans],
            "family": {"cells": len([c for c in t.cells.values() if c.judgement.family]),
                       "geomeans": len([g for g in t.geomeans if g.judgement.family]), "tests": t.family_size,
                       "method": "holm", "alpha": inf.ALPHA, "power": _power(t.power())}}


def _power(pw: sp.Power) -> shapes.BuildPower:
    """What a builds table's rounds could mark: the B/A below which a cell of median noise is marked ▼ (▲ above the
    reciprocal) about half the time (speedups.half_marked); bench/builds_power.py checks it by simulation."""
    return {"rounds": pw.rounds, "cells_below": fm.rounded(1 / pw.half, 4) if pw.half else None,
            "sentence": words.builds_power(pw)}


def _figure(s: sp.Speedup, names: Mapping[str, tuple[str, str]]) -> shapes.BuildFigure:
    iv = s.interval
    j = s.judgement
    return {"host": s.host, "strategy": s.strategy, "a": names[s.strategy][0], "b": names[s.strategy][1],
            "task": s.task, "estimate": fm.rounded(s.estimate, 4), "rounds": iv.n,
            "interval": {"low": fm.rounded(iv.low, 4), "high": fm.rounded(iv.high, 4), "n": iv.n, "method": iv.method,
                         "df": fm.rounded(iv.df, 1),
                         "moderated": iv.moderated, "note": words.interval_note(iv)},
            "verdict": {"kind": j.verdict.value, "p_differs": fm.rounded(j.p_differs, 6),
                        "p_within": fm.rounded(j.p_within, 6),
                        "p_adjusted": fm.rounded(j.p_adjusted, 6), "family": j.family,
                        "family_interval": None if (fi := s.family_interval()) is None or not fi.available
                        else fi.bounds()},
            **({"tasks": list(s.tasks), "left_out": list(s.left_out)} if s.task is None else {})}


def _first_ok(ms: list[Measurement], prompt: str) -> list[Measurement]:
    return [m for m in ms if m.ok and m.prompt == prompt]


def _divergence(a: Measurement, b: Measurement) -> shapes.BuildDivergence:
    """Where B's output leaves A's: the first divergent token and, where A's record has its top-2 probabilities
    (a baseline's), A's margin there and its rank among the narrowest (harness/analysis/checks.py)."""
    v = checks.determinism(a.raw["output"], b.raw["output"], a.raw.get("probs"))
    d = v.data
    return {"first_divergent_token": d.get("first_divergent_token"), "margin": d.get("margin"),
            "margin_rank": d.get("margin_rank"),
            "sentence": v.sentence.replace("baseline top-2 margin", f"{a.strategy}'s top-2 margin")}


def outputs(index: CellIndex, hosts: list[str], ps: list[tuple[str, StrategyMeta, StrategyMeta]],
            tasks: list[str], a: str, b: str) -> shapes.OutputChanges:
    """Per strategy, prompt by prompt: are B's outputs (and draft counts) at temperature 0 those of A? A
    baseline whose output differs means build b changed greedy decoding itself."""
    rows = []
    for host in hosts:
        for key, sa, sb in ps:
            row: shapes.OutputRow = {"host": host, "strategy": key, "speculative": sa.spec_type != "none", "prompts": 0,
                   "outputs_identical": 0, "drafts_identical": 0, "changed": []}
            for t in tasks:
                ma, mb = index.of(CellKey(host, sa.id, t)), index.of(CellKey(host, sb.id, t))
                for prompt in dict.fromkeys(m.prompt for m in ma):
                    oa, ob = _first_ok(ma, prompt), _first_ok(mb, prompt)
                    if not oa or not ob:
                        continue
                    row["prompts"] += 1
                    same = {m.output_sha for m in oa} == {m.output_sha for m in ob}
                    row["outputs_identical"] += same
                    row["drafts_identical"] += {(m.drafted, m.accepted) for m in oa} == \
                        {(m.drafted, m.accepted) for m in ob}
                    if not same:
                        row["changed"].append({"task": t, "prompt": prompt, **_divergence(oa[0], ob[0]),
                                               "tokens": (ob[0].raw.get("output") or {}).get("n_tokens")})
            rows.append(row)
    greedy = [r for r in rows if not r["speculative"] and r["prompts"]]
    changed = sum(len(r["changed"]) for r in greedy)
    compared = sum(r["prompts"] for r in greedy)
    if not compared:
        sentence = f"no baseline measured on both {a} and {b}: greedy output not compared"
    elif changed:
        sentence = (f"build {b} changes the greedy output: the baseline's output differs from build {a}'s on "
                    f"{changed} of {compared} prompts")
    else:
        sentence = (f"build {b} gives build {a}'s greedy output: the baseline's output is identical on {compared} "
                    f"of {compared} prompts")
    return {"rows": rows, "greedy_changed": changed, "greedy_compared": compared, "sentence": sentence}


def changed_builds(section: shapes.BuildsJson | None) -> list[str]:
    """The builds that changed the greedy output (their baseline's output differs from the first build's)."""
    if not section:
        return []
    return [c["build"] for c in section["comparisons"] if c["output"]["greedy_changed"]]
