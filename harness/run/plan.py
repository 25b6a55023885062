"""The plan: which measurements a run makes, in which order. Cells (strategy x task x prompt) run once per round,
rounds in an order shuffled with a recorded seed, on each host. `invoke validate` prints it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import KitError
from harness import formatter as fm
from harness.files import display_path
from harness.formatter import size
from harness.image import backends, source
from harness.intake import load as load_block
from harness.intake import spec_types
from harness.intake.manifest import Manifest, Prompt, Strategy, Task, check_model_files, unpinned
from harness.intake.trust import untrusted_fields
from harness.models import gguf_facts, preflight
from harness.models.generate import EMBED, FF, TARGET_LAYERS, check_size
from harness.run import builds as per_build
from harness.run import study, suite_plan
from harness.store.runmeta import MAX_MEASUREMENTS

#: At most this share of a plan's measurements is retaken when other work disturbed them, rounded down (a run of
#: fewer than ten measurements takes none unless asked; `--retakes` overrides).
RETAKE_SHARE = 0.10


@dataclass(frozen=True)
class Cell:
    """One thing measured: a strategy on one prompt of a task."""

    strategy: Strategy
    task: Task
    prompt: Prompt

    @property
    def id(self) -> str:
        return f"{self.strategy.id}/{self.task.id}" + (f"/{self.prompt.id}" if len(self.task.prompts) > 1 else "")


@dataclass(frozen=True)
class Planned:
    cell: Cell
    run_index: int
    round: int
    host: str
    #: A retake: the measurement_id of the disturbed measurement it measures again (same cell, run and round).
    retake_of: str | None = None

    @property
    def measurement_id(self) -> str:
        if self.retake_of is not None:
            return f"{self.retake_of}/retake"
        c = self.cell
        prompt = f"/{c.prompt.id}" if len(c.task.prompts) > 1 else ""
        return f"{self.host}/{c.strategy.id}/{c.task.id}{prompt}/{self.run_index}"

    def retake(self) -> Planned:
        """The same measurement again, marked as the retake of this one."""
        return replace(self, retake_of=self.measurement_id)


@dataclass
class Plan:
    strategies: list[Strategy]
    tasks: list[Task]
    runs: int
    shuffle_seed: int
    hosts: list[str]
    items: list[Planned] = field(default_factory=list)
    #: At most this many disturbed measurements are measured again in the run (each at the end of its round).
    retake_cap: int = 0

    @property
    def cells(self) -> list[Cell]:
        return [Cell(s, t, p) for s in self.strategies for t in self.tasks for p in t.prompts]

    def add_rounds(self, first: int, last: int, only: set[tuple[str, str, str]] | None = None) -> list[Planned]:
        """Append rounds first..last (each host runs every cell once per round, shuffled; with `only`, just the
        cells whose (host, strategy, task) is in it); return what was added."""
        added: list[Planned] = []
        for host in self.hosts:
            for r in range(first, last + 1):
                cells = [c for c in self.cells if only is None or (host, c.strategy.id, c.task.id) in only]
                random.Random(f"{self.shuffle_seed}:{host}:{r}").shuffle(cells)
                added += [Planned(c, r, r, host) for c in cells]
        self.items += added
        return added

    def sweeps(self) -> dict[str, list[Strategy]]:
        """The swept entries of the plan: family id -> its combinations at the entry's lowest concurrency level
        (the ones a winner is chosen from), for entries with at least two of them planned."""
        out: dict[str, list[Strategy]] = {}
        for s in self.strategies:
            if s.sweep:
                out.setdefault(s.family_id, []).append(s)
        lowest = {f: min(s.parallel for s in ss) for f, ss in out.items()}
        out = {f: [s for s in ss if s.parallel == lowest[f]] for f, ss in out.items()}
        return {f: ss for f, ss in out.items() if len(ss) > 1}

    def confirm_strategies(self, top: list[str], baselines: dict[str, str | None]) -> list[str]:
        """What the confirmation rounds measure of a sweep's best combinations `top` (ids at the entry's lowest
        level): each of them at every concurrency level of its entry, the baselines they pair with, and every level
        of those baselines' entries, so that the serving comparison of the winner at N clients rests on fresh
        rounds too. In plan order."""
        by_id = {s.id: s for s in self.strategies}
        want: set[str] = set()
        for c in top:
            combo = by_id[c]
            levels = [s.id for s in self.strategies if s.family_id == combo.family_id and s.sweep == combo.sweep]
            want |= set(levels)
            for sid in levels:
                base = by_id.get(baselines.get(sid) or "")
                if base is not None:
                    want |= {s.id for s in self.strategies if s.family_id == base.family_id}
        return [s.id for s in self.strategies if s.id in want]

    def confirm_measurements(self, rounds: int, baselines: dict[str, str | None]) -> int:
        """How many measurements the confirmation rounds will add: per round and prompt, what
        `confirm_strategies` measures of each sweep's best two combinations (each once)."""
        cells = {sid for ss in self.sweeps().values()
                 for sid in self.confirm_strategies([s.id for s in ss[:2]], baselines)}
        return rounds * len(cells) * sum(len(t.prompts) for t in self.tasks) * len(self.hosts)

    def describe(self) -> str:
        n_prompts = sum(len(t.prompts) for t in self.tasks)
        prompts = f" ({n_prompts} prompts)" if n_prompts != len(self.tasks) else ""
        hosts = f" x {len(self.hosts)} hosts" if len(self.hosts) > 1 else ""
        return (f"{len(self.strategies)} strategies x {len(self.tasks)} tasks{prompts} x {self.runs} runs{hosts} = "
                f"{len(self.items)} measurements")


def select(manifest: Manifest, strategies: list[str] | None, tasks: list[str] | None) -> tuple[list[Strategy],
                                                                                                   list[Task]]:
    """The manifest's strategies and tasks, or the named subset (in manifest order); unknown names are errors.
    A strategy is named by its id; `<entry>[*]` names every combination and level of a manifest entry, and a
    sweep's entry id (no strategy's id) all its combinations.

    A subset keeps the baselines its strategies are measured against."""
    def pick(kind: str, names: list[str] | None, items: tuple) -> list:
        if not names:
            return list(items)
        ids = {i.id for i in items}
        # a strategy by its id; every member of an entry (combinations, levels) by `<entry>[*]`, or by the
        # entry's id where no strategy has it (a sweep)
        # (an entry on several builds: by its id for every build, or by its id on one build)
        members = {n: [i for i in items if {getattr(i, "family_id", i.id), getattr(i, "entry_id", i.id)}
                       & {n, n.removesuffix("[*]")}] for n in names if n not in ids}
        unknown = [n for n, ms in members.items() if not ms]
        if unknown:
            entries = sorted({getattr(i, "entry_id", i.id) for i in items})
            raise KitError(f"--{kind}: {', '.join(unknown)} not in the manifest (known: {', '.join(entries)})")
        chosen = {i.id for ms in members.values() for i in ms} | (set(names) & ids)
        return [i for i in items if i.id in chosen]
    strats = pick("strategies", strategies, manifest.strategies)
    needed = {b.id for s in strats if (b := manifest.baseline_for(s)) is not None}
    strats = [s for s in manifest.strategies if s in strats or s.id in needed]
    return strats, pick("tasks", tasks, manifest.tasks)


def aa_twin(baseline: Strategy) -> Strategy:
    """The A/A control of a baseline: the same server measured again in every round, compared with itself, so
    the report shows how much drift survives the pairing by rounds."""
    return Strategy(f"{baseline.id}-aa", baseline.spec_type, None, baseline.args, f"A/A control of {baseline.id}",
                    baseline.parallel, baseline.model, baseline.id, f"{baseline.id}-aa", build=baseline.build)


def make_plan(manifest: Manifest, hosts: list[str], *, strategies: list[str] | None = None,
              tasks: list[str] | None = None, runs: int | None = None, shuffle_seed: int | None = None,
              aa_control: bool = False, retakes: int | None = None, max_rounds: int | None = None) -> Plan:
    """The plan for a manifest (or a subset of it) on the named hosts; with aa_control, each baseline twice.
    `retakes` caps the disturbed measurements measured again (default: the manifest's, else RETAKE_SHARE of the
    planned ones). `max_rounds`: the run may add rounds up to it (--until); those, and the confirmation rounds
    after a sweep, count against MAX_MEASUREMENTS as the planned ones do."""
    strats, tks = select(manifest, strategies, tasks)
    if aa_control:
        ids = {s.id for s in manifest.strategies}
        for b in [s for s in strats if not s.speculative and s.baseline is None]:
            twin = aa_twin(b)
            if twin.id in ids:
                raise KitError(f"--aa-control: the manifest already has a strategy {twin.id!r}")
            strats.insert(strats.index(b) + 1, twin)
    runs = runs or manifest.runs
    if runs < 1:
        raise KitError(f"--runs: expected at least 1, got {runs}")
    seed = shuffle_seed if shuffle_seed is not None else random.SystemRandom().randrange(2**31)
    plan = Plan(strats, tks, runs, seed, hosts)
    per_round = len(plan.cells) * len(hosts)
    total = per_round * runs
    added = per_round * max(0, (max_rounds or 0) - runs)
    confirming = plan.confirm_measurements(confirm_rounds(manifest, runs), {
        s.id: (base.id if (base := manifest.baseline_for(s)) else None) for s in strats}) if plan.sweeps() else 0
    if total + added + confirming > MAX_MEASUREMENTS:
        more = "".join(f" + {fm.count(n)} {what}" for n, what in (
            (added, f"in rounds --until may add up to round {max_rounds}"),
            (confirming, "in the confirmation rounds")) if n)
        raise KitError(f"the plan has {fm.count(total)} measurements{more}; at most {fm.count(MAX_MEASUREMENTS)} in "
                       "all (fewer runs, rounds or confirm_rounds, or a subset)")
    plan.add_rounds(1, runs)
    retakes = retakes if retakes is not None else manifest.retakes
    plan.retake_cap = retakes if retakes is not None else math.floor(RETAKE_SHARE * len(plan.items))
    return plan


def model_preflight(manifest: Manifest, models_dir: Path,
                    not_checked: list[str] | None = None) -> list[str]:
    """The pre-flight of the model files already present (harness/models/preflight.py); the flavours are those of the
    pinned source when it has been fetched, else all are assumed (the run checks against the image). Each check
    that could not run is added to `not_checked`, with why."""
    def facts_of(key: str):
        p = manifest.models[key].local_path(models_dir)
        return gguf_facts.read_facts(p) if p.is_file() else None

    def flavours_of(build: str | None) -> dict[str, bool] | None:  # each build's own source, when fetched
        tree = source.cached_tree(manifest.for_build(build))
        return preflight.supported_flavours(tree) if tree is not None else None

    skipped: list[tuple[str, str]] = []
    problems = per_build.check_strategies(manifest, manifest.strategies, facts_of, flavours_of, skipped)
    unfetched = [b for b in manifest.build_names() if flavours_of(b) is None]
    if not_checked is not None:
        by_key: dict[str, list[str]] = {}
        for sid, key in skipped:
            by_key.setdefault(key, []).append(sid)
        for key, sids in by_key.items():
            where = display_path(manifest.models[key].local_path(models_dir))
            not_checked.append(f"strategies {', '.join(sids)}: the model files against their spec types (GGUF "
                               f"headers): models.{key} ({where}) is not there yet; `invoke models`, then validate "
                               "again")
        present = {k for k, m in manifest.models.items() if m.local_path(models_dir).is_file()}
        flavoured = [s.id for s in manifest.strategies if (s.draft or spec_types.get(s.spec_type).flavours)
                     and set(s.model_keys()) <= present and s.build in unfetched]
        if flavoured:
            not_checked.append(f"strategies {', '.join(flavoured)}: the drafter flavour against the image's "
                               "llama.cpp (checked against every flavour instead): the pinned source is not fetched "
                               "yet; `invoke run` checks it against the image before any container starts")
    return problems


def generator_problems(manifest: Manifest) -> list[str]:
    """Generated models whose shape the generator refuses (too many parameters), one line each."""
    out = []
    for m in manifest.models.values():
        if m.generate is not None:
            try:
                check_size(m.generate.kind, **{"embed": EMBED, "ff": FF, "layers": TARGET_LAYERS,
                                               **m.generate.shape()})
            except KitError as e:
                out.append(f"{display_path(manifest.path)}: models.{m.key}.generate: {str(e).removeprefix('models: ')}")
    return out


def confirm_rounds(manifest: Manifest, runs: int) -> int:
    """Rounds of each sweep's best two combinations after the sweep: the manifest's confirm_rounds, else the
    run's runs."""
    return runs if manifest.confirm_rounds is None else manifest.confirm_rounds


def sweep_lines(manifest: Manifest, plan: Plan) -> list[str]:
    """What `invoke validate` says of the sweeps and concurrency levels: each sweep's combinations, the
    confirmation rounds after it, each entry's levels, and the measurement count with the confirmation."""
    lines = []
    for family, members in plan.sweeps().items():
        grid = " x ".join(f"{flag} {', '.join(dict.fromkeys(v for s in members for f, v in s.sweep if f == flag))}"
                          for flag, _ in members[0].sweep)
        lines.append(f"sweep {family}: {len(members)} combinations ({grid}), each measured like any strategy")
    levels: dict[str, list[int]] = {}
    for s in plan.strategies:
        levels.setdefault(s.family_id, [])
        if s.parallel not in levels[s.family_id]:
            levels[s.family_id].append(s.parallel)
    for family, ns in levels.items():
        if len(ns) > 1 or ns != [1]:
            lines.append(f"serving {family}: {', '.join(map(str, ns))} concurrent clients, one fresh server with "
                         "that many slots per measurement")
    if lines and plan.sweeps():
        rounds = confirm_rounds(manifest, plan.runs)
        extra = plan.confirm_measurements(rounds, {s.id: (b.id if (b := manifest.baseline_for(s)) else None)
                                                   for s in plan.strategies})
        lines.append(f"confirmation: {rounds} fresh rounds of each sweep's best two combinations and their "
                     f"baseline, each at every concurrency level of its entry, after the sweep: +{extra} "
                     f"measurements, {len(plan.items) + extra} in all")
    return lines


def render(manifest: Manifest, models_dir: Path, strict: bool = False, results_dir: Path | None = None) -> str:
    """`invoke validate`: the manifest's plan in a few lines; with strict, every unpinned field is a problem. The
    checks that could not run (a file not there yet) are named, with why. `results_dir`: where earlier runs are
    (a prompt suite's time estimate takes their measured rate of the same target)."""
    not_checked: list[str] = []
    problems = generator_problems(manifest) + check_model_files(manifest, models_dir)
    problems += model_preflight(manifest, models_dir, not_checked) if not problems else []
    if strict:
        problems += unpinned(manifest)
    if problems:
        raise KitError(problems[0] if len(problems) == 1 else
                       f"{len(problems)} problems:\n  " + "\n  ".join(problems))
    absent = [m.key for m in manifest.models.values() if m.sha256 and not m.local_path(models_dir).is_file()]
    if absent:
        not_checked.append(f"the pinned sha256 of models {', '.join(absent)}: not there yet in "
                           f"{display_path(models_dir)} (`invoke models` checks each as it makes it)")
    plan = make_plan(manifest, ["local"], shuffle_seed=0)
    drawn = study.make_study(manifest, manifest.distribution, ["local"], 0) if manifest.distribution else None
    hw = manifest.hardware
    unchecked = f"; {len(not_checked)} check(s) not run, named below" if not_checked else ""
    lines = [f"{display_path(manifest.path)}: valid (manifest {manifest.name}, sha256 {manifest.sha256[:12]})"
             f"{unchecked}",
             f"plan: {plan.describe()}, one fresh container each", *sweep_lines(manifest, plan),
             *([drawn.describe()] if drawn else []),
             *(load_block.describe(manifest.load) if manifest.load else []),
             f"hardware: {hw.name}, {fm.plain(hw.memory_bandwidth_gbs)} GB/s ({hw.bandwidth_source})",
             f"build: {backends.get(manifest.build.backend).describe(manifest.build.cuda_architectures)}"
             + (f"; {len(manifest.builds)} builds of llama.cpp, each strategy on its own (below), measured in the "
                "same rounds" if manifest.builds else f"; llama.cpp from {', '.join(manifest.llama_cpp.kinds())}"),
             "strategies:"]
    untrusted = [f for f, _, _ in untrusted_fields(manifest)]
    if untrusted:
        lines.insert(-1, f"trust: {', '.join(untrusted)} need --trust-source to build, run or fetch models "
                         "(harness/intake/trust.py)")
    width = max(14, *(len(s.id) for s in manifest.strategies))
    for s in manifest.strategies:
        extra = (f" draft={s.draft}" if s.draft else "") + (f" model={s.model}" if s.model != "target" else "")
        extra += f" build={s.build}" if s.build and f"build={s.build}]" not in s.id else ""
        base = manifest.baseline_for(s)
        vs = f" (vs {base.id})" if base is not None and base.id != s.id else ""
        vs += ", synthetic acceptance (benchmarking only)" if s.synthetic else ""
        args = f" {' '.join(s.args)}" if s.args else ""
        lines.append(f"  {s.id:{width}} --spec-type {s.spec_type}{extra}{args}{vs}")
    lines.append("tasks: " + ", ".join(f"{t.id} ({t.n_predict}" + (f", depth {t.depth}" if t.depth else "")
                                       + (f", {len(t.prompts)} prompts)" if len(t.prompts) > 1 else ")")
                                       for t in manifest.tasks))
    if manifest.suites:
        lines += suite_plan.lines(manifest, [it.cell.task.id for it in plan.items], models_dir, results_dir)
    lines.append("models:")
    for m in manifest.models.values():
        p = m.local_path(models_dir)
        if p.is_file():
            state = f"{size(p.stat().st_size)} present"
        elif m.size_bytes:
            state = f"{size(m.size_bytes)}, not downloaded yet"
        else:
            state = "not present yet"
        origin = (f"hf {m.hf.repo}/{m.hf.file}" if m.hf else f"generated ({m.generate.kind})" if m.generate
                  else f"pypi {m.pypi.package}=={m.pypi.version}" if m.pypi
                  else f"first {m.derive.layer_skip} blocks of {m.derive.parent}" if m.derive else "local file")
        pin = f"sha256 {m.sha256[:12]}" if m.sha256 else "sha256 unpinned"
        lines.append(f"  {m.key:10} {m.file} [{origin}] {state}, {pin}")
    if not_checked:
        lines.append("not checked yet:")
        lines += [f"  {x}" for x in not_checked]
    if strict:
        lines.append("strict: every field that decides the numbers is pinned")
    return "\n".join(lines)
