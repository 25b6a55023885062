"""An honest winner of a sweep: the best combination with its figure, the combinations not distinguishable from
it (family-controlled), the confirmation rounds that measure the best two again, and a winner named only where
the best two are distinguishable.

Pure functions of plain numbers: per combination, per task, per round, the paired speedup against the baseline
(the strategy's tok/s over the baseline's on the same task, prompt and host in the same round). A round is a
block: every combination ran in it beside the same baseline, so two combinations are compared round by round
and whatever the machine did to the round cancels.

- Figures: each combination's speedup per task and over tasks is the speedup table's (harness/analysis/
  speedups.py), passed in: the selection rounds' table for the sweep, a table of the confirmation rounds alone
  for the confirmation. A figure has one interval wherever the report prints it, and selection and confirmation
  rounds never share a figure.
- Not distinguishable from the best: each other combination against the best, paired by round (a two-sided
  one-sample t-test on the per-round log ratio of the two, scipy.stats.ttest_1samp), the p-values adjusted with
  Holm's step-down method over the family of comparisons (harness/analysis/inference.py, as the speedup table's
  verdicts). Holm, not Benjamini-Hochberg (scipy.stats.false_discovery_control offers only BH and BY): the claim
  made is about a set (these combinations are worse than the best; the others may be as good), and a wrong
  exclusion anywhere in it is the error to bound, so the family-wise error rate is the guarantee wanted, not the
  false discovery rate. Holm controls it under any dependence (every comparison shares the best's rounds) and is
  uniformly more powerful than Bonferroni. Two-sided tests: the best was chosen by the same data, so its lead is
  biased upward and a one-sided test would call differences too readily.
- Confirmation: the best two measured again in fresh rounds after the sweep. The best of many noisy combinations
  is biased upward (the winner's curse); figures from rounds that played no part in choosing it are not.
- The winner: named only when it is distinguishable from the runner-up: in the confirmation rounds, when the
  95% interval of the one over the other, paired by round, excludes 1 (the one ahead wins, even the sweep's
  runner-up); without confirmation rounds, when the runner-up is worse than the best at the sweep's family-wise
  level. Otherwise the best two are not distinguishable and no winner is named."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats as sps

from harness.analysis import inference as inf
from harness.store import shapes

CONFIDENCE = 0.95


#: Family-wise error rate of the "worse than the best" claims.
ALPHA = inf.ALPHA

#: combination -> task -> round -> paired speedup against the baseline.
Ratios = Mapping[str, Mapping[str, Mapping[int, float]]]


#: A speedup (or a ratio of two combinations) with its interval: the one figure type of the analysis.
Figure = inf.Figure
NO_FIGURE = inf.NO_FIGURE


#: combination -> task (None: the geometric mean over tasks) -> its figure, from a speedup table.
Figures = Mapping[str, Mapping[str | None, Figure]]


def _t_interval(logs: Sequence[float]) -> tuple[float | None, float | None]:
    xs = np.asarray([x for x in logs if math.isfinite(x)], dtype=float)
    if len(xs) < 2:
        return None, None
    if np.all(xs == xs[0]):
        return math.exp(xs[0]), math.exp(xs[0])
    ci = sps.ttest_1samp(xs, 0.0).confidence_interval(CONFIDENCE)
    return math.exp(ci.low), math.exp(ci.high)


def _geomean(per_task: Mapping[str, Mapping[int, float]]) -> float | None:
    """The geometric mean over tasks of each task's geometric mean over rounds (the table's estimate below
    TRIM_FROM rounds)."""
    means = [statistics.fmean(math.log(v) for v in rounds.values() if v and v > 0)
             for rounds in per_task.values() if any(v and v > 0 for v in rounds.values())]
    return math.exp(statistics.fmean(means)) if means else None


def rank(ratios: Ratios) -> list[tuple[str, float]]:
    """Combinations by their geometric mean over tasks, best first (those without a paired round are left out):
    how the run chooses the two it confirms."""
    figs = [(c, _geomean(per_task)) for c, per_task in ratios.items()]
    return sorted(((c, e) for c, e in figs if e is not None), key=lambda x: -x[1])


def paired(a: Mapping[str, Mapping[int, float]], b: Mapping[str, Mapping[int, float]]) -> dict[int, float]:
    """Per round, the mean over shared tasks of log(a / b): two combinations compared within rounds."""
    by: dict[int, list[float]] = {}
    for task, ra in a.items():
        for r, va in ra.items():
            vb = b.get(task, {}).get(r)
            if va and vb and va > 0 and vb > 0:
                by.setdefault(r, []).append(math.log(va / vb))
    return {r: statistics.fmean(xs) for r, xs in sorted(by.items())}


def p_value(logs: Sequence[float]) -> float | None:
    """Two-sided p of a one-sample t-test that the mean log ratio is 0 (None with fewer than 2 rounds; 1 when
    every round gives exactly the same ratio of 1, 0 when every round gives the same other ratio)."""
    xs = np.asarray(list(logs), dtype=float)
    if len(xs) < 2:
        return None
    if np.all(xs == xs[0]):
        return 1.0 if xs[0] == 0 else 0.0
    return float(sps.ttest_1samp(xs, 0.0).pvalue)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values (inference.holm_adjusted); None (no test: too few rounds) stays None and does not
    count in the family."""
    tested = [i for i, p in enumerate(pvalues) if p is not None]
    out: list[float | None] = [None] * len(pvalues)
    for i, adj in zip(tested, inf.holm_adjusted([pvalues[i] for i in tested]), strict=True):
        out[i] = adj
    return out


@dataclass(frozen=True)
class Candidate:
    """One combination against the best in a scope: its figure, the ratio to the best with interval, the raw and
    Holm-adjusted p-values, and whether it is distinguishable (worse) at the family-wise ALPHA."""

    combination: str
    figure: Figure
    vs_best: Figure
    p: float | None
    p_holm: float | None
    distinguishable: bool

    def as_dict(self) -> shapes.CandidateJson:
        return {"combination": self.combination, "figure": self.figure.as_dict(), "vs_best": self.vs_best.as_dict(),
                "p": None if self.p is None else round(self.p, 6),
                "p_holm": None if self.p_holm is None else round(self.p_holm, 6),
                "distinguishable": self.distinguishable}


@dataclass(frozen=True)
class Selection:
    """The best combination of a scope (one task, or all: task None) and every combination against it."""

    task: str | None
    best: str
    candidates: tuple[Candidate, ...]

    @property
    def tied(self) -> list[str]:
        """The combinations not distinguishable from the best (the best itself first)."""
        return [self.best] + [c.combination for c in self.candidates
                              if c.combination != self.best and not c.distinguishable]

    def as_dict(self) -> shapes.SelectionJson:
        return {"task": self.task, "best": self.best, "tied": self.tied,
                "candidates": [c.as_dict() for c in self.candidates]}


def _ratio_figure(logs: Mapping[int, float]) -> Figure:
    if not logs:
        return NO_FIGURE
    lo, hi = _t_interval(list(logs.values()))
    return Figure(math.exp(statistics.fmean(logs.values())), lo, hi, len(logs))


def select(ratios: Ratios, figures: Figures, task: str | None = None) -> Selection | None:
    """The best combination in one task (or over all tasks: task None) by its figure, and each other one against
    it, Holm over the family of comparisons; None when no combination has a figure there."""
    scoped = {c: ({task: per_task.get(task, {})} if task is not None else per_task) for c, per_task in ratios.items()}
    figs = {c: figures.get(c, {}).get(task, NO_FIGURE) for c in ratios}
    ranked = sorted((c for c in figs if figs[c].estimate is not None), key=lambda c: -figs[c].estimate)
    if not ranked:
        return None
    best = ranked[0]
    others = ranked[1:]
    logs = {c: paired(scoped[c], scoped[best]) for c in others}
    raw = [p_value(list(logs[c].values())) for c in others]
    adjusted = holm(raw)
    cands = [Candidate(best, figs[best], Figure(1.0, 1.0, 1.0, figs[best].rounds), None, None, False)]
    cands += [Candidate(c, figs[c], _ratio_figure(logs[c]), p, pa, pa is not None and pa < ALPHA)
              for c, p, pa in zip(others, raw, adjusted, strict=True)]
    return Selection(task, best, tuple(cands))


@dataclass(frozen=True)
class Confirmation:
    """The winner and the runner-up in the rounds after the sweep: each one's figure overall and per task, and the
    winner over the runner-up paired by round."""

    rounds: tuple[int, ...]
    winner: str
    runner_up: str | None
    winner_figure: Figure
    runner_up_figure: Figure
    winner_tasks: dict[str, Figure] = field(default_factory=dict)
    runner_up_tasks: dict[str, Figure] = field(default_factory=dict)
    winner_vs_runner_up: Figure = NO_FIGURE

    def as_dict(self) -> shapes.ConfirmationJson:
        return {"rounds": list(self.rounds), "winner": self.winner, "runner_up": self.runner_up,
                "winner_figure": self.winner_figure.as_dict(), "runner_up_figure": self.runner_up_figure.as_dict(),
                "winner_tasks": {t: f.as_dict() for t, f in self.winner_tasks.items()},
                "runner_up_tasks": {t: f.as_dict() for t, f in self.runner_up_tasks.items()},
                "winner_vs_runner_up": self.winner_vs_runner_up.as_dict()}


def confirm(confirm_ratios: Ratios, figures: Figures, winner: str, runner_up: str | None) -> Confirmation | None:
    """The confirmation figures (`figures`: from the rounds after the sweep alone) and the best two against each
    other, paired by round; None without any such round."""
    w = confirm_ratios.get(winner, {})
    rounds = sorted({r for per in confirm_ratios.values() for rr in per.values() for r in rr})
    if not rounds or not any(w.values()):
        return None
    ru = confirm_ratios.get(runner_up, {}) if runner_up else {}

    def tasks(c: str | None) -> dict[str, Figure]:
        return {t: f for t, f in figures.get(c, {}).items() if t is not None} if c else {}

    return Confirmation(tuple(rounds), winner, runner_up, figures.get(winner, {}).get(None, NO_FIGURE),
                        figures.get(runner_up, {}).get(None, NO_FIGURE) if ru else NO_FIGURE, tasks(winner),
                        tasks(runner_up) if ru else {}, _ratio_figure(paired(w, ru)) if ru else NO_FIGURE)


@dataclass(frozen=True)
class SweepResult:
    """A swept entry: its combinations, the overall and per-task selections from the sweep's rounds, the
    confirmation of the best two, and the winner when the best two are distinguishable (else None)."""

    family: str
    host: str
    combinations: tuple[str, ...]
    overall: Selection | None
    tasks: tuple[Selection, ...]
    confirmation: Confirmation | None
    winner: str | None = None
    decided_by: str | None = None  # "confirmation" or "selection": which rounds told the best two apart

    @property
    def best_two(self) -> tuple[str, str | None] | None:
        """The two the winner is told apart from: the confirmed two, else the sweep's best and runner-up."""
        if self.confirmation is not None:
            return self.confirmation.winner, self.confirmation.runner_up
        if self.overall is None:
            return None
        return self.overall.best, next((c.combination for c in self.overall.candidates[1:2]), None)

    def as_dict(self) -> shapes.SweepJson:
        return {"family": self.family, "host": self.host, "combinations": list(self.combinations),
                "overall": self.overall.as_dict() if self.overall else None,
                "tasks": [s.as_dict() for s in self.tasks],
                "confirmation": self.confirmation.as_dict() if self.confirmation else None,
                "winner": self.winner, "decided_by": self.decided_by,
                "best_two": list(self.best_two) if self.best_two else None}


def split_rounds(ratios: Ratios, confirm_from: int | None) -> tuple[dict, dict]:
    """The ratios of the sweep's rounds and those of the confirmation rounds (from `confirm_from` on)."""
    def keep(pred) -> dict:
        return {c: {t: {r: v for r, v in rr.items() if pred(r)} for t, rr in pt.items()} for c, pt in ratios.items()}
    if confirm_from is None:
        return keep(lambda r: True), {}
    return keep(lambda r: r < confirm_from), keep(lambda r: r >= confirm_from)


def winner(overall: Selection | None, conf: Confirmation | None) -> tuple[str | None, str | None]:
    """(the winner, the rounds that told it apart) when the best two are distinguishable, else (None, None)."""
    if conf is not None and conf.runner_up is not None:
        vs = conf.winner_vs_runner_up
        if vs.low is not None and vs.low > 1:
            return conf.winner, "confirmation"
        if vs.high is not None and vs.high < 1:
            return conf.runner_up, "confirmation"
        return None, None
    if overall is None:
        return None, None
    runner_up = overall.candidates[1:2]  # candidates come best first
    return (overall.best, "selection") if not runner_up or runner_up[0].distinguishable else (None, None)


def analyse(family: str, host: str, ratios: Ratios, tasks: Sequence[str], confirm_from: int | None,
            figures: Figures, confirm_figures: Figures | None = None, confirmed: Sequence[str] = ()) -> SweepResult:
    """A sweep's honest winner: selections from the sweep's rounds by `figures` (the selection rounds' speedup
    table), the confirmation of the combinations the run chose to confirm (`confirmed`, ranked by the selection
    figures; else the sweep's best two) by `confirm_figures` (the confirmation rounds' table), and the winner where
    the best two are distinguishable."""
    sweep_r, confirm_r = split_rounds(ratios, confirm_from)
    overall = select(sweep_r, figures)
    per_task = tuple(s for s in (select(sweep_r, figures, t) for t in tasks) if s is not None)
    # the confirmed two are ordered by the sweep's own figures (the ones its table prints), never by the order a
    # run.json lists them in
    ranked = [c.combination for c in overall.candidates] if overall else [c for c, _ in rank(sweep_r)]
    top = [c for c in ranked if c in confirmed][:2] if confirmed else ranked[:2]
    conf = confirm(confirm_r, confirm_figures or {}, top[0], top[1] if len(top) > 1 else None) \
        if top and confirm_r else None
    name, by = winner(overall, conf)
    return SweepResult(family, host, tuple(ratios), overall, per_task, conf, name, by)
