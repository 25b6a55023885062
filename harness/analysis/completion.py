"""What it would take to complete a run: the cells without a verdict that measuring again could give one, and the
one command that does it. The report ends each run's section with it (harness/report/results.py) and `invoke run`
ends with it (harness/run/runner.py).

A cell (a strategy against its baseline on one task) needs MIN_ROUNDS paired rounds for a verdict. It lacks one
that the run itself can fill when its planned rounds would give it enough but some of their measurements do not
count: not measured yet (an interrupted run), disturbed by other work, or failed where the cell succeeded elsewhere
(harness/analysis/gaps.py). `invoke run --resume` measures the first, and retakes the others within the run's cap
(`--retakes` raises it; the retakes already made count against it). A cell planned with fewer rounds than a
verdict needs is filled by more rounds: `--runs` on a resume adds them, where no round follows the planned ones."""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass, field

from harness import KitError
from harness.analysis import gaps
from harness.analysis.records import CellIndex, CellKey
from harness.analysis.speedups import MIN_ROUNDS, paired_logs
from harness.intake.bounded_yaml import parse_yaml
from harness.store import shapes
from harness.store.runmeta import RunMeta

#: The quiet wait the command suggests where other work ran during what it retakes.
SUGGESTED_QUIET_WAIT = "30s"


@dataclass(frozen=True)
class Completion:
    """The cells a resume can give a verdict, what it would measure, and the command (None: nothing to fill)."""

    fillable: tuple[CellKey, ...] = ()
    short_planned: tuple[CellKey, ...] = ()
    unmeasured: int = 0
    disturbed: int = 0
    failed: int = 0
    retakes_made: int = 0
    retake_cap: int | None = None
    command: str | None = None
    resumes: bool = True  # the command resumes the run (else it is a new run)
    flags: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> shapes.CompletionJson:
        def cell(k: CellKey) -> shapes.CellRef:
            return {"host": k.host, "strategy": k.strategy, "task": k.task}
        return {"fillable": [cell(k) for k in self.fillable], "short_planned": [cell(k) for k in self.short_planned],
                "unmeasured": self.unmeasured, "disturbed": self.disturbed, "failed": self.failed,
                "retakes_made": self.retakes_made, "retake_cap": self.retake_cap, "command": self.command,
                "resumes": self.resumes, "flags": self.flags}


def planned_slots(meta: RunMeta) -> set[gaps.Slot]:
    """Every measurement the run planned: the planned rounds, and the rounds added after them (--until,
    confirmation) with their cells."""
    prompts = {t.id: [p.id for p in t.prompts] for t in meta.tasks}
    out = {(h, s, t, p, r) for h in meta.plan.hosts for s in meta.plan.strategies for t in meta.plan.tasks
           for p in prompts[t] for r in range(1, meta.plan.runs + 1)}
    for x in meta.plan.extra_rounds:
        out |= {(h, s, t, p, x.round) for h, s, t in x.cells for p in prompts.get(t, [])}
    return out


def _rounds(slots: set[gaps.Slot], key: CellKey, baseline: str) -> set[int]:
    """Rounds in which some prompt of the cell has both its strategy's and its baseline's slot in `slots`."""
    by: dict[tuple[str, int], set[str]] = defaultdict(set)
    for h, s, t, p, r in slots:
        if h == key.host and t == key.task and s in (key.strategy, baseline):
            by[(p, r)].add(s)
    return {r for (_, r), ss in by.items() if len(ss) == 2}


def of(meta: RunMeta, index: CellIndex) -> Completion:
    """What completes this run (see the module)."""
    if meta.protocol == "reuse-server":
        return Completion()  # one server per strategy: nothing to retake, and the run is the naive one on purpose
    if meta.plan.runs == 0:
        return Completion()  # a sampling study drawn alone: no timed round to add (--resume draws what it lacks)
    planned = planned_slots(meta)
    figures = gaps.state(index.measurements, index.busy)  # what counts, as the figures count it
    st = gaps.state(index.measurements)  # what a resume retakes (harness/run/executor.py): disturbed ones too
    recorded = {gaps.slot_of(m) for m in index.measurements}
    unmeasured = planned - recorded
    reachable = set(figures.present) | {g.slot for g in st.gaps} | unmeasured
    fillable, short = [], []
    for host in meta.plan.hosts:
        for s in meta.planned_strategies():
            if not s.baseline:
                continue
            for t in meta.plan.tasks:
                key = CellKey(host, s.id, t)
                if len(paired_logs(index, key, s.baseline)) >= MIN_ROUNDS:
                    continue
                if len(_rounds(planned, key, s.baseline)) < MIN_ROUNDS:
                    short.append(key)
                elif len(_rounds(reachable & planned, key, s.baseline)) >= MIN_ROUNDS:
                    fillable.append(key)
    cap = meta.plan.retake_cap
    made = index.retakes
    base = Completion(tuple(fillable), tuple(short), len(unmeasured), sum(g.why == "disturbed" for g in st.gaps),
                      sum(g.why == "failed" for g in st.gaps), made, cap)
    if fillable:
        busy = {m.id for m in index.measurements if m.disturbed}  # a failure while other work ran included
        return _resume_command(meta, base, len(st.gaps), any(g.id in busy for g in st.gaps))
    if short:
        return _more_rounds_command(meta, base)
    return base


def _head(meta: RunMeta, resume: bool) -> list[str]:
    cmd = ["invoke", "run"] + (["--resume", meta.run_id] if resume else [])
    cmd += ["--manifest", meta.manifest.path or "MANIFEST"]
    for h in meta.plan.hosts:
        if h != "local":
            cmd += ["--host", h]
    return cmd


def _resume_command(meta: RunMeta, c: Completion, n_gaps: int, busy: bool) -> Completion:
    cmd = _head(meta, True)
    flags: dict[str, str] = {}
    need = c.retakes_made + n_gaps
    if n_gaps and need > (c.retake_cap or 0):
        flags["--retakes"] = str(need)
    if busy and not meta.plan.quiet_wait_s:
        flags["--quiet-wait"] = SUGGESTED_QUIET_WAIT
    for k, v in flags.items():
        cmd += [k, v]
    return Completion(c.fillable, c.short_planned, c.unmeasured, c.disturbed, c.failed, c.retakes_made,
                      c.retake_cap, shlex.join(cmd), True, flags)


def _more_rounds_command(meta: RunMeta, c: Completion) -> Completion:
    """Cells planned with too few rounds: a resume with --runs where no round follows the planned ones, else a new
    run of the same strategies and tasks."""
    flags = {"--runs": str(MIN_ROUNDS)}
    if not meta.plan.extra_rounds:
        cmd = _head(meta, True) + ["--runs", str(MIN_ROUNDS)]
        return Completion(c.fillable, c.short_planned, c.unmeasured, c.disturbed, c.failed, c.retakes_made,
                          c.retake_cap, shlex.join(cmd), True, flags)
    cmd = _head(meta, False) + ["--runs", str(MIN_ROUNDS)]
    entries = _manifest_entries(meta)
    members: dict[str, list[str]] = defaultdict(list)
    for s in meta.planned_strategies():
        if not (meta.plan.aa_control and s.id.endswith("-aa")):  # a twin is --aa-control's
            members[s.family_id].append(s.id)
    entries = _manifest_entries(meta)
    if entries is None or set(members) != set(entries):
        cmd += ["--strategy", ",".join(ids[0] if len(ids) == 1 else f"{f}[*]" for f, ids in members.items())]
    if set(meta.plan.tasks) != {t.id for t in meta.tasks}:
        cmd += ["--task-id", ",".join(meta.plan.tasks)]
    if meta.plan.aa_control:
        cmd += ["--aa-control"]
    return Completion(c.fillable, c.short_planned, c.unmeasured, c.disturbed, c.failed, c.retakes_made,
                      c.retake_cap, shlex.join(cmd), False, flags)


def _manifest_entries(meta: RunMeta) -> list[str] | None:
    """The strategy entries of the run's manifest (its text, carried in run.json), None where it cannot be read."""
    try:
        raw = parse_yaml(meta.manifest.text, "run.json manifest.text")
        return [str(s["id"]) for s in raw["strategies"]]
    except (KitError, KeyError, TypeError):
        return None
