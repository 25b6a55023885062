"""`invoke compare A B`: two runs judged on what transfers between machines — per host and cell, the paired
speedups with their intervals (reproduces / differs / inconclusive, harness/analysis/reproduction.py), the
deterministic fingerprint, and the absolute tok/s ratio, shown but never judged. "not comparable" when the two
runs measured different things (model files, llama.cpp source, backend, flags), each difference named by field. A
run of several builds is compared build by build (each strategy is measured on its own build, and each build's
source is a fact of its own); the difference between two builds inside one run is that run's result (its report),
never a failed reproduction.

`compare` returns a typed Comparison; its `as_dict` is compare.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.analysis import breakeven, lossless, stats, tuning, words, workload
from harness.analysis import inference as inf
from harness.analysis import reproduction as repro
from harness.analysis.records import CellIndex
from harness.store import result, shapes
from harness.store.rundir import RunDir
from harness.store.runmeta import RunMeta


@dataclass(frozen=True)
class Fact:
    """One thing a run's numbers depend on. `blocking`: when it differs, the runs measured different things."""

    field: str
    value: Any
    blocking: bool


def facts(meta: RunMeta) -> dict[str, Fact]:
    """What a run measured with, keyed by field name (each build's by its name in a run of several builds)."""
    out = []
    for name, record in meta.build_records().items():
        at = f" (build {name})" if name else ""
        src = record.source
        out += [Fact(f"llama.cpp commit{at}", src.get("commit"), True),
                Fact(f"llama.cpp source{at}", src.get("sha256") or src.get("commit") or src.get("content_sha256"),
                     True),
                Fact(f"backend{at}", record.backend, True),
                Fact(f"cmake flags{at}", " ".join(record.plan["cmake_args"]), True)]
    out += [Fact(f"model {key} sha256", m.sha256, True) for key, m in sorted(meta.models.items())]
    for host, e in sorted(meta.environment.items()):
        hw = ", ".join(str(x) for x in (e.cpu_model, e.cpus, *e.gpu_names()))
        out.append(Fact(f"hardware ({host})", hw, False))
    return {f.field: f for f in out}


def differences(meta_a: RunMeta, meta_b: RunMeta) -> list[tuple[str, Any, Any, bool]]:
    """(field, A's value, B's value, blocking) for every fact that differs; hardware compared as a whole."""
    a, b = facts(meta_a), facts(meta_b)
    out = []
    for name in dict.fromkeys([*a, *b]):
        if name.startswith("hardware"):
            continue
        fa, fb = a.get(name), b.get(name)
        va, vb = (fa.value if fa else None), (fb.value if fb else None)
        if va != vb:
            out.append((name, va, vb, (fa or fb).blocking))
    hw_a = sorted(str(f.value) for f in a.values() if f.field.startswith("hardware"))
    hw_b = sorted(str(f.value) for f in b.values() if f.field.startswith("hardware"))
    if hw_a != hw_b:
        out.append(("hardware", "; ".join(hw_a), "; ".join(hw_b), False))
    return out


def host_pairs(hosts_a: list[str], hosts_b: list[str]) -> list[tuple[str, str]]:
    """Hosts of A matched with hosts of B: by label where they share labels, else in order."""
    common = [h for h in hosts_a if h in hosts_b]
    return [(h, h) for h in common] if common else list(zip(hosts_a, hosts_b, strict=False))


def _relabel(records: list[result.ResultRecord], pairs: list[tuple[str, str]]) -> list[result.ResultRecord]:
    """B's records under A's host labels, so cells match host by host."""
    to_a = {hb: ha for ha, hb in pairs}
    return [{**r, "host": to_a[r["host"]]} for r in records if r["host"] in to_a]


def _stats(meta: RunMeta, records: list[result.ResultRecord]) -> stats.RunStats:
    """A run's statistics as its report has them: the selection rounds (a sweep's confirmation rounds apart)."""
    selection, _ = tuning.split(meta, CellIndex(records))
    return stats.analyze(selection, {s.id: s.baseline for s in meta.planned_strategies()}, meta.protocol)


def _interval(iv: inf.Interval | None) -> shapes.ShortInterval | None:
    return None if iv is None or not iv.available else {"low": round(iv.low, 4), "high": round(iv.high, 4),
                                                        "n": iv.n}


def _fingerprint_words(r: repro.Row) -> str:
    fa, fb = r.fingerprint_a, r.fingerprint_b
    if fa is None or fb is None or r.fingerprint is repro.Match.MISSING:
        return "no runs in one of the two"
    if r.fingerprint is repro.Match.IDENTICAL:
        return words.drafts(fa)
    parts = []
    if set(fa.drafts) != set(fb.drafts):
        parts.append(f"A {words.drafts(fa)}; B {words.drafts(fb)}")
    if set(fa.outputs) != set(fb.outputs):
        parts.append("outputs differ")
    return "; ".join(parts)


@dataclass(frozen=True)
class RunRef:
    """One side of a comparison: the run's id, where it was read, its hosts."""

    run_id: str
    path: str
    hosts: list[str]


@dataclass(frozen=True)
class Difference:
    """A fact the two runs measured with that differs; `blocking`: they measured different things; `kind`:
    "environment" (build, models, hardware) or "workload" (what was asked of the server: workload.py)."""

    field: str
    a: Any
    b: Any
    blocking: bool
    kind: str = "environment"


@dataclass(frozen=True)
class Comparison:
    """B judged against A (harness/analysis/reproduction.py), with what the two runs measured with: the call, the
    rows in A's plan order and the one-line verdict. `as_dict` is compare.json."""

    a: RunRef
    b: RunRef
    differences: list[Difference]
    reproduction: repro.Reproduction
    rows: list[repro.Row]
    host_b: dict[str, str]  # A's host label -> B's
    torn_last_line: tuple[str, ...] = ()  # "A" / "B": whose measurements.jsonl ends in a line cut short
    distribution: shapes.StudyComparison | None = None  # the sampling studies side by side (lossless.compare)
    shared: tuple[int, int] = (0, 0)  # (B's records that are A's, B's records)

    @property
    def same_records(self) -> bool:
        """Whether B's records are all A's (a run compared with itself, or a copy of it)."""
        return self.shared[1] > 0 and self.shared[0] == self.shared[1]

    @property
    def blocking(self) -> list[str]:
        return [d.field for d in self.differences if d.blocking] + (["records"] if self.same_records else [])

    @property
    def comparable(self) -> bool:
        return not self.blocking

    @property
    def call(self) -> repro.Call:
        return repro.Call.NOT_COMPARABLE if self.blocking else self.reproduction.call

    @property
    def geomeans(self) -> list[repro.Row]:
        return self.reproduction.geomeans

    @property
    def margin(self) -> float:
        return self.reproduction.margin

    @property
    def cell_margin(self) -> float:
        return self.reproduction.cell_margin

    @property
    def verdict(self) -> str:
        if self.same_records:
            out = (f"not a reproduction: B's records are A's (the same {self.shared[1]} measurements of run "
                   f"{self.a.run_id}); a run compared with itself confirms nothing")
        elif self.blocking:
            out = "not comparable: the runs measured different things (" + ", ".join(self.blocking) + ")"
        else:
            out = words.headline(self.reproduction)
        changed = self.distribution["changed"] if self.distribution else 0
        if changed:
            out += (f"; {changed} distribution verdict{'s' if changed > 1 else ''} changed "
                    "(lossless in distribution, below)")
        missing = len((self.distribution or {}).get("missing") or [])
        if missing:
            out += (f"; {missing} distribution verdict{'s' if missing > 1 else ''} only one run has "
                    "(lossless in distribution, below)")
        return out

    def row_call(self, r: repro.Row) -> repro.Call:
        """A row's call; every judged row is "not comparable" when the runs measured different things."""
        if self.blocking and r.call not in (repro.Call.MISSING, repro.Call.BASELINE):
            return repro.Call.NOT_COMPARABLE
        return r.call

    def row_rule(self, r: repro.Row) -> str:
        if self.row_call(r) is repro.Call.NOT_COMPARABLE:
            return "B's records are A's" if self.same_records else "different " + " / ".join(self.blocking)
        return words.row_rule(r)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[self.row_call(r).value] = out.get(self.row_call(r).value, 0) + 1
        return out

    def _row_dict(self, r: repro.Row) -> shapes.ComparedCell:
        return {"host": r.host, "host_b": self.host_b.get(r.host), "strategy": r.strategy, "task": r.task,
                "speedup_a": r.speedup_a, "interval_a": _interval(r.interval_a), "speedup_b": r.speedup_b,
                "interval_b": _interval(r.interval_b), "ratio": r.ratio, "ratio_interval": _interval(r.interval),
                "margin": r.margin, "verdict": self.row_call(r).value, "rule": self.row_rule(r),
                "p_within": r.p_within, "p_outside": r.p_outside, "p_adjusted": r.p_adjusted,
                "fingerprint": r.fingerprint.value, "fingerprint_detail": _fingerprint_words(r),
                "tok_s_ratio": r.tok_s_ratio, "tok_s_ratio_note": "hardware- and state-dependent",
                "tasks": list(r.tasks)}

    def as_dict(self) -> shapes.CompareJson:
        """compare.json."""
        rep = self.reproduction
        worst = rep.worst
        return {"a": self.a.__dict__, "b": self.b.__dict__,
                "differences": [d.__dict__ for d in self.differences], "comparable": self.comparable,
                "shared_records": list(self.shared),
                "rows": [self._row_dict(r) for r in self.rows], "geomeans": [self._row_dict(g) for g in self.geomeans],
                "counts": self.counts(), "call": self.call.value, "verdict": self.verdict, "margin": rep.margin,
                "cell_margin": rep.cell_margin, "estimator": rep.method, "family": rep.family,
                "smallest_margin": rep.smallest_margin, "cell_smallest_margin": rep.cell_smallest_margin,
                "rounds_needed": rep.rounds_needed, "cell_rounds_needed": rep.cell_rounds_needed,
                "unresolved": len(rep.unresolved), "torn_last_line": list(self.torn_last_line),
                "worst": None if worst is None else {"host": worst.host, "strategy": worst.strategy,
                                                     "task": worst.task, "ratio": worst.ratio,
                                                     "ratio_interval": _interval(worst.interval)},
                "distribution": self.distribution}


def compare(dir_a, dir_b, margin: float = repro.REPRODUCE_MARGIN, cell_margin: float | None = None) -> Comparison:
    """Judge B against A per cell on what transfers between machines: the B/A ratio of the paired speedups with its
    interval against ±cell margin (default twice the margin) and each strategy's geometric mean against ±margin
    (reproduces / differs / inconclusive; differs judged as one family), the deterministic fingerprint (draft
    counts and output hashes), and the absolute tok/s ratio, labelled hardware- and state-dependent and never
    judged."""
    ra, rb = RunDir.open(dir_a), RunDir.open(dir_b)
    (ma, recs_a), (mb, recs_b) = (breakeven.split(rd.read_meta(), rd.measurements()) for rd in (ra, rb))
    diffs = [Difference(*d) for d in differences(ma, mb)]
    both = [s for s in ma.plan.strategies if s in mb.plan.strategies]
    diffs += [Difference(p.field, p.a, p.b, True, "workload") for p in workload.differences(
        workload.properties(ma, recs_a), workload.properties(mb, recs_b), both,
        [t for t in ma.plan.tasks if t in mb.plan.tasks])]
    pairs = host_pairs(ma.plan.hosts, mb.plan.hosts)
    rep = repro.reproduction(_stats(ma, recs_a), _stats(mb, _relabel(recs_b, pairs)), margin, cell_margin)
    at = {field: {x: i for i, x in enumerate(xs)} for field, xs in
          (("host", ma.plan.hosts), ("strategy", ma.plan.strategies), ("task", ma.plan.tasks))}
    rows = sorted(rep.rows, key=lambda r: tuple(at[f].get(getattr(r, f), len(at[f]))
                                                for f in ("host", "strategy", "task")))  # A's plan order
    return Comparison(RunRef(ma.run_id, str(dir_a), ma.plan.hosts), RunRef(mb.run_id, str(dir_b), mb.plan.hosts),
                      diffs, rep, rows, dict(pairs),
                      tuple(x for x, rd in (("A", ra), ("B", rb)) if rd.torn_last_line),
                      lossless.compare(_study(ma, ra), _study(mb, rb), {hb: ha for ha, hb in pairs}),
                      workload.same_records(recs_a, recs_b))


def _study(meta: RunMeta, rd: RunDir) -> shapes.StudySummary | None:
    """A run's sampling study judged (harness/analysis/lossless.py), None without one."""
    return lossless.summary(meta.plan.distribution, rd.samples(), meta.plan.hosts,
                            {s.id: (s.spec_type, s.args) for s in meta.strategies})
