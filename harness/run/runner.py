"""`invoke run`: manifest, models, image, engines, plan, run folder, executor, in that order.

Each round runs every cell once, in an order shuffled with a recorded seed, so slow drift of the machine does not
land on one strategy. `reuse_server` runs the naive protocol on purpose (one server per strategy)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from harness import LABEL_PREFIX, KitError
from harness import formatter as fm
from harness.analysis import completion, sweep, tuning
from harness.analysis import convergence as cv
from harness.analysis.records import CellIndex, CellKey
from harness.files import display_path, now_iso
from harness.hosts import devices, environment
from harness.hosts.engine import Engine, LocalEngine
from harness.image import backends, build, images, source
from harness.intake import load as load_block
from harness.intake import manifest as mf
from harness.intake.trust import Trusted
from harness.models import gguf_facts, preflight
from harness.models.ensure import ensure
from harness.run import bandwidth, conversations, metadata, sampling, study
from harness.run import builds as per_build
from harness.run import load as load_run
from harness.run.doctor import require_ready
from harness.run.executor import Executor
from harness.run.plan import Plan, confirm_rounds, make_plan, select
from harness.run.protocol import PROTOCOLS, Context, MeasurementProtocol, warm_shader_cache
from harness.store import runmeta
from harness.store.buildrecord import BuildRecord
from harness.store.rundir import RunDir, new_run_id

#: Round cap of `invoke run --until` when --max-rounds is not given.
DEFAULT_MAX_ROUNDS = 20
#: The longest `--quiet-wait` before one measurement (an hour: a bound, not a schedule).
MAX_QUIET_WAIT_S = 3600


class PlanChanges(TypedDict, total=False):
    """What a resume's flags change in the run's plan (run.json's plan fields of the same names)."""

    runs: int
    retake_cap: int
    quiet_wait_s: float


def _resume(results_dir: Path, resume: str, manifest: mf.Manifest, runs: int | None, retakes: int | None,
            quiet_wait: float | None) -> tuple[RunDir, runmeta.RunMeta, PlanChanges]:
    """The run folder to resume, its metadata, and what the flags change in its plan: more runs per cell (only
    where no round follows the planned ones), a new cap of retakes (those already made count against it), a new
    quiet wait. The changes are written to run.json when the run starts measuring."""
    rd = RunDir.open(Path(resume) if Path(resume).is_dir() else Path(results_dir) / resume)
    meta = rd.read_meta()
    if manifest.sha256 != meta.manifest.sha256:
        raise KitError(f"{display_path(manifest.path)} changed since run {rd.run_id} started (sha256 "
                       f"{manifest.sha256[:12]} vs {meta.manifest.sha256[:12]}); resume with the same manifest")
    p = meta.plan
    changes: PlanChanges = {}
    if runs is not None and runs != p.runs:
        if runs < p.runs:
            raise KitError(f"--runs {runs}: run {rd.run_id} planned {p.runs} runs per cell; a resume adds rounds, "
                           "it removes none")
        if p.extra_rounds:
            why = " and ".join(sorted({"confirmation" if x.confirms else "--until"
                                       for x in p.extra_rounds}))
            raise KitError(f"--runs {runs}: run {rd.run_id} has rounds after its {p.runs} planned ones ({why}), so "
                           f"its planned runs cannot grow; start a new run with --runs {runs}")
        changes["runs"] = runs
    if retakes is not None and retakes != p.retake_cap:
        made = sum(1 for r in rd.measurements() if r.get("retake_of") is not None)
        if retakes < made:
            raise KitError(f"--retakes {retakes}: run {rd.run_id} has made {made} retakes already, and they count "
                           "against the cap; give at least that many")
        changes["retake_cap"] = retakes
    if quiet_wait is not None and quiet_wait != p.quiet_wait_s:
        changes["quiet_wait_s"] = quiet_wait
    return rd, dataclasses.replace(meta, plan=dataclasses.replace(p, **changes)), changes


def _image(trusted: Trusted, engines: list[Engine], build_missing: bool,
           log: Callable[[str], None]) -> BuildRecord:
    """The build record of the manifest's image, found on every engine by its identity (harness/image/images.py);
    built where it is missing unless `build_missing` is off."""
    manifest = trusted.manifest
    records: dict[str, BuildRecord] = {}
    for e in engines:
        rec = images.record(e, manifest, host=e.name)
        if rec is None:
            flag = "" if e.name == "local" else f" --host {e.name}"
            if not build_missing:
                raise KitError(f"no image of manifest {manifest.name}'s build (source, flags, backend) on {e.name}; "
                               f"run `invoke build --manifest {manifest.path}{flag}`, or drop --no-build")
            log(f"{e.name}: no image of this build yet; building it now, as `invoke build{flag}` would "
                "(minutes the first time)")
            rec = build.build(e, trusted, host=e.name, log=log)
        records[e.name] = rec
    tags = {r.tag for r in records.values()}
    if len(tags) > 1:
        which = ", ".join(f"{h}: {r.tag}" for h, r in records.items())
        raise KitError(f"the hosts need different images ({which}; their architectures differ): run each host in "
                       "a run of its own")
    return next(iter(records.values()))


def check_image(engines: list[Engine], record: BuildRecord, log: Callable[[str], None]) -> None:
    for e in engines:
        img = e.image(record.tag)
        if img is None:
            raise KitError(f"image {record.tag} is not on {e.name}; run `invoke build` first")
        if img.id != record.image_id:
            log(f"note: {e.name} has {record.tag} as {img.id[:19]}, the build record says "
                f"{record.image_id[:19]}; recording the engine's")


def _bandwidth(manifest: mf.Manifest, engines: list[Engine]) -> runmeta.MeasuredBandwidth | None:
    measured = [p for p in (bandwidth.latest(manifest.name, e.name) for e in engines) if p]
    if not measured:
        return None
    m = measured[0]
    return runmeta.MeasuredBandwidth(m["gbs"], m["kind"], m["host"], m["measured_at"], m.get("device") or None)


def run(trusted: Trusted, *, results_dir: Path, models_dir: Path, resume: str | None = None,
        run_id: str | None = None, strategies: list[str] | None = None, tasks: list[str] | None = None,
        runs: int | None = None, reuse_server: bool = False, seed: int | None = None, progress: bool = True,
        engines: list[Engine] | None = None, log: Callable[[str], None] = print, until: float | None = None,
        max_rounds: int | None = None, aa_control: bool = False, build_missing: bool = True,
        retakes: int | None = None, extend: Extender | None = None, quiet_wait: float | None = None,
        distribution: int | None = None, said: Callable[[Path], str] | None = None,
        load: bool = False) -> str:
    """Run (or resume) a trusted manifest's matrix; return a one-paragraph summary of where the results are, and
    after it what `said` makes of the run folder (the caller's headline: tasks.py passes harness/report's).

    The image is found on each engine by its identity; where it is missing it is built first, unless
    `build_missing` is off. With `until` (a relative half-width such as 0.05), rounds of the cells whose speedup
    interval is still wider are added after the planned ones, until every cell converges or `max_rounds` rounds
    have run. `extend` decides further rounds another way (`invoke reproduce --until`: until the comparison with
    the original is decided), up to `max_rounds`. At most `retakes` measurements that other work disturbed (or that
    failed while it ran, or where their cell succeeded) are measured again at the end of their round, those that
    restore the most pairs first (default: the manifest's, else 10% of the planned ones; run.json records the cap).
    `distribution` None draws the manifest's sampling study (harness/run/sampling.py) after the timed rounds, 0
    none, N the study alone with N samples per arm.
    `quiet_wait` (seconds) waits before each timed request until other work on the host is below the disturbance
    threshold, at most that long. A resumed run keeps its plan; `runs`, `retakes` and `quiet_wait` given with it
    change it (more rounds, a new cap, a new wait: `_resume`). The image runs code from the manifest's source: the
    task decided once whether it may (harness/intake/trust.py), before any engine was reached.
    `load` measures the manifest's load study alone (harness/run/load.py) into the run folder's load.jsonl; a
    resumed run of 0 runs without a sampling study is one, and measures the levels it lacks."""
    manifest = trusted.manifest
    meta = None
    changes: PlanChanges = {}
    _check_flags(until, retakes, quiet_wait)
    for flag, value, least in (("--runs", runs, 1), ("--seed", seed, 0), ("--max-rounds", max_rounds, 1),
                               ("--retakes", retakes, 0)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise KitError(f"{flag}: expected a whole number of at least {least}, got {value!r}")
    if resume:
        rd, meta, changes = _resume(results_dir, resume, manifest, runs, retakes, quiet_wait)
        reuse_server = meta.protocol == "reuse-server"
        p = meta.plan
        own = {s.id for s in manifest.strategies}  # an A/A twin is re-made by aa_control
        strategies, tasks, runs, seed = [s for s in p.strategies if s in own], p.tasks, p.runs, p.shuffle_seed
        until, max_rounds, aa_control = p.until, p.max_rounds, p.aa_control
        records = meta.build_records()
        settings, alone = (study.from_meta(p.distribution) if p.distribution else None), p.runs == 0
        load = p.runs == 0 and not p.distribution and manifest.load is not None
    else:
        settings, alone = study.settings(manifest, distribution), bool(distribution)
    engines = engines or [LocalEngine()]
    adding = until is not None or extend is not None  # rounds after the planned ones count against the cap too
    if load:
        plan, drawn = _load_plan(manifest, engines, seed, until, reuse_server, aa_control, quiet_wait, distribution)
    else:
        plan, drawn = _plans(manifest, [e.name for e in engines], settings, alone, strategies, tasks, runs, seed,
                             aa_control, retakes, (max_rounds or DEFAULT_MAX_ROUNDS) if adding else None)
    if alone and (until is not None or reuse_server or aa_control or quiet_wait):
        raise KitError("--distribution N draws the sampling study alone: --until, --reuse-server, --aa-control and "
                       "--quiet-wait concern timed rounds, which it has none of")
    # only the models this plan measures with: `--strategy baseline` needs no drafter
    model_paths = ensure(manifest, models_dir, download=True, log=log,
                                 strategies=[s.id for s in plan.strategies])
    local_preflight(manifest, plan, model_paths)  # a wrong file costs no build
    if meta is None:  # each planned build's image (one for a manifest of one build), found or built on every engine
        records = {b: _image(trusted.on_build(b), engines, build_missing, log) for b in manifest.build_names()
                   if any(s.build == b for s in plan.strategies)}
    record = next(iter(records.values()))
    for e in engines:
        require_ready(e, manifest, models_dir)
    if until is not None or extend is not None:
        max_rounds = max_rounds or DEFAULT_MAX_ROUNDS
        if max_rounds < plan.runs:
            raise KitError(f"--max-rounds {max_rounds} is fewer than the {plan.runs} planned runs")
    for r in records.values():
        check_image(engines, r, log)
    setups = device_setups(manifest, engines, record)
    paths_by_host = {e.name: e.place_models(model_paths, log) for e in engines}
    check_model_files(plan, engines, paths_by_host, records, manifest)
    protocol = PROTOCOLS["reuse-server" if reuse_server else "fresh-container"]()
    if meta is None:
        rd = RunDir.create(results_dir, run_id or new_run_id(manifest.name))
        meta = metadata.for_run(rd.run_id, manifest, plan, protocol.name, record, model_paths,
                               {e.name: host_facts(e, record.tag, setups[e.name]) for e in engines},
                               _bandwidth(manifest, engines), until, max_rounds, aa_control,
                               confirm_rounds(manifest, plan.runs), quiet_wait,
                               {b: r for b, r in records.items() if b}, drawn.as_meta() if drawn else None)
        rd.write_meta(meta)
        record.write(rd.path / "build.json")  # the build beside the results (run.json has it too)
    elif changes:
        _say_changes(rd, meta, changes, plan, log)
    if extend is None and until is not None:
        extend = converge(until)
    out = _execute(manifest, plan, engines, rd, protocol, records, paths_by_host, log, progress,
                   {h: s.access for h, s in setups.items()}, extend, max_rounds or DEFAULT_MAX_ROUNDS, drawn, load)
    told = said(rd.path) if said is not None else ""
    return out + (f"\n\n{told}" if told else "")


def _plans(manifest: mf.Manifest, hosts: list[str], settings: mf.Distribution | None, alone: bool,
           strategies: list[str] | None, tasks: list[str] | None, runs: int | None, seed: int | None,
           aa_control: bool, retakes: int | None, max_rounds: int | None) -> tuple[Plan, study.Study | None]:
    """The timed plan and the sampling study of a run (None: no study); a study drawn alone plans no timed
    measurement (0 runs) and names the strategies and tasks it samples. A selection (--strategy, --task-id) that
    leaves the study nothing draws none, or for a study drawn alone is an error."""
    picked_s, picked_t = select(manifest, strategies, tasks)
    ids_s, ids_t = [s.id for s in picked_s], [t.id for t in picked_t]
    if not alone:
        plan = make_plan(manifest, hosts, strategies=strategies, tasks=tasks, runs=runs, shuffle_seed=seed,
                         aa_control=aa_control, retakes=retakes, max_rounds=max_rounds)
        return plan, (study.make_study(manifest, settings, hosts, plan.shuffle_seed, ids_s, ids_t)
                      if settings is not None else None)
    assert settings is not None
    seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    drawn = study.make_study(manifest, settings, hosts, seed, ids_s, ids_t)
    if drawn is None:
        raise KitError("--distribution: the selected strategies and tasks leave the sampling study nothing to draw "
                       f"(it samples {', '.join(settings.strategies)} on "
                       f"{', '.join(f'{t}/{p}' for t, p in settings.prompts)})")
    sids = {a.strategy.id for a in drawn.arms}
    tids = {t.id for t, _ in drawn.prompts}
    return Plan([s for s in manifest.strategies if s.id in sids], [t for t in manifest.tasks if t.id in tids], 0,
                seed, hosts), drawn


def _load_plan(manifest: mf.Manifest, engines: list[Engine], seed: int | None, until: float | None,
               reuse_server: bool, aa_control: bool, quiet_wait: float | None,
               distribution: int | None) -> tuple[Plan, None]:
    """The plan of a run of the load study alone: no timed measurement (0 runs), the study's strategies and
    tasks; the flags that concern timed rounds or several hosts are refused in one line."""
    ls = manifest.load
    if ls is None:
        raise KitError(f"{display_path(manifest.path)}: --load: the manifest has no `load:` block")
    if until is not None or reuse_server or aa_control or quiet_wait or distribution:
        raise KitError("--load measures the load study alone: --until, --reuse-server, --aa-control, --quiet-wait "
                       "and --distribution concern timed rounds or the sampling study, which it has none of")
    if len(engines) > 1:
        raise KitError(f"--load measures on one host ({len(engines)} given): a level's servers share its machine")
    seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    tids = {t for t, _ in ls.prompts}
    return Plan([s for s in manifest.strategies if s.id in ls.strategies], [t for t in manifest.tasks if t.id in tids],
                0, seed, [engines[0].name]), None


def _check_flags(until: float | None, retakes: int | None, quiet_wait: float | None) -> None:
    if until is not None and not 0 < until < 1:
        raise KitError(f"--until: expected a fraction between 0 and 1 such as 5% or 0.05, got {until}")
    if retakes is not None and retakes < 0:
        raise KitError(f"--retakes: expected 0 or more, got {retakes}")
    if quiet_wait is not None and not 0 <= quiet_wait <= MAX_QUIET_WAIT_S:
        raise KitError(f"--quiet-wait: expected 0 to {MAX_QUIET_WAIT_S} seconds, got {fm.plain(quiet_wait)}")


def _say_changes(rd: RunDir, meta: runmeta.RunMeta, changes: PlanChanges, plan: Plan,
                 log: Callable[[str], None]) -> None:
    """A resume's flags into run.json (the plan's count too, where runs grew), each change said in one line."""
    plan_meta = dataclasses.replace(meta.plan, measurements=len(plan.items)) if "runs" in changes else meta.plan
    rd.update_meta(plan=plan_meta)
    said = {"runs": lambda v: f"{v} runs per cell (rounds added after the planned ones)",
            "retake_cap": lambda v: f"at most {v} retakes in the run (those already made count)",
            "quiet_wait_s": lambda v: f"a quiet wait of up to {fm.plain(v)} s before each measurement" if v else
            "no quiet wait"}
    log(f"resume {rd.run_id}: " + "; ".join(said[k](v) for k, v in changes.items()))


#: Decides a run's next round after its planned ones: the cells to run and a line saying why, or None when done
#: (with the line saying how it ended). Called with the run folder and the rounds run so far.
Extender = Callable[[RunDir, int], tuple[list[CellKey] | None, str]]


def converge(target: float) -> Extender:
    """`--until`: the next round runs the cells whose speedup interval is still wider than `target`, and their
    baselines (harness/analysis/convergence.py)."""
    def decide(rd: RunDir, last: int) -> tuple[list[CellKey] | None, str]:
        meta = rd.read_meta()
        conv = cv.convergence(CellIndex(rd.measurements()), {s.id: s.baseline for s in meta.planned_strategies()},
                              target)
        if conv.done:
            return None, f"until ±{fm.pct(target)}: every cell converged after {last} rounds"
        open_cells = ", ".join(f"{c.key.strategy}/{c.key.task}" + (f" ±{fm.pct(c.half_width)}"
                                                                    if c.half_width is not None else "")
                               for c in conv.cells if not c.converged)
        return conv.to_run, (f"until ±{fm.pct(target)}: {len(conv.pending)} cell(s) not converged after {last} rounds: "
                             f"{open_cells}")
    return decide


def device_setups(manifest: mf.Manifest, engines: list[Engine], record: BuildRecord) -> dict[str, devices.Setup]:
    """Each host's devices for the image's backend (harness/hosts/devices.py); a host where no device fits (a
    Vulkan image that sees only a software device, unless the manifest measures on one) stops the run here."""
    backend = backends.get(record.backend)
    setups = {}
    for e in engines:
        s = devices.setup(e, backend, record.tag, manifest.hardware.software_device)
        if s.problem:
            raise KitError(f"{e.name}: {s.problem}")
        setups[e.name] = s
    return setups


def host_facts(engine: Engine, image: str, setup: devices.Setup) -> runmeta.HostFacts:
    """The host's facts (harness/hosts/environment.py) and, for a GPU backend, its devices."""
    gpu = backends.get(setup.access.backend).gpu
    return runmeta.HostFacts(**environment.facts(engine, image), devices=setup.facts() if gpu else None)


def image_flavours(engine: Engine, record: BuildRecord) -> set[str] | None:
    """The drafter flavours the image's llama.cpp knows (its label, read from the source at build time), or
    None when the image predates the label."""
    try:
        img = engine.image(record.tag)
    except engine.lost_errors:
        img = None
    label = None if img is None else img.labels.get(f"{LABEL_PREFIX}.spec-flavours")
    return None if label is None else {f for f in label.split(",") if f}


def local_preflight(manifest: mf.Manifest, plan: Plan, model_paths: dict[str, Path]) -> None:
    """The pre-flight rules that need no image, on the files here, before any image is built or engine used: the
    drafter flavours are those of the pinned source when it has been fetched, else every flavour is assumed (so
    only what no image could load is refused); `check_model_files` checks the flavours against the image later."""
    def flavours_of(build: str | None) -> dict[str, bool] | None:  # each build's own source, when fetched
        tree = source.cached_tree(manifest.for_build(build))
        return preflight.supported_flavours(tree) if tree is not None else None

    problems = per_build.check_strategies(manifest, plan.strategies, lambda k: gguf_facts.read_facts(model_paths[k]),
                                          flavours_of)
    if problems:
        head = "the model files do not fit their strategies (checked before any build; nothing was started)"
        raise KitError(head + (": " + problems[0] if len(problems) == 1 else
                               f"; {len(problems)} problems:\n  " + "\n  ".join(problems)))


def check_model_files(plan: Plan, engines: list[Engine], paths_by_host: dict[str, dict[str, Path]],
                      records: dict[str | None, BuildRecord], manifest: mf.Manifest) -> None:
    """The pre-flight of model files on every host, before any container starts: each strategy's files read from
    their GGUF headers (over the host's connection, not whole) against its spec type and the flavours of its own
    build's image."""
    for e in engines:
        paths = paths_by_host[e.name]
        cache: dict[str, gguf_facts.ModelFacts] = {}

        def facts_of(key: str, e: Engine = e, paths: dict[str, Path] = paths,
                     cache: dict[str, gguf_facts.ModelFacts] = cache) -> gguf_facts.ModelFacts:
            if key not in cache:
                where = f"{e.name}:{paths[key]}" if e.name != "local" else str(paths[key])
                cache[key] = gguf_facts.facts_from_reader(lambda n: e.read_head(paths[key], n), where)
            return cache[key]

        problems = per_build.check_strategies(manifest, plan.strategies, facts_of,
                                              lambda b, e=e: image_flavours(e, records[b]))
        if problems:
            head = f"{e.name}: the model files do not fit their strategies (no container was started)"
            raise KitError(head + (": " + problems[0] if len(problems) == 1 else
                                   f"; {len(problems)} problems:\n  " + "\n  ".join(problems)))


def _execute(manifest: mf.Manifest, plan: Plan, engines: list[Engine], rd: RunDir, protocol: MeasurementProtocol,
             records: dict[str | None, BuildRecord], paths_by_host: dict[str, dict[str, Path]],
             log: Callable[[str], None], progress: bool, access: dict[str, devices.Access],
             extend: Extender | None = None, cap: int = DEFAULT_MAX_ROUNDS, drawn: study.Study | None = None,
             load: bool = False) -> str:
    record = next(iter(records.values()))
    meta = rd.read_meta()
    ctx = Context(rd.run_id, manifest, record.tag, record.backend, paths_by_host, lambda e, w: None,
                  access, per_build.images(records), meta.plan.quiet_wait_s or 0.0)
    proto = "NAIVE reuse-server protocol (caches carry over)" if protocol.name == "reuse-server" \
        else "one fresh container each"
    wait = f"; waiting up to {fm.plain(ctx.quiet_wait_s)} s for a quiet host before each" if ctx.quiet_wait_s else ""
    if load:
        lines = load_block.describe(manifest.load)
        log(f"run {rd.run_id}: the load study alone; {lines[0]}; {lines[-1].strip()}")
    elif plan.items or drawn is None:
        log(f"run {rd.run_id}: {plan.describe()}, {proto}{wait}; shuffle seed {plan.shuffle_seed}")
    if drawn is not None:
        log(f"run {rd.run_id}: {drawn.describe()}; shuffle seed {plan.shuffle_seed}")
    if plan.items or drawn is not None:  # a suite's later turns: the target's own earlier answers, made once
        ctx.conversations = conversations.prepare(ctx, engines[0], plan, rd, log)
    executor = Executor(ctx, engines, protocol, rd, log=log, progress=progress, retake_cap=meta.plan.retake_cap or 0,
                        seed=plan.shuffle_seed, baselines={s.id: s.baseline for s in meta.planned_strategies()})
    for extra in meta.plan.extra_rounds:  # rounds an interrupted run had already decided on (--until, confirmation)
        plan.add_rounds(extra.round, extra.round, set(extra.cells))
    try:
        if backends.get(ctx.backend).shader_cache and plan.items:
            for e in engines:
                warm_shader_cache(ctx, e, plan.strategies, plan.tasks[0], log)
        counts = executor.execute(plan.items)
        confirmed = meta.plan.confirm_from() is not None  # decided before an interruption: replayed above
        if extend is not None and not confirmed:
            _extend(plan, executor, rd, counts, log, extend, cap)
        if meta.plan.confirm_rounds and plan.sweeps() and not confirmed:
            _confirm(plan, executor, rd, counts, log)
        sampled = _draw(ctx, engines, drawn, rd, log, progress) if drawn is not None else ""
        sampled += _load(ctx, engines[0], rd, log) if load else ""
    except KeyboardInterrupt:
        raise KitError(f"interrupted; finished measurements are saved in {rd.path}; "
                       f"resume with `invoke run --resume {rd.run_id}`") from None
    return (f"run {rd.run_id}: {counts['ok']} ok, {counts['failed']} failed"
            + (f", {counts['skipped']} already recorded" if counts["skipped"] else "")
            + (f", {counts['retakes']} measured again (disturbed by other work, or failed)"
               if counts["retakes"] else "")
            + sampled + f"; results in {rd.path}" + _to_complete(rd))


def _draw(ctx: Context, engines: list[Engine], drawn: study.Study, rd: RunDir, log: Callable[[str], None],
          progress: bool) -> str:
    """The sampling study after the timed rounds, the run's status kept true while it draws; what it drew, in
    words for the run's last line."""
    rd.update_meta(status="running")
    try:
        c = sampling.draw(ctx, engines, drawn, rd, log, progress)
    except BaseException:
        meta = rd.read_meta()
        rd.update_meta(status="interrupted", interruptions=[*meta.interruptions, runmeta.Interruption(
            now_iso(), len(rd.done_ids()), len(rd.samples()))])
        raise
    rd.update_meta(status="complete")
    return (f"; sampling study: {c['ok']} batches ({c['samples']} samples) drawn, {c['failed']} failed"
            + (f", {c['skipped']} already recorded" if c["skipped"] else ""))


def _load(ctx: Context, engine: Engine, rd: RunDir, log: Callable[[str], None]) -> str:
    """The load study after the (empty) timed rounds, the run's status kept true while it measures; what it
    measured, in words for the run's last line."""
    rd.update_meta(status="running")
    try:
        c = load_run.draw(ctx, engine, rd, log)
    except BaseException:
        meta = rd.read_meta()
        rd.update_meta(status="interrupted", interruptions=[*meta.interruptions, runmeta.Interruption(
            now_iso(), len(rd.done_ids()))])
        raise
    rd.update_meta(status="complete")
    return (f"; load study: {c['ok']} levels measured, {c['failed']} failed"
            + (f", {c['skipped']} already recorded" if c["skipped"] else ""))


def _to_complete(rd: RunDir) -> str:
    """Where cells lack a verdict the run could still give them: how many, and the command that does it."""
    c = completion.of(rd.read_meta(), CellIndex(rd.measurements()))
    if c.command is None:
        return ""
    cells = len(c.fillable) or len(c.short_planned)
    what = "measuring again what does not count" if c.fillable else "more rounds"
    return f"\n{cells} cell(s) have no verdict that {what} would give them: `{c.command}`"


def _extend(plan: Plan, executor: Executor, rd: RunDir, counts: dict[str, int], log: Callable[[str], None],
            decide: Extender, cap: int) -> None:
    """Add rounds after the planned ones, one at a time, of the cells `decide` names, until it says done or the
    round cap is reached; the rounds are recorded in run.json first, so a resumed run replays them."""
    while True:
        last = max((i.round for i in plan.items), default=0)
        cells, why = decide(rd, last)
        if cells is None:
            log(why)
            return
        if last >= cap:
            log(f"{why}; stopped at the cap of {cap} rounds")
            return
        meta = rd.read_meta()
        meta.plan.extra_rounds.append(runmeta.AddedRound(last + 1, tuple((h, s, t) for h, s, t in cells)))
        rd.update_meta(plan=meta.plan)
        log(f"{why}; round {last + 1} for {len(cells)} cell(s)")
        more = executor.execute(plan.add_rounds(last + 1, last + 1, {tuple(c) for c in cells}))
        for k in ("ok", "failed", "retakes"):
            counts[k] += more[k]


def _confirm(plan: Plan, executor: Executor, rd: RunDir, counts: dict[str, int], log: Callable[[str], None]) -> None:
    """After the sweep's rounds: fresh rounds of each sweep's best two combinations (by the geometric mean of
    their paired speedups over the tasks) and the baselines they pair with, each at every concurrency level of its
    entry (Plan.confirm_strategies), on every task, on each host. The best of many noisy combinations is biased
    upward (the winner's curse); the confirmation rounds are not, and the serving comparison of the winner rests on
    them alone."""
    meta = rd.read_meta()
    baselines = {s.id: s.baseline for s in meta.planned_strategies()}
    index = CellIndex(rd.measurements())
    tasks = [t.id for t in plan.tasks]
    cells: list[list[str]] = []
    chosen: list[str] = []
    for host in plan.hosts:
        for family, members in plan.sweeps().items():
            ratios = tuning.sweep_ratios(index, host, [(s.id, baselines.get(s.id)) for s in members], tasks)
            top = [c for c, _ in sweep.rank(ratios)[:2]]
            if not top:
                log(f"{host}: sweep {family}: no paired rounds to choose from; no confirmation")
                continue
            n = meta.plan.confirm_rounds
            log(f"{host}: sweep {family}: confirming {' and '.join(top)} in {n} fresh round{'s' if n > 1 else ''}")
            chosen += top
            for sid in plan.confirm_strategies(top, baselines):
                cells += [[host, sid, t] for t in tasks if [host, sid, t] not in cells]
    if not cells:
        return
    first = max((i.round for i in plan.items), default=0) + 1
    last = first + meta.plan.confirm_rounds - 1
    for r in range(first, last + 1):
        meta.plan.extra_rounds.append(runmeta.AddedRound(r, tuple((h, s, t) for h, s, t in cells), runmeta.CONFIRM,
                                                         tuple(dict.fromkeys(chosen))))
    rd.update_meta(plan=meta.plan)
    more = executor.execute(plan.add_rounds(first, last, {tuple(c) for c in cells}))
    for k in ("ok", "failed", "retakes"):
        counts[k] += more[k]
