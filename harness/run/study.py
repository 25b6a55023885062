"""The sampling study's plan (`distribution:` in a manifest, `invoke run --distribution N`): which samples are drawn,
with which seeds, on which servers, in which order. harness/run/sampling.py draws them; `invoke validate` counts
them.

For each strategy and prompt the study draws `samples` samples, each one request with its own seed, and for the
strategy's baseline (the no-speculation server on the same target) three arms of as many samples: with the same
seeds (stage 1, seeded equality: a build that verifies drafts by exact match must reproduce the baseline token for
token), with other seeds (the reference of stage 2's two-sample tests: samples independent of the strategy's), and
the positive control (the baseline at another temperature or top-k, which the tests must tell apart;
harness/analysis/lossless.py judges). Every arm's samples are split into batches of `batch`; batch k of every arm
is drawn in round k, the batches of a round in an order shuffled with the run's seed, each batch on a fresh
server."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from harness import KitError
from harness import formatter as fm
from harness.intake.manifest import (
    MAX_STUDY_SAMPLES,
    STUDY_TEMPERATURE,
    Distribution,
    Manifest,
    Prompt,
    Strategy,
    Task,
    study,
)
from harness.store.runmeta import ArmMeta, StudyMeta

#: What each arm is, in the order a prompt's arms are listed: the strategy, its baseline with the same seeds, the
#: baseline with other seeds (the reference), the baseline at the control's setting.
ROLES = ("strategy", "baseline", "reference", "control")
#: Candidates recorded per position of the baseline's samples (to say onto which of its choices a strategy diverged).
BASELINE_CANDIDATES = 5


@dataclass(frozen=True)
class Arm:
    """One series of samples: a server (its strategy) and how it is asked (temperature, top-k, first seed)."""

    id: str
    strategy: Strategy
    role: str
    temperature: float
    top_k: int | None
    first_seed: int
    #: the baseline arm this one is compared with (its own id for the baseline arms)
    baseline: str

    @property
    def n_probs(self) -> int:
        """Per-position probabilities asked for: none of a drafting server (b11434 answers 0.0 for drafted
        positions), the sampled token's of the reference and the control, a few candidates of the baseline's."""
        return 0 if self.strategy.speculative else BASELINE_CANDIDATES if self.role == "baseline" else 1


@dataclass(frozen=True)
class Batch:
    arm: Arm
    task: Task
    prompt: Prompt
    round: int
    seeds: tuple[int, ...]
    host: str

    @property
    def id(self) -> str:
        return f"{self.host}/{self.arm.id}/{self.task.id}/{self.prompt.id}/{self.round}"


@dataclass
class Study:
    settings: Distribution
    arms: list[Arm]
    prompts: list[tuple[Task, Prompt]]
    hosts: list[str]
    batches: list[Batch]

    @property
    def rounds(self) -> int:
        return math.ceil(self.settings.samples / self.settings.batch)

    @property
    def requests(self) -> int:
        return sum(len(b.seeds) for b in self.batches)

    def describe(self) -> str:
        """One line for `invoke validate` and the run's log: what is drawn, how many requests, how many servers."""
        d = self.settings
        kind, value = d.control
        n_strategies = sum(a.role == "strategy" for a in self.arms)
        hosts = f" x {len(self.hosts)} hosts" if len(self.hosts) > 1 else ""
        return (f"sampling study at temperature {fm.plain(d.temperature)}" + (f", top-k {d.top_k}" if d.top_k else "")
                + f" (control: {kind.replace('_', '-')} {fm.plain(value)}): "
                f"{_n(n_strategies, 'strategy', 'strategies')} "
                f"and {len(self.arms) - n_strategies} baseline arms x {_n(len(self.prompts), 'prompt')}{hosts} x "
                f"{d.samples} samples of {d.tokens} tokens = {self.requests} requests in "
                f"{_n(len(self.batches), 'batch', 'batches')} ({_n(self.rounds, 'round')}), one fresh server per "
                "batch, its samples one after another on it")

    def as_meta(self) -> StudyMeta:
        """What run.json records of the study (plan.distribution): its settings and arms, so the analysis and a
        resumed run read them without the manifest."""
        settings = dataclasses.replace(self.settings, prompts=tuple((t.id, p.id) for t, p in self.prompts),
                                       strategies=tuple(a.strategy.id for a in self.arms if a.role == "strategy"))
        return StudyMeta(settings, tuple(ArmMeta(a.id, a.strategy.id, a.role, a.temperature, a.top_k, a.first_seed,
                                                 a.baseline) for a in self.arms), len(self.batches), self.requests)


def _n(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {plural or noun + 's'}"


def arms(manifest: Manifest, d: Distribution, strategy_ids: list[str]) -> list[Arm]:
    """Each baseline's three arms, then the strategies measured against it, for every target the strategies use."""
    out: list[Arm] = []
    for sid in strategy_ids:
        s = manifest.strategy(sid)
        base = manifest.baseline_for(s)  # its own build's, at one client like the study's requests
        if base is None:
            raise KitError(f"{manifest.path.name}: distribution.strategies: {sid!r} has no baseline on its target "
                           f"{s.model!r} (a strategy with spec_type none and model {s.model!r})")
        if base.id not in {a.id for a in out}:
            control_t = d.control[1] if d.control[0] == "temperature" else d.temperature
            control_k = int(d.control[1]) if d.control[0] == "top_k" else d.top_k
            out += [Arm(base.id, base, "baseline", d.temperature, d.top_k, d.seed, base.id),
                    Arm(f"{base.id}@reference", base, "reference", d.temperature, d.top_k, d.seed + d.samples,
                        base.id),
                    Arm(f"{base.id}@control", base, "control", control_t, control_k, d.seed, base.id)]
        out.append(Arm(s.id, s, "strategy", d.temperature, d.top_k, d.seed, base.id))
    return out


def make_study(manifest: Manifest, d: Distribution, hosts: list[str], shuffle_seed: int,
               strategies: list[str] | None = None, tasks: list[str] | None = None) -> Study | None:
    """The study's batches on these hosts, round by round, each round shuffled with the run's seed; restricted to
    the strategies and tasks a run selected (ids, as harness/run/plan.py's `select` resolves them; None: all). None
    when the selection leaves nothing to sample."""
    sids = [s for s in d.strategies if strategies is None or s in strategies]
    chosen = [(manifest.task(t), manifest.task(t).get_prompt(p)) for t, p in d.prompts
              if tasks is None or t in tasks]
    if not sids or not chosen:
        return None
    all_arms = arms(manifest, d, sids)
    batches: list[Batch] = []
    for host in hosts:
        for r in range(1, math.ceil(d.samples / d.batch) + 1):
            first = (r - 1) * d.batch
            offsets = range(first, min(first + d.batch, d.samples))
            round_ = [Batch(a, t, p, r, tuple(a.first_seed + i for i in offsets), host)
                      for t, p in chosen for a in all_arms]
            random.Random(f"{shuffle_seed}:{host}:sampling:{r}").shuffle(round_)
            batches += round_
    return Study(d, all_arms, chosen, list(hosts), batches)


def check_samples(samples: int) -> None:
    """--distribution N: 0 (no study) or 2 to MAX_STUDY_SAMPLES samples per arm, checked before any engine is asked."""
    if samples != 0 and not 2 <= samples <= MAX_STUDY_SAMPLES:
        raise KitError(f"--distribution: expected 2 to {MAX_STUDY_SAMPLES} samples per arm (or 0: no sampling "
                       f"study), got {samples}")


def settings(manifest: Manifest, samples: int | None) -> Distribution | None:
    """The study a new run draws: with `samples` None the manifest's (None without a `distribution:` block); 0:
    none; N: the manifest's, or the default one at temperature 0.8 on every task's first prompt, with N samples."""
    if samples is None or samples == 0:
        return manifest.distribution if samples is None else None
    check_samples(samples)
    d = manifest.distribution or study({"sampling": {"temperature": STUDY_TEMPERATURE}}, manifest.strategies,
                                       manifest.tasks, manifest.path.name)
    return dataclasses.replace(d, samples=samples)


def from_meta(r: StudyMeta) -> Distribution:
    """The study a run recorded in run.json (a resumed run draws what it planned, whatever the flags say now)."""
    return r.settings
