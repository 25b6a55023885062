"""A run folder checked against its own plan before any figure is drawn from it.

A run folder may come from someone else (a bundle, a shared results folder), and its records decide verdicts: a
record of a round nobody planned would narrow an interval, a retake that names another cell's measurement would
drop that one, a confirmation moved to round 1 would erase the sweep, a record of two streams under a one-client
strategy would be read as one. So run.json's plan must be one the kit could have made (the rounds it added follow
the planned ones, one after another; confirmation rounds come last, as many as it says, of the combinations it
names and their baselines, and in a complete run of a sweep they are there; rounds --until adds only in a run
that could add them), and every record must be of a
cell of its round, with the measurement id the plan gives it and the stream count of its strategy, and a retake
only of a measurement of the same cell, prompt and round that other work disturbed or that failed, each at most
once (a retake of a retake names the one before it). What does not fit is one line naming the file, the line or
field, and what was expected; nothing is counted silently. The same holds for a sampling study (plan.distribution,
samples.jsonl): its arms, batches and requests are the ones its settings make, and every batch is of its arm,
prompt and round, with the seeds, temperature, top-k and token count the plan gives it, each recorded once. In a
run of several builds every strategy runs on one of them, the build its name says (`<id>[build=<name>]`) is the
one it ran on, and its baseline is of that build: a forged name would pair a strategy with another build's
baseline or print one build's figures under another's."""

from __future__ import annotations

from collections.abc import Iterable

from harness import KitError
from harness import formatter as fm
from harness.intake.builds import BUILD_PART, across
from harness.store import result
from harness.store.runmeta import MAX_MEASUREMENTS, AddedRound, RunMeta, StrategyMeta, StudyMeta


def plan_problem(meta: RunMeta) -> str | None:
    """The first way run.json's plan is not one the kit makes, as `<field>: <what>`, or None."""
    plan = meta.plan
    prompts = {t.id: len(t.prompts) for t in meta.tasks}
    made = len(plan.strategies) * sum(prompts[t] for t in plan.tasks) * plan.runs * len(plan.hosts)
    if plan.measurements != made:
        return (f"plan.measurements: {plan.measurements}, but its strategies, prompts, runs and hosts make {made} "
                "measurements")
    if plan.until is not None and plan.max_rounds is None:
        return "plan.until is set without plan.max_rounds: a run with --until records its round cap"
    cells = {(h, s, t) for h in plan.hosts for s in plan.strategies for t in plan.tasks}
    confirm_at = plan.confirm_from()
    total = plan.measurements
    for k, x in enumerate(plan.extra_rounds):
        where = f"plan.extra_rounds[{k}]"
        if x.round != plan.runs + 1 + k:
            return (f"{where}.round: {x.round}, expected {plan.runs + 1 + k} (the rounds a run adds follow its "
                    f"{plan.runs} planned ones, one after another)")
        listed = list(x.cells)
        bad = next((c for c in listed if c not in cells), None)
        if bad is not None:
            return f"{where}.cells: {list(bad)!r} is not a cell of the plan (its hosts, strategies and tasks)"
        if len(set(listed)) != len(listed):
            return f"{where}.cells: a cell is listed twice"
        total += sum(prompts[c[2]] for c in listed)
        if total > MAX_MEASUREMENTS:
            return f"{where}: the plan and its added rounds make more than {fm.count(MAX_MEASUREMENTS)} measurements"
        if x.confirms:
            problem = _confirmation(meta, x, plan.extra_rounds[k - 1] if k and confirm_at != x.round else None)
        elif confirm_at is not None and x.round > confirm_at:
            problem = "a round added after the confirmation rounds, which come last"
        elif plan.max_rounds is None:
            problem = "a round added after the planned ones, but the run could add none (no --until: plan.max_rounds)"
        elif x.round > plan.max_rounds:
            problem = f"round {x.round} beyond the run's cap of {plan.max_rounds} rounds (plan.max_rounds)"
        else:
            problem = None
        if problem:
            return f"{where}: {problem}"
    swept = any(s.sweep for s in meta.planned_strategies())
    if (confirm_at is None and swept and plan.confirm_rounds and meta.status == "complete"
            and any(not x.confirms for x in plan.extra_rounds)):
        return ("plan.extra_rounds: a complete run of a sweep whose added rounds include no confirmation round "
                f"(purpose: confirm), though plan.confirm_rounds is {plan.confirm_rounds}")
    if confirm_at is not None and plan.extra_rounds[-1].round - confirm_at + 1 != plan.confirm_rounds:
        n = plan.extra_rounds[-1].round - confirm_at + 1
        return f"plan.extra_rounds: {n} confirmation rounds, but plan.confirm_rounds is {plan.confirm_rounds}"
    return _strategies_problem(meta) or _builds_problem(meta) or _study_problem(meta)


def _named_build(sid: str) -> str | None:
    """The build a strategy's name says it ran on (the last part inside its brackets), or None."""
    if not sid.endswith("]") or "[" not in sid:
        return None
    last = sid[sid.rindex("[") + 1:-1].split(",")[-1]
    return last[len(BUILD_PART):] if last.startswith(BUILD_PART) else None


def _builds_problem(meta: RunMeta) -> str | None:
    """Every strategy of a run of several builds runs on one of them, the one its name says, against a baseline
    of the same build; the run's `build` is its first build's record; a run of one build names none."""
    by_id = {s.id: s for s in meta.strategies}
    names = list(meta.builds)
    if names and meta.build != meta.builds[names[0]]:
        return f"build: not the record of the first build ({names[0]!r}) of builds"
    for i, s in enumerate(meta.strategies):
        said = _named_build(s.id)
        if not names:
            if said is not None:
                return f"strategies[{i}].id: {s.id!r} names build {said!r}, but the run names no builds"
            continue
        if s.build is None:
            return f"strategies[{i}].build: none, but the run measures builds {names}: each strategy runs on one"
        if said is not None and said != s.build:
            return f"strategies[{i}].id: {s.id!r} names build {said!r}, but it ran on build {s.build!r}"
        base = by_id.get(s.baseline) if s.baseline else None
        if base is not None and base.build != s.build:
            return (f"strategies[{i}].baseline: {s.baseline!r} ran on build {base.build!r}, not on {s.id!r}'s "
                    f"build {s.build!r}: a strategy is paired with its own build's baseline")
    return _pairs_problem(meta) if names else None


def _pairs_problem(meta: RunMeta) -> str | None:
    """A build comparison pairs one strategy across builds by its name without the build's part: on each build
    that name is one strategy, and on every build it has the same spec type, arguments and baseline (a renamed
    strategy would print another strategy's figures against it)."""
    first: dict[str, tuple[int, StrategyMeta]] = {}
    on_build: set[tuple[str | None, str]] = set()
    for i, s in enumerate(meta.strategies):
        key = across(s.id, s.build)
        if (s.build, key) in on_build:
            return (f"strategies[{i}].id: {s.id!r} is a second strategy named {key!r} on build {s.build!r}: a build "
                    "comparison pairs one strategy per name and build")
        on_build.add((s.build, key))
    for i, s in enumerate(meta.strategies):
        key = across(s.id, s.build)
        if key not in first:
            first[key] = (i, s)
            continue
        j, f = first[key]
        base = across(s.baseline, s.build) if s.baseline else None
        f_base = across(f.baseline, f.build) if f.baseline else None
        for field, mine, theirs in (("spec_type", s.spec_type, f.spec_type), ("args", list(s.args), list(f.args)),
                                    ("baseline", base, f_base), ("parallel", s.parallel, f.parallel)):
            if mine != theirs:
                return (f"strategies[{i}].{field}: {mine!r}, but {f.id!r} (strategies[{j}]), the same strategy "
                        f"{key!r} on build {f.build!r}, has {theirs!r}: a build comparison pairs the same "
                        "strategy on each build")
    return None


def _confirmation(meta: RunMeta, x: AddedRound, before: AddedRound | None) -> str | None:
    """A confirmation round: the combinations it names (at most two per sweep and host, of a sweep the run made),
    each at the levels of its entry, with the baselines they pair with at every level of theirs, every named one
    measured, the same in every confirmation round."""
    if before is not None and (before.cells != x.cells or before.combinations != x.combinations):
        return "the confirmation rounds measure different cells; every one measures the same"
    by_id = {s.id: s for s in meta.planned_strategies()}
    combos = x.combinations
    if combos is None:  # the cells say which: each sweep member they list
        combos = tuple(dict.fromkeys(c[1] for c in x.cells if c[1] in by_id and by_id[c[1]].sweep))
    if len(set(combos)) != len(combos) or not all(c in by_id and by_id[c].sweep for c in combos):
        return f"combinations: {list(combos)!r} are not distinct combinations of one of the run's sweeps"
    chosen: dict[tuple[str, str], set[tuple]] = {}  # (host, family) -> the swept values confirmed there
    for host, sid, _ in x.cells:
        if sid in by_id and by_id[sid].sweep:
            chosen.setdefault((host, by_id[sid].family_id), set()).add(by_id[sid].sweep)
    if any(len(values) > 2 for values in chosen.values()):
        return "a confirmation measures a sweep's best two combinations on a host, not more"
    allowed: set[str] = set()
    for c in combos:
        levels = [s for s in by_id.values() if s.family_id == by_id[c].family_id and s.sweep == by_id[c].sweep]
        allowed |= {s.id for s in levels}
        bases = {by_id[b].family_id for s in levels if (b := s.baseline) in by_id}
        allowed |= {s.id for s in by_id.values() if s.family_id in bases}
    listed = {c[1] for c in x.cells}
    if not listed <= allowed:
        return (f"cells: {sorted(listed - allowed)[0]!r} is neither a confirmed combination (at a level of its "
                "entry) nor a baseline one pairs with")
    if not set(combos) <= listed:
        return "cells: a confirmed combination is not measured in its confirmation round"
    return None


def _strategies_problem(meta: RunMeta) -> str | None:
    """A combination's sweep values are the ones its arguments give llama-server (a value shown in a plot or a
    table is the one measured)."""
    for i, s in enumerate(meta.strategies):
        pairs = set(zip(s.args, s.args[1:], strict=False))
        for flag, value in s.sweep:
            if (flag, value) not in pairs:
                return f"strategies[{i}].sweep: {flag} {value!r} is not in its args"
    return None


def _study_problem(meta: RunMeta) -> str | None:
    """The sampling study's plan: arms of the run's strategies, each baseline arm its own, every other one compared
    with a baseline arm of the same target, and as many batches and requests as its settings make (bounded like
    the measurements)."""
    d = meta.plan.distribution
    if not d:
        return None
    arms = {a.id: a for a in d.arms}
    if len(arms) != len(d.arms):
        return "plan.distribution.arms: an arm id appears twice"
    for i, a in enumerate(d.arms):
        base = arms.get(a.baseline)
        if base is None or base.role != "baseline" or (a.role == "baseline") != (a.id == a.baseline):
            return f"plan.distribution.arms[{i}].baseline: {a.baseline!r} is not a baseline arm of the study"
        if a.role != "strategy" and a.strategy != base.strategy:
            return f"plan.distribution.arms[{i}].strategy: a {a.role} arm samples its baseline's server"
        if a.strategy not in meta.plan.strategies:
            return f"plan.distribution.arms[{i}].strategy: {a.strategy!r} is not one the run planned"
    per_host = len(d.settings.prompts) * len(arms)
    requests = per_host * d.settings.samples * len(meta.plan.hosts)
    if requests > MAX_MEASUREMENTS:
        return (f"plan.distribution: {fm.count(requests)} requests; a run draws at most "
                f"{fm.count(MAX_MEASUREMENTS)} samples")
    problem = _arms_problem(d)
    if problem:
        return problem
    batches = per_host * d.rounds * len(meta.plan.hosts)
    for key, made, said in (("batches", batches, d.batches), ("requests", requests, d.requests)):
        if said is not None and said != made:
            return f"plan.distribution.{key}: {said}, but its arms, prompts, samples and hosts make {made}"
    return None


_ARM_FIELDS = ("id", "strategy", "role", "temperature", "top_k", "first_seed", "baseline")


def planned_arms(d: StudyMeta) -> list[tuple]:
    """The arms a study's settings make, as (id, strategy, role, temperature, top_k, first_seed, baseline), for the
    strategy arms it lists (harness/run/study.py `arms`): each baseline's own, reference and control arms before
    the first strategy compared with it."""
    s = d.settings
    kind, value = s.control
    control_t = value if kind == "temperature" else s.temperature
    control_k = int(value) if kind == "top_k" else s.top_k
    out: list[tuple] = []
    bases: set[str] = set()
    for a in d.arms:
        if a.role != "strategy":
            continue
        b = a.baseline
        if b not in bases:
            bases.add(b)
            out += [(b, b, "baseline", s.temperature, s.top_k, s.seed, b),
                    (f"{b}@reference", b, "reference", s.temperature, s.top_k, s.seed + s.samples, b),
                    (f"{b}@control", b, "control", control_t, control_k, s.seed, b)]
        out.append((a.strategy, a.strategy, "strategy", s.temperature, s.top_k, s.seed, b))
    return out


def _arms_problem(d: StudyMeta) -> str | None:
    """The study's arms are the ones its settings make (temperature, top-k, control, seeds, a reference arm for
    every baseline), in the order the kit lists them."""
    want = planned_arms(d)
    got = [tuple(getattr(a, f) for f in _ARM_FIELDS) for a in d.arms]
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        for f, x, y in zip(_ARM_FIELDS, g, w, strict=True):
            if x != y:
                return (f"plan.distribution.arms[{i}].{f}: {x!r}, but the study's settings (temperature, top_k, "
                        f"control, seed, samples) make {y!r} there")
    if len(got) != len(want):
        return (f"plan.distribution.arms: {len(got)} arms, but its settings make {len(want)} (each baseline's "
                "baseline, reference and control arms, then the strategies compared with it)")
    return None


def batch_problem(meta: RunMeta, rec: result.BatchRecord, seen: set[str]) -> str | None:
    """Why one batch of samples.jsonl (its arm, prompt and host already known to the study) does not fit the plan,
    or None."""
    d = meta.plan.distribution
    arm = d.arm(rec["arm"]) if d else None
    if d is None or arm is None:
        return f"arm {rec['arm']!r} is not one of the study's"
    rnd, rounds = rec["round"], d.rounds
    if not 1 <= rnd <= rounds:
        return f"round {rnd} is not one the study planned (rounds 1 to {rounds})"
    want = f"{rec['host']}/{rec['arm']}/{rec['task']}/{rec['prompt']}/{rnd}"
    if rec["batch_id"] != want:
        return f"batch id {rec['batch_id']!r}, expected {want!r} for its arm, prompt and round"
    if want in seen:
        return f"batch id {want!r} appears twice"
    spec = meta.strategy(rec["strategy"]).spec_type
    if rec["spec_type"] != spec:
        return f"strategy {rec['strategy']!r} has spec type {rec['spec_type']!r} here and {spec!r} in run.json"
    for key, planned in (("temperature", arm.temperature), ("top_k", arm.top_k), ("n_predict", d.settings.tokens)):
        if rec[key] != planned:
            return f"{key} {rec[key]!r}, but arm {arm.id!r} is sampled with {planned!r}"
    first = arm.first_seed + (rnd - 1) * d.settings.batch
    planned_seeds = list(range(first, arm.first_seed + min(rnd * d.settings.batch, d.settings.samples)))
    seeds = [x["seed"] for x in rec["samples"]]
    if seeds != planned_seeds[:len(seeds)] or (rec["status"] == "ok" and len(seeds) != len(planned_seeds)):
        return (f"seeds {seeds[:3]}{'...' if len(seeds) > 3 else ''} ({len(seeds)}), but round {rnd} of arm "
                f"{arm.id!r} draws seeds {first} to {planned_seeds[-1]}")
    long = next((i for i, x in enumerate(rec["samples"]) if len(x["tokens"]) > d.settings.tokens), None)
    if long is not None:
        got = len(rec['samples'][long]['tokens'])
        return f"samples[{long}]: {got} tokens, more than the {d.settings.tokens} asked for"
    for i, x in enumerate(rec["samples"]):
        n = len(x["tokens"])
        for key in ("logprobs", "top"):
            if x.get(key) is not None and len(x[key]) != n:
                return f"samples[{i}].{key}: {len(x[key])} entries for its {n} tokens (one per token)"
        if x["draft_n_accepted"] > x["draft_n"]:
            return f"samples[{i}].draft_n_accepted {x['draft_n_accepted']} is above its draft_n {x['draft_n']}"
    return None


def check_samples(meta: RunMeta, records: Iterable[tuple[int, result.BatchRecord]], where: str) -> None:
    """Refuse, in one line naming the file and the line, the first batch (line number, record) that does not fit
    the run's sampling study."""
    seen: set[str] = set()
    for n, rec in records:
        problem = batch_problem(meta, rec, seen)
        if problem:
            raise KitError(f"{where}: line {n}: {problem}; this record is not of this run as planned")
        seen.add(rec["batch_id"])


def check_plan(meta: RunMeta, where: str) -> None:
    """Refuse, in one line naming run.json and the field, a plan the kit does not make."""
    problem = plan_problem(meta)
    if problem:
        raise KitError(f"{where}: {problem}; this run.json was not written by the kit as it stands")


def record_id(meta: RunMeta, rec: result.ResultRecord) -> str:
    """The measurement id the plan gives a first take of this record's cell, prompt and round."""
    several = len(meta.task(rec["task"]).prompts) > 1
    return f"{rec['host']}/{rec['strategy']}/{rec['task']}" + (f"/{rec['prompt']}" if several else "") \
        + f"/{rec['round']}"


def record_problem(meta: RunMeta, rec: result.ResultRecord, seen: dict[str, result.ResultRecord],
                   retaken: set[str]) -> str | None:
    """Why one record (read after the records `seen`, by id) does not fit the plan, or None; `retaken` collects the
    first takes already retaken."""
    plan, rnd = meta.plan, rec["round"]
    if rec.get("run_index", rnd) != rnd:
        return f"run_index {rec.get('run_index')!r} differs from its round {rnd!r}"
    if not 1 <= rnd <= plan.runs:
        extra = next((x for x in plan.extra_rounds if x.round == rnd), None)
        if extra is None:
            return f"round {rnd} is not one the run planned (rounds 1 to {plan.runs}" + \
                (f" and the added rounds {plan.runs + 1} to {plan.extra_rounds[-1].round})"
                 if plan.extra_rounds else ")")
        if (rec["host"], rec["strategy"], rec["task"]) not in extra.cells:
            return f"round {rnd} does not measure {rec['strategy']}/{rec['task']} (run.json plan.extra_rounds)"
    if rec["measurement_id"] in seen:
        return f"measurement id {rec['measurement_id']!r} appears twice"
    s = meta.strategy(rec["strategy"])
    conc = rec.get("concurrency")
    streams = conc.get("streams") if isinstance(conc, dict) else None
    if (streams is not None and streams != s.parallel) or (streams is None and s.parallel > 1
                                                           and rec.get("status") == "ok"):
        return f"{streams or 1} concurrent stream(s), but strategy {s.id!r} is measured at {s.parallel}"
    command = [str(a) for a in rec.get("server_command") or []]
    slots = [command[i + 1] for i in range(len(command) - 1) if command[i] in ("--parallel", "-np")]
    if slots and slots[-1] != str(s.parallel):
        return f"its server ran {slots[-1]} slot(s), but strategy {s.id!r} is measured at {s.parallel}"
    counts = _counts_problem(rec)
    if counts:
        return counts
    first = rec.get("retake_of")
    if first is None:
        want = record_id(meta, rec)
        return None if rec["measurement_id"] == want else \
            f"measurement id {rec['measurement_id']!r}, expected {want!r} for its cell, prompt and round"
    return _retake_problem(meta, rec, seen.get(first), retaken)


def _retake_problem(meta: RunMeta, rec: result.ResultRecord, first: result.ResultRecord | None,
                    retaken: set[str]) -> str | None:
    if first is None:
        return f"retake_of {rec['retake_of']!r} names no measurement recorded before it"
    if any(first[k] != rec[k] for k in ("host", "strategy", "task", "prompt", "round")):
        return (f"retake_of {rec['retake_of']!r} names a measurement of another cell, prompt or round; a retake "
                "measures the same again")
    if first.get("status") == "ok" and not (first.get("interference") or {}).get("disturbed"):
        return (f"retake_of {rec['retake_of']!r} names a measurement that counts (ok, not disturbed): a retake "
                "measures again only one that other work disturbed or that failed")
    if rec["measurement_id"] != f"{rec['retake_of']}/retake":
        return f"measurement id {rec['measurement_id']!r}, expected {rec['retake_of'] + '/retake'!r}"
    if rec["retake_of"] in retaken:
        return f"{rec['retake_of']!r} is retaken twice"
    cap = meta.plan.retake_cap
    if cap is None:
        return "a retake in a run that planned none (run.json plan.retake_cap)"
    if len(retaken) >= cap:
        return (f"retake {len(retaken) + 1} of the run, but run.json plan.retake_cap allows {cap}: a run retakes at "
                "most as many measurements as its cap")
    retaken.add(rec["retake_of"])
    return None


def _order_problem(meta: RunMeta, rec: result.ResultRecord, k: int, rounds: dict[str, int]) -> str | None:
    """A record's `order` is its place among the records (the kit numbers them as it appends them), and with a
    fresh container per measurement a host's first takes go round by round (retakes may follow a later round after
    a resume): reordered records would move the first-run and drift checks."""
    if "order" in rec and rec["order"] != k:
        return f"order {rec['order']!r}, expected {k} (its place among the records: the kit numbers them as it appends)"
    if meta.protocol == "reuse-server" or rec.get("retake_of") is not None:
        return None
    last = rounds.get(rec["host"], 0)
    if rec["round"] < last:
        return (f"round {rec['round']} recorded after a measurement of round {last} on host {rec['host']!r}: a run "
                "measures round by round")
    rounds[rec["host"]] = rec["round"]
    return None


def _counts_problem(rec: result.ResultRecord) -> str | None:
    """What a record's counters say of one another: a share is within [0, 1], accepted drafts are drafted."""
    sv = rec.get("server") or {}
    if isinstance(sv.get("draft_n"), int) and isinstance(sv.get("draft_n_accepted"), int) \
            and sv["draft_n_accepted"] > sv["draft_n"]:
        return f"server.draft_n_accepted {sv['draft_n_accepted']} is above server.draft_n {sv['draft_n']}"
    acc = (rec.get("server_log") or {}).get("draft_acceptance")
    if isinstance(acc, dict) and acc.get("accepted", 0) > acc.get("generated", 0):
        return (f"server_log.draft_acceptance.accepted {acc['accepted']} is above its generated "
                f"{acc['generated']}")
    return None


def check_records(meta: RunMeta, records: Iterable[tuple[int, result.ResultRecord]], where: str) -> None:
    """Refuse, in one line naming the file and the line, the first record (line number, record) that does not
    fit the run's plan."""
    seen: dict[str, result.ResultRecord] = {}
    retaken: set[str] = set()
    rounds: dict[str, int] = {}  # host -> the round of its last first take
    for k, (n, rec) in enumerate(records):
        problem = record_problem(meta, rec, seen, retaken) or _order_problem(meta, rec, k, rounds)
        if problem:
            raise KitError(f"{where}: line {n}: {problem}; this record is not of this run as planned")
        seen[rec["measurement_id"]] = rec
