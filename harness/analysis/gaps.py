"""What a run still lacks, and what measuring it again would restore: one rule for the executor, which retakes at
the end of each round (harness/run/executor.py), and for the report, which names the command that completes a run.

A planned measurement (a slot: host, strategy, task, prompt, round) is *present* when an attempt of it counts: ok
and not disturbed by other work (on a host whose disturbed measurements are kept, disturbed ones count too). It is
a *gap* when its latest attempt (the first take, or the last retake of it) other work disturbed, or failed while
other work disturbed it (a request that timed out on a saturated host), or failed where its cell succeeded in some
other attempt; a failure every time on a quiet host is the strategy's, and no retake would fill it.

A speedup is made of pairs: a strategy and its baseline on the same task, prompt and host in the same round. A
retake is worth the pairs it restores: a baseline holds one for every strategy measured against it there, a
strategy one; a measurement that pairs with nothing restores its own figures (one). `choose` spends a cap on the
gaps that restore the most, one at a time: a disturbed baseline whose strategies are present comes first; a gap
whose partner is a gap too restores its pair only with it, so it is ranked by the pairs it holds, and the partners
follow it; a gap whose partners are missing for good restores nothing and is left."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from harness.analysis.records import Measurement

#: host, strategy, task, prompt, round: one planned measurement, whichever attempt fills it.
Slot = tuple[str, str, str, str, int]


def slot_of(m: Measurement) -> Slot:
    return (m.host, m.strategy, m.task, m.prompt, m.round)


@dataclass(frozen=True)
class Gap:
    """A planned measurement that does not count yet: its latest attempt (a retake of it is `retake_of` this id)
    and why it does not count."""

    id: str
    slot: Slot
    why: str  # "disturbed" or "failed"


@dataclass(frozen=True)
class State:
    """The slots that count and the gaps, in the order the run measured them."""

    present: frozenset[Slot]
    gaps: tuple[Gap, ...]


def state(measurements: Iterable[Measurement], kept_hosts: Collection[str] = ()) -> State:
    """What counts and what is missing of a run's records (`kept_hosts`: hosts whose disturbed measurements are
    kept in the figures, harness/analysis/records.py)."""
    ms = sorted(measurements, key=lambda m: m.order)
    superseded = {m.retake_of for m in ms if m.retake_of}
    succeeded = {m.key for m in ms if m.measured}
    present = {slot_of(m) for m in ms if m.measured and (not m.disturbed or m.host in kept_hosts)}
    gaps: dict[Slot, Gap] = {}
    for m in ms:
        s = slot_of(m)
        if m.id in superseded or s in present:
            continue
        if m.measured and m.disturbed:
            gaps[s] = Gap(m.id, s, "disturbed")
        elif not m.ok and (m.key in succeeded or m.disturbed):
            gaps[s] = Gap(m.id, s, "failed")
    return State(frozenset(present), tuple(gaps.values()))


class Pairs:
    """Which slots pair with which: a strategy with its baseline, a baseline with each strategy measured against
    it (same host, task, prompt and round)."""

    def __init__(self, baselines: Mapping[str, str | None]):
        self.baseline = {s: b for s, b in baselines.items() if b}
        self.against: dict[str, list[str]] = defaultdict(list)
        for s, b in self.baseline.items():
            self.against[b].append(s)

    def partners(self, slot: Slot) -> list[Slot]:
        host, strategy, task, prompt, round_ = slot
        ids = ([self.baseline[strategy]] if strategy in self.baseline else []) + self.against.get(strategy, [])
        return [(host, x, task, prompt, round_) for x in ids]


def choose(gaps: Iterable[Gap], present: Collection[Slot], baselines: Mapping[str, str | None], cap: int,
           seed: str) -> list[Gap]:
    """At most `cap` gaps to measure again, those that restore the most pairs first (see the module); ties in an
    order shuffled with `seed`. Every gap of `gaps` counts as one that may be retaken."""
    pairs = Pairs(baselines)
    left = list(gaps)
    random.Random(seed).shuffle(left)
    open_slots = {g.slot for g in left}
    have = set(present)
    chosen: list[Gap] = []

    def score(g: Gap) -> tuple[int, int]:
        ps = pairs.partners(g.slot)
        if not ps:
            return 1, 1  # pairs with nothing: its own figures
        return sum(p in have for p in ps), sum(p in have or p in open_slots for p in ps)

    while left and len(chosen) < cap:
        best = max(left, key=score)  # the first of the best in the shuffled order
        now, holds = score(best)
        if holds == 0 or (now == 0 and cap - len(chosen) < 2):
            break  # restores nothing, or nothing unless a partner is retaken too, with no retake left for it
        chosen.append(best)
        have.add(best.slot)
        left.remove(best)
    return chosen


def restored(chosen: Iterable[Gap], present: Collection[Slot], baselines: Mapping[str, str | None]) -> int:
    """The pairs these gaps restore, measured again and counting (a gap that pairs with nothing: one)."""
    chosen = list(chosen)
    pairs = Pairs(baselines)
    have = set(present) | {g.slot for g in chosen}
    seen: set[frozenset[Slot]] = set()
    n = 0
    for g in chosen:
        ps = pairs.partners(g.slot)
        n += not ps
        for p in ps:
            if p in have and (pair := frozenset((g.slot, p))) not in seen:
                seen.add(pair)
                n += 1
    return n


def restored_by_retakes(measurements: Iterable[Measurement], baselines: Mapping[str, str | None],
                        kept_hosts: Collection[str] = ()) -> int:
    """The pairs a run's retakes restored: pairs that count, at least one side of which counts through a retake
    (a retake that pairs with nothing: one)."""
    ms = list(measurements)
    st = state(ms, kept_hosts)
    superseded = {m.retake_of for m in ms if m.retake_of}
    by_retake = {slot_of(m) for m in ms if m.retake_of and m.id not in superseded and slot_of(m) in st.present}
    return restored([Gap("", s, "retaken") for s in by_retake], st.present, baselines)
