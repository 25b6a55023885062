"""A task's speedup with its prompts as the sampling unit: an interval for prompts like these.

A cell's interval (harness/analysis/speedups.py) is for these prompts: the prompts are fixed and only the rounds
vary. A suite's category is a sample of the prompts it stands for, so beside it comes an interval in which the
prompts are random and the rounds are nested within prompts: each prompt's paired log ratio is its mean over the
rounds it was measured in (strategy and baseline on that prompt, same host, same round), and the category's
estimate is the mean of the prompts' means, with a t-interval on k - 1 degrees of freedom from their spread over the
k prompts (the two-stage estimator of a balanced nested design: that spread holds the prompts' own variance and the
rounds' noise divided by the rounds, which is exactly the variance of a prompt's mean). A category of one prompt has
no such interval: it generalises to no other prompt. bench/prompt_coverage.py checks the coverage by simulation.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from harness import formatter as fm
from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis import words
from harness.analysis.records import CellIndex, CellKey
from harness.store import shapes
from harness.store.runmeta import RunMeta

#: How run.json names a suite's question (harness/intake/suites.py record_name): `<suite file>#<question_id>`.
_SUITE_PROMPT = re.compile(r"[^#]+#[A-Za-z0-9_-]{1,64}")


def prompt_logs(index: CellIndex, key: CellKey, baseline: str) -> dict[str, float]:
    """Per prompt, the mean over its paired rounds of log(strategy tok/s / baseline tok/s) (a prompt's median
    where a round holds several records of it, as the cell's own pairing does)."""
    s = _by_prompt_round(index, key)
    b = _by_prompt_round(index, CellKey(key.host, baseline, key.task))
    per: dict[str, list[float]] = defaultdict(list)
    for pr in sorted(s.keys() & b.keys()):
        per[pr[0]].append(math.log(s[pr] / b[pr]))
    return {p: statistics.fmean(v) for p, v in per.items()}


def _by_prompt_round(index: CellIndex, key: CellKey) -> dict[tuple[str, int], float]:
    by: dict[tuple[str, int], list[float]] = defaultdict(list)
    for m in index.used(key):
        by[(m.prompt, m.round)].append(float(m.tok_s))
    return {k: statistics.median(v) for k, v in by.items()}


def like_these(logs: dict[str, float]) -> inf.Estimate | None:
    """The mean of the prompts' mean log ratios as a sample of prompts (inf.between: s/sqrt(k), k - 1 df); None
    below two prompts."""
    return inf.between(list(logs.values()))


@dataclass(frozen=True)
class PromptSample:
    """A cell's speedup over prompts like these: its estimate and 95% interval, and how many prompts it rests on
    (one: no interval, it generalises nothing)."""

    prompts: int
    estimate: float | None
    interval: inf.Interval | None

    @property
    def generalises(self) -> bool:
        return self.prompts >= 2 and self.interval is not None and self.interval.available


def of_cell(index: CellIndex, key: CellKey, baseline: str, rounds: int) -> PromptSample:
    """A cell's sample of prompts; no interval below MIN_ROUNDS paired rounds (the kit's rule for any interval;
    bench/prompt_coverage.py checked 3 and 5)."""
    logs = prompt_logs(index, key, baseline)
    est = like_these(logs) if rounds >= sp.MIN_ROUNDS else None
    return PromptSample(len(logs), math.exp(est.estimate) if est is not None else
                        (math.exp(next(iter(logs.values()))) if logs else None),
                        inf.Interval.of(est) if est is not None else None)


#: The half-width (as a fraction) the power sentence says how many prompts per category would reach.
POWER_TARGET = 0.10
MAX_PROMPTS_SAID = 1000


def prompts_needed(spread: float, target: float = POWER_TARGET) -> int | None:
    """The fewest prompts per category whose interval for prompts like these has a half-width of at most
    log(1 + target) when the prompts' mean log speedups spread by `spread` (sd): t(k - 1) x spread / sqrt(k);
    None beyond MAX_PROMPTS_SAID. bench/prompt_coverage.py --power checks it by simulation."""
    goal = math.log1p(target)
    for k in range(2, MAX_PROMPTS_SAID + 1):
        if inf._t_isf(0.025, k - 1) * spread / math.sqrt(k) <= goal:
            return k
    return None


def power(logs: list[dict[str, float]]) -> shapes.CategoryPower | None:
    """What the design could show: the median over cells of the prompts' spread (sd of their mean log speedups),
    the median prompts per category, and the prompts a category would need for a ±POWER_TARGET interval at that
    spread; None without a cell of two prompts."""
    spreads = [statistics.stdev(v.values()) for v in logs if len(v) >= 2]
    if not spreads:
        return None
    sd = statistics.median(spreads)
    k = int(statistics.median(len(v) for v in logs))
    half = math.expm1(inf._t_isf(0.025, k - 1) * sd / math.sqrt(k)) if k >= 2 else None
    return {"spread": fm.rounded(sd, 4), "prompts": k, "half_width": fm.rounded(half, 4), "target": POWER_TARGET,
            "prompts_needed": prompts_needed(sd)}


def suite_tasks(meta: RunMeta) -> list[str]:
    """The run's tasks that are a prompt suite's categories (`<suite>.<category>`, every prompt a suite question)."""
    return [t.id for t in meta.tasks if t.id in meta.plan.tasks and "." in t.id
            and all(_SUITE_PROMPT.fullmatch(p.file) for p in t.prompts)]


def note(ps: PromptSample) -> str:
    """How the interval for prompts like these was made, or why there is none."""
    if ps.prompts < 2:
        return (f"{ps.prompts} prompt: its speedup is about that prompt alone and generalises to no other prompt of "
                "the category")
    if ps.interval is None:
        return f"{ps.prompts} prompts, too few paired rounds for an interval (needs {sp.MIN_ROUNDS})"
    return (f"{ps.prompts} prompts: t-interval of the mean of the prompts' mean log speedups (rounds nested within "
            f"prompts) from their spread over prompts (t, {ps.prompts - 1} df): prompts like these, not only these")


def _interval(iv: inf.Interval | None, scope: str, text: str) -> shapes.IntervalJson | None:
    if iv is None:
        return None
    return {"low": fm.rounded(iv.low, 4), "high": fm.rounded(iv.high, 4), "n": iv.n, "method": iv.method,
            "df": fm.rounded(iv.df, 1), "moderated": iv.moderated, "note": text, "scope": scope}


def summary(meta: RunMeta, index: CellIndex, baselines: Mapping[str, str | None], table: sp.SpeedupTable
            ) -> tuple[list[shapes.CategoryJson], shapes.CategoryPower | None]:
    """Per suite category and strategy with a baseline: the cell's speedup and interval for these prompts (what the
    table marks) beside the interval for prompts like these (not marked: no test is made of it)."""
    out: list[shapes.CategoryJson] = []
    every: list[dict[str, float]] = []
    tasks = suite_tasks(meta)
    order = {sid: i for i, sid in enumerate(meta.plan.strategies)}
    # category by category in the suite's order, each with its strategies in the plan's
    keys = sorted((k for k in table.cells if k.task in tasks and baselines.get(k.strategy)),
                  key=lambda k: (meta.plan.hosts.index(k.host) if k.host in meta.plan.hosts else 0,
                                 tasks.index(k.task), order.get(k.strategy, len(order))))
    for key in keys:
        cell, base = table.cells[key], baselines[key.strategy]
        if cell.n >= sp.MIN_ROUNDS:
            every.append(prompt_logs(index, key, base))
        ps = of_cell(index, key, base, cell.n)
        suite, _, category = key.task.partition(".")
        out.append({"host": key.host, "strategy": key.strategy, "task": key.task, "suite": suite,
                    "category": category, "prompts": ps.prompts,
                    "speedup": fm.rounded(cell.estimate, 4),
                    "these_prompts": _interval(cell.interval, "these prompts", words.interval_note(cell.interval)),
                    "verdict": cell.verdict.value,
                    "like_these_speedup": fm.rounded(ps.estimate, 4) if ps.generalises else None,
                    "like_these": _interval(ps.interval, "prompts like these", note(ps)) if ps.generalises
                    else None,
                    "note": note(ps)})
    return out, power(every)
