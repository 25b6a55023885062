"""Every sentence the analysis writes, from typed evidence: verdict rules, interval notes, contamination and
stability warnings, reproduction calls, and the rules printed beside the tables. Numbers go through
harness/formatter.py; nothing here decides anything."""

from __future__ import annotations

import math

from harness import formatter as fm
from harness.analysis import contamination as ct
from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis import stability as st
from harness.analysis.reach import Reach
from harness.analysis.reproduction import Call, Reproduction, Row


def interval_note(iv: inf.Interval) -> str:
    """How an interval was made, in words."""
    if not iv.available:
        return f"{iv.n} paired round{'s' if iv.n != 1 else ''}: too few rounds for an interval (needs " \
               f"{sp.MIN_ROUNDS})"
    what = {"mean": "geometric mean", "trimmed mean": "20%-trimmed geometric mean"}.get(iv.method, iv.method)
    df = "normal" if iv.df is None else f"t, {fm.num(iv.df, 0)} df"
    how = "variance moderated toward the table's" if iv.moderated else "the cell's own variance"
    return f"{iv.n} rounds: {what} of the paired ratios, {how} ({df})"


def between_note(iv: inf.Interval) -> str:
    """How a geometric mean's interval for tasks like these was made."""
    return (f"{iv.n} tasks: t-interval of the mean of the per-task log speedups from their spread over tasks "
            f"(t, {fm.num(iv.df, 0)} df): tasks like these, not only these prompts")


def family(j: sp.Judgement, what: str = "tests") -> str:
    return f"Holm over {j.family} {what}: adjusted p = {fm.pvalue(j.p_adjusted)}"


def verdict_rule(s: sp.Speedup) -> str:
    """Why a speedup got its verdict."""
    iv, j = s.interval, s.judgement
    if j.verdict is sp.Verdict.TOO_FEW:
        return f"too few rounds ({iv.n}): a verdict needs {sp.MIN_ROUNDS} paired rounds"
    span = fm.interval(iv.low, iv.high, 3)
    band = fm.pct(j.band)
    if j.verdict is sp.Verdict.EQUIVALENT:
        lo, hi = s.est.interval(1 - 2 * inf.ALPHA) if s.est is not None else (math.nan, math.nan)
        return (f"two one-sided tests: the 90% interval {fm.interval(math.exp(lo), math.exp(hi), 3)} lies inside "
                f"±{band}; {family(j)}")
    if j.verdict in (sp.Verdict.FASTER, sp.Verdict.SLOWER):
        side = "above" if j.verdict is sp.Verdict.FASTER else "below"
        return f"different from 1 ({side}); {family(j)}"
    could = "" if j.smallest is None else \
        f"; these rounds mark this cell from {fm.ratio(math.exp(j.smallest))} (or {fm.ratio(math.exp(-j.smallest))})"
    if iv.low > 1 or iv.high < 1:
        return f"the cell's 95% interval {span} excludes 1, but not at the table's family level ({family(j)}){could}"
    return f"the 95% interval {span} contains 1 and reaches outside ±{band}; {family(j)}{could}"


def contamination(c: ct.Contamination) -> str:
    """One sentence for a cell's contamination (its worst unit's)."""
    fp, tr = c.fingerprint, c.trend
    words = f"{drafts(fp)}; {outputs(fp)}"
    if c.kind is ct.Kind.NAIVE:
        text = f"naive protocol: one server for every run, caches carried over ({words})"
    elif c.kind is ct.Kind.WARM_CACHE:
        text = f"carried state in fresh containers: acceptance rose after the first run ({words})"
    elif c.why == "changed":
        text = f"nondeterministic at temperature 0 in fresh containers ({words})"
    elif c.kind is ct.Kind.DRIFT:
        way = "rose" if tr.change > 0 else "fell"
        text = (f"throughput {way} {fm.pct(abs(tr.change))} over {tr.n} runs after removing the round effect "
                f"(Kendall tau {fm.signed(tr.tau, 2)}, Holm-adjusted p = {fm.pvalue(c.trend_p)} over {c.family} tests; "
                f"noise {fm.pct(tr.noise)}) with identical draft counts and outputs: this cell drifted, not a "
                "carried-over cache")
    elif c.why == "noisy":
        text = (f"throughput varies {fm.pct(c.evidence.get('normalised_cv'))} (coefficient of variation after "
                "removing the round effect), its largest deviation improbable under the run's own noise, heavy "
                f"tails allowed (Holm-adjusted p = {fm.pvalue(c.noise_p)} over {c.family} tests), with identical "
                "draft counts and outputs: the figure is noise-dominated")
    else:
        how = (f"no trend after removing the round effect (Holm-adjusted p = {fm.pvalue(c.trend_p)})"
               if tr.testable else f"{tr.n} runs: too few to test a trend (needs {ct.min_trend_runs()})")
        text = f"no evidence of carried state ({words}); {how}"
    return text if c.unit.prompt is None else f"prompt {c.unit.prompt}: {text}"


def drafts(fp: ct.Fingerprint) -> str:
    if not fp.drafting:
        return "nothing drafted"
    if fp.drafts_identical:
        d, a = fp.drafts[0]
        return f"drafted/accepted {d}/{a} in every run"
    return "drafted/accepted " + ", ".join(f"{d}/{a}" for d, a in fp.drafts)


def outputs(fp: ct.Fingerprint) -> str:
    at = fp.output_changed_at()
    return f"output changed from run {at}" if at else "output identical in every run"


def warning(w: st.StabilityWarning) -> str:
    """One sentence for a stability warning."""
    e = w.evidence
    if w.kind is st.WarningKind.DISTURBED:
        n = len(e["runs"])
        if e["kept"]:
            d, total = e["busy"]
            what = (f"kept: {d} of {total} measurements on this host were disturbed, so these figures describe a "
                    "busy machine")
        else:
            what = "left out of the figures" + (f", {e['retaken']} retaken" if e.get("retaken") else "")
        text = f"{n} run(s) disturbed by other work on the host, {what}"
    elif w.kind is st.WarningKind.FEW_ROUNDS:
        text = f"too few rounds ({e['rounds']}): no interval and no verdict (needs {e['needed']})"
    elif w.kind is st.WarningKind.DISPERSION:
        machine = (f"; {fm.pct(e['normalised_cv'])} after removing the round effect"
                   if e["normalised_cv"] < e["cv"] / 2 else "")
        text = f"tok/s varies {fm.pct(e['cv'])} (coefficient of variation) across {e['runs']} runs{machine}"
    else:
        way = "slower" if e["deviation"] < 0 else "faster"
        zs = "" if e["z"] is None else f", z={fm.signed(e['z'], 1)}"
        if w.kind is st.WarningKind.FIRST_RUN:
            text = (f"the first run was {fm.pct(abs(e['deviation']))} {way} than the rest ({fm.rate(e['tok_s'])} "
                    f"tok/s{zs}): caches? start-up?")
        else:
            text = (f"statistical outlier: run {e['run']} was {fm.pct(abs(e['deviation']))} {way} than the others "
                    f"({fm.rate(e['tok_s'])} tok/s{zs})")
    return text if w.prompt is None else f"prompt {w.prompt}: {text}"


def row_rule(r: Row) -> str:
    """Why one row of a comparison got its call (against the row's own band: the cell margin for a cell)."""
    m = fm.pct(r.margin)
    if r.call is Call.MISSING:
        return "not measured in B"
    if r.call is Call.BASELINE:
        return "the baseline: its speedup is 1 by definition"
    if r.interval is None or not r.interval.available:
        return f"too few rounds ({min(r.n_a, r.n_b)}) in one of the runs for a B/A interval (needs {sp.MIN_ROUNDS})"
    span = fm.interval(r.interval.low, r.interval.high, 3)
    if r.call is Call.REPRODUCES:
        return f"the 95% interval of B/A {span} lies inside ±{m}"
    if r.call is Call.DIFFERS:
        return f"the 95% interval of B/A {span} lies wholly outside ±{m} (Holm-adjusted p = " \
               f"{fm.pvalue(r.p_adjusted)})"
    if r.interval.low > 1 + r.margin or r.interval.high < 1 / (1 + r.margin):
        return f"the 95% interval of B/A {span} lies outside ±{m}, but not at the family level (Holm-adjusted " \
               f"p = {fm.pvalue(r.p_adjusted)})"
    return f"the 95% interval of B/A {span} reaches outside ±{m}"


def cell_name(r: Row, hosts: bool = False) -> str:
    """'strategy / task' of a comparison's row (with its host where the runs had several)."""
    return f"{r.strategy} / {r.task} on {r.host}" if hosts else f"{r.strategy} / {r.task}"


def unresolved_cell(r: Row, hosts: bool = False) -> str:
    """One unresolved cell of a comparison: its B/A with the interval, or why it has none."""
    if r.call is Call.MISSING:
        return f"{cell_name(r, hosts)} not measured in B"
    iv = r.interval
    if iv is None or not iv.available:
        return f"{cell_name(r, hosts)} without a B/A interval ({min(r.n_a, r.n_b)} rounds, needs {sp.MIN_ROUNDS})"
    return (f"{cell_name(r, hosts)} B/A {fm.ratio(r.ratio)} {fm.interval(iv.low, iv.high)}, not within "
            f"±{fm.pct(r.margin)}")


def headline(rep: Reproduction) -> str:
    """The comparison in one line: the call (and, when only the geometric means reproduce, the unresolved cells
    and the worst of them), the counts, and for an undecided one what would decide it."""
    counts, fps = rep.counts(), rep.fingerprints()
    judged = sum(counts.get(k, 0) for k in ("reproduces", "differs", "inconclusive"))
    geo = {c: sum(1 for g in rep.geomeans if g.call is c) for c in (Call.REPRODUCES, Call.DIFFERS)}
    n_fp = fps.get("identical", 0) + fps.get("differ", 0)
    hosts = len({r.host for r in rep.rows}) > 1
    call = rep.call.value
    if rep.call is Call.GEOMEANS_REPRODUCE:
        n = len(rep.unresolved)
        call = (f"{call}; {n} cell{'s' if n != 1 else ''} unresolved (worst {unresolved_cell(rep.worst, hosts)})"
                if n else f"{call}; the deterministic fingerprint differs in {rep.fingerprints_differ} cells")
    parts = [f"{call}: speedups {counts.get('reproduces', 0)} reproduce (B/A within ±{fm.pct(rep.cell_margin)}), "
             f"{counts.get('differs', 0)} differ, {counts.get('inconclusive', 0)} inconclusive of {judged} cells; "
             f"geometric means {geo[Call.REPRODUCES]} reproduce (within ±{fm.pct(rep.margin)}), "
             f"{geo[Call.DIFFERS]} differ of {len(rep.geomeans)}",
             f"deterministic fingerprint identical in {fps.get('identical', 0)} of {n_fp} cells"]
    if counts.get("missing"):
        parts.append(f"{counts['missing']} cells missing in B")
    if rep.call is Call.INCONCLUSIVE and rep.worst is not None:
        parts.append(f"{len(rep.unresolved)} cells unresolved (worst {unresolved_cell(rep.worst, hosts)})")
    if rep.call is Call.INCONCLUSIVE and rep.smallest_margin is not None:
        parts.append(f"these rounds could confirm the geometric means within ±{fm.pct(rep.smallest_margin, 1)}")
    if rep.call in (Call.INCONCLUSIVE, Call.GEOMEANS_REPRODUCE):
        if rep.cell_smallest_margin is not None and rep.unresolved:
            parts.append(f"these rounds could confirm every cell with a B/A interval within "
                         f"±{fm.pct(rep.cell_smallest_margin, 1)}")
        if rep.unjudged:
            parts.append(f"{rep.unjudged} without a B/A interval (fewer than {sp.MIN_ROUNDS} rounds in A or B)")
        parts += _rounds_words(rep)
    toks = [r.tok_s_ratio for r in rep.rows if r.tok_s_ratio]
    if toks:
        parts.append(f"absolute tok/s B/A {fm.ratio(min(toks))}-{fm.ratio(max(toks))} (hardware- and "
                     "state-dependent, not judged)")
    return "; ".join(parts)


def _rounds_words(rep: Reproduction) -> list[str]:
    """What more rounds in B would do: for the geometric means at the margin (when they are undecided) and for the
    cells at the cell margin."""
    out = []
    if rep.call is Call.INCONCLUSIVE:
        out.append(f"±{fm.pct(rep.margin)} for the geometric means needs about {rep.rounds_needed} rounds in B"
                   if rep.rounds_needed is not None else
                   f"±{fm.pct(rep.margin)} for the geometric means is out of reach by adding rounds to B alone")
    if any(r.reach is not None for r in rep.unresolved):
        out.append(f"±{fm.pct(rep.cell_margin)} for the cells with a B/A interval needs about "
                   f"{rep.cell_rounds_needed} rounds in B" if rep.cell_rounds_needed is not None else
                   f"±{fm.pct(rep.cell_margin)} for every cell is out of reach by adding rounds to B alone")
    return out


def speedup_rule() -> str:
    return ("speedup = a strategy's tok/s over its baseline's on the same task, prompt and host in the same round "
            "(each round runs every cell once, shuffled); per cell the geometric mean of the paired ratios over "
            f"rounds (the 20%-trimmed geometric mean from {inf.TRIM_FROM} rounds), its 95% interval a Student-t "
            "interval whose variance is the strategy's run-to-run variance plus its baseline's (each side's "
            "residuals after removing the round's common factor), each part moderated toward the noise of its kind "
            "in this table (robust empirical Bayes, prior weight bounded) and never below the cell's own; cells "
            f"with fewer than {sp.MIN_ROUNDS} paired rounds get none. Each cell and each geometric mean is tested "
            f"for a difference from 1 and for lying within ±{fm.pct(sp.EQUIVALENCE_BAND)} (two one-sided tests), and "
            "Holm's procedure at 5% judges every test of the printed table as one family: ▲ faster / ▼ slower, "
            "≈ equivalent, · not significant. The "
            "geometric mean over tasks is the mean of the cells' log estimates, its interval from their standard "
            "errors (for these prompts); the interval for tasks like these comes from the spread of the per-task "
            "speedups over tasks")


def contamination_rule() -> str:
    return ("identical requests at temperature 0 in fresh containers must give identical draft counts and outputs: "
            "a change with acceptance rising after the first run is warm-cache, any other change unstable; a "
            "throughput trend after removing each round's common factor is drift (Kendall, Holm over every cell, "
            f"change > {fm.pct(ct.TREND_MIN_CHANGE)} and > {fm.plain(ct.TREND_NOISE_FACTOR)}x the cell's noise), "
            "a cell "
            "whose largest deviation is improbable under the run's own noise is unstable (Student t fitted to every "
            "cell's deviations, so heavy tails of one scale raise no flag; same family); "
            "the reuse-server protocol is always flagged naive")


def interference_rule(disturbed_cores: float, busy_share: float, retake_cap: int | None = None) -> str:
    """The interference rule, with the run's cap of retakes (None: a run made before retakes)."""
    if retake_cap is None:
        retaken = "this run predates retakes: disturbed measurements are"
    elif retake_cap == 0:
        retaken = "this run retook none (cap 0): disturbed measurements are"
    else:
        retaken = ("disturbed measurements (and failed ones whose cell succeeded) are retaken at the end of their "
                   "round, those that restore the most pairs first (a disturbed baseline first: it pairs with every "
                   f"strategy on its task), at most {retake_cap} in this run (both records kept, the retake marked), "
                   "and the disturbed ones are")
    return (f"a measurement is disturbed when other work on the host used more than {fm.plain(disturbed_cores)} of a "
            "core on "
            f"average during its timed request (or the CPU throttled, or another process used the GPU); {retaken} "
            f"left out of every figure, unless more than {fm.pct(busy_share)} of a host's were disturbed: then they "
            "are kept and the host is named as busy")


def power(pw: sp.Power) -> str:
    """What a table's rounds could mark, in one sentence (empty without a judged cell)."""
    if pw.cells is None:
        return ""
    text = (f"With {pw.rounds} rounds at this noise a cell is marked ▲ from {fm.ratio(pw.cells)} (▼ below "
            f"{fm.ratio(1 / pw.cells)}) when its noise is the table's median, from {fm.ratio(pw.noisiest)} at the "
            "noisiest quarter's edge")
    if pw.geomeans is not None:
        text += f", a geometric mean from {fm.ratio(pw.geomeans)}"
    needs = [_rounds_needed(t, n, pw.rounds_range.get(t)) for t, n in pw.rounds_for.items()
             if n is None or n > pw.rounds]
    return text + (" (about half of the cells with such a speedup are marked)" +
                   (f"; a cell of the table's median noise {', '.join(needs)}" if needs else "") + ".")


def reach(r: Reach, run_id: str) -> str:
    """How well a reproduction of this run can confirm it, the rounds B needs, and the command that tightens it."""
    def rounds(n: int | None, margin: float, what: str) -> str:
        if n is None:
            return f"±{fm.pct(margin)} for {what} is out of reach by adding rounds to B alone"
        return f"±{fm.pct(margin)} for {what} needs about {n} rounds in B"

    text = (f"a reproduction can confirm this run's geometric means within ±{fm.pct(r.geomeans_best, 1)} at best "
            f"(±{fm.pct(r.geomeans_same, 1)} with a B of its {r.rounds} rounds)")
    if r.cells_best is not None and r.cells_same is not None:
        text += f" and every cell within ±{fm.pct(r.cells_best)} (±{fm.pct(r.cells_same)})"
    text += (f"; with this run's noise, {rounds(r.rounds_for_margin, r.margin, 'the geometric means')}, "
             f"{rounds(r.rounds_for_cells, r.cell_margin, 'every cell')}")
    if r.rounds_for_margin is None or r.rounds_for_cells is None:
        text += f"; rounds added here tighten it: `{reach_command(r, run_id)}`"
    return text


def reach_command(r: Reach, run_id: str) -> str:
    """The command that narrows this run's own intervals (every cell's to half the cell margin)."""
    return f"invoke run --resume {run_id} --until {fm.pct(r.cell_margin / 2)}"


def builds_power(pw: sp.Power) -> str:
    """What a table of one build against another could mark, in one sentence (empty without a judged cell)."""
    if pw.half is None:
        return ""
    return (f"With {pw.rounds} rounds at this noise a cell of the table's median noise is marked ▼ about half the "
            f"time when its true B/A is {fm.ratio(1 / pw.half)} (▲ at {fm.ratio(pw.half)}): a cell without a mark "
            "says little of a change smaller than that.")


def _rounds_needed(target: float, n: int | None, bounds: tuple[int | None, int | None] | None) -> str:
    """"1.10x needs about 14 rounds (9 to 17 over the uncertainty of that noise)" or out of reach."""
    if not n:
        return f"at {fm.ratio(target)} is out of reach within 200 rounds"
    text = f"at {fm.ratio(target)} needs about {n} rounds to be marked half the time"
    if bounds is None or bounds == (n, n):
        return text
    lo, hi = bounds
    span = f"{lo} to {hi}" if hi else f"from {lo} to beyond 200"
    return text + f" ({span} over the uncertainty of that median noise)"


def _n(k: int, one: str, many: str | None = None) -> str:
    return f"{fm.count(k)} {one if k == 1 else many or one + 's'}"


def _found(flagged: int, where: str) -> str:
    return "nothing flagged" if not flagged else f"{_n(flagged, 'cell')} flagged ({where})"


def contamination_ran(cells: int, runs: int, identical: int, drafting: int, trend_tested: int, tests: int,
                      flagged: int, naive: bool) -> str:
    """What the contamination check compared in a run and what it found, flagged or not."""
    if naive:
        return (f"contamination: the naive protocol (one server per strategy): all {_n(cells, 'cell')} flagged; "
                f"draft counts and outputs compared run over run, identical in {identical} of {cells}")
    trend = (f"a throughput trend tested in {trend_tested}" if trend_tested else
             f"no throughput trend testable (needs {ct.min_trend_runs()} runs)")
    return (f"contamination: {_n(cells, 'cell')} checked over {_n(runs, 'run')} in fresh containers: draft counts "
            f"and outputs compared run over run, identical in {identical} of {cells} ({drafting} of them "
            f"drafting); {trend} and each cell's noise against the run's, Holm over {_n(tests, 'test')}: "
            f"{_found(flagged, 'see Flags')}")


def determinism_ran(strategies: int, cells: int, runs: int, identical: int, baselines: int,
                    baselines_stable: int) -> str:
    """What the determinism check compared and what it found."""
    if not cells:
        return "determinism: no speculative cell with a baseline on its target to compare with"
    diverge = cells - identical
    return (f"determinism: outputs of {_n(strategies, 'speculative strategy', 'speculative strategies')} "
            f"compared byte by byte with their target's baseline in {_n(cells, 'cell')} ({_n(runs, 'run')}): "
            f"{identical} identical in every run, {diverge} diverging{' (see Determinism)' if diverge else ''}; "
            f"baseline outputs identical run over run in {baselines_stable} of {baselines} cells")


def physics_ran(cells: int, flagged: int, highest: float | None, bandwidth: str) -> str:
    """What the physics check held against the roofline and what it found."""
    top = f" (the highest at {fm.pct(highest)} of its ceiling)" if highest is not None else ""
    return (f"physics: {_n(cells, 'cell')}' tok/s held against the memory-bandwidth roofline at {bandwidth}: "
            + ("none above it" + top if not flagged else f"{flagged} above it: a measurement bug (flagged)"))


def interference_ran(measured: int, disturbed: int, retaken: int, busy: list[str]) -> str:
    """What the interference monitor measured and what it found."""
    if not measured:
        return "interference: not measured in this run"
    if not disturbed:
        return (f"interference: other work on the host measured during {_n(measured, 'timed request')}: none "
                "disturbed")
    kept = f"; kept on the busy host(s) {', '.join(busy)}" if busy else "; left out of the figures"
    return (f"interference: other work on the host measured during {_n(measured, 'timed request')}: {disturbed} "
            f"disturbed{kept}" + (f", {retaken} retaken" if retaken else ""))
