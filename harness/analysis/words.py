"""Every sentence the analysis writes, from typed evidence: verdict rules, interval notes, contamination and
stability warnings, reproduction calls, and the rules printed beside the tables. Numbers go through
harness/formatter.py; nothing here decides anything."""

from __future__ import annotations

from harness import formatter as fm
from harness.analysis import contamination as ct
from harness.analysis import inference as inf
from harness.analysis import speedups as sp
from harness.analysis import stability as st
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
        return f"the 95% interval {span} lies inside ±{band}; {family(j)}"
    if j.verdict in (sp.Verdict.FASTER, sp.Verdict.SLOWER):
        side = "above" if j.verdict is sp.Verdict.FASTER else "below"
        return f"different from 1 ({side}); {family(j)}"
    if iv.low > 1 or iv.high < 1:
        return f"the cell's 95% interval {span} excludes 1, but not at the table's family level ({family(j)})"
    return f"the 95% interval {span} contains 1 and reaches outside ±{band}; {family(j)}"


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
                f"(Kendall tau {tr.tau:+.2f}, Holm-adjusted p = {fm.pvalue(c.trend_p)} over {c.family} tests; "
                f"noise {fm.pct(tr.noise)}) with identical draft counts and outputs: this cell drifted, not a "
                "carried-over cache")
    elif c.why == "noisy":
        text = (f"throughput varies {fm.pct(c.evidence.get('normalised_cv'))} (coefficient of variation after "
                f"removing the round effect), more than the run's other cells (Holm-adjusted p = "
                f"{fm.pvalue(c.noise_p)} over {c.family} tests), with identical draft counts and outputs: the "
                "figure is noise-dominated")
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
        zs = "" if e["z"] is None else f", z={e['z']:+.1f}"
        if w.kind is st.WarningKind.FIRST_RUN:
            text = (f"the first run was {fm.pct(abs(e['deviation']))} {way} than the rest ({fm.rate(e['tok_s'])} "
                    f"tok/s{zs}): caches? start-up?")
        else:
            text = (f"statistical outlier: run {e['run']} was {fm.pct(abs(e['deviation']))} {way} than the others "
                    f"({fm.rate(e['tok_s'])} tok/s{zs})")
    return text if w.prompt is None else f"prompt {w.prompt}: {text}"


def row_rule(r: Row, margin: float) -> str:
    """Why one row of a comparison got its call."""
    m = fm.pct(margin)
    if r.call is Call.MISSING:
        return "not measured in B"
    if r.call is Call.BASELINE:
        return "the baseline: its speedup is 1 by definition"
    if r.interval is None or not r.interval.available:
        n = min(x.n for x in (r.speedup_a, r.speedup_b) if x is not None) if r.speedup_a or r.speedup_b else 0
        return f"too few rounds ({n}) in one of the runs for a B/A interval (needs {sp.MIN_ROUNDS})"
    span = fm.interval(r.interval.low, r.interval.high, 3)
    if r.call is Call.REPRODUCES:
        return f"the 95% interval of B/A {span} lies inside ±{m}"
    if r.call is Call.DIFFERS:
        return f"the 95% interval of B/A {span} lies wholly outside ±{m} (Holm-adjusted p = " \
               f"{fm.pvalue(r.p_adjusted)})"
    if r.interval.low > 1 + margin or r.interval.high < 1 / (1 + margin):
        return f"the 95% interval of B/A {span} lies outside ±{m}, but not at the family level (Holm-adjusted " \
               f"p = {fm.pvalue(r.p_adjusted)})"
    return f"the 95% interval of B/A {span} reaches outside ±{m}"


def headline(rep: Reproduction) -> str:
    """The comparison in one line: the call, the counts, and for an inconclusive one what would decide it."""
    counts, fps = rep.counts(), rep.fingerprints()
    judged = sum(counts.get(k, 0) for k in ("reproduces", "differs", "inconclusive"))
    geo = {c: sum(1 for g in rep.geomeans if g.call is c) for c in (Call.REPRODUCES, Call.DIFFERS)}
    n_fp = fps.get("identical", 0) + fps.get("differ", 0)
    parts = [f"{rep.call.value}: speedups {counts.get('reproduces', 0)} reproduce (B/A within ±{fm.pct(rep.margin)}), "
             f"{counts.get('differs', 0)} differ, {counts.get('inconclusive', 0)} inconclusive of {judged} cells; "
             f"geometric means {geo[Call.REPRODUCES]} reproduce, {geo[Call.DIFFERS]} differ of {len(rep.geomeans)}",
             f"deterministic fingerprint identical in {fps.get('identical', 0)} of {n_fp} cells"]
    if counts.get("missing"):
        parts.append(f"{counts['missing']} cells missing in B")
    if rep.call is Call.INCONCLUSIVE:
        if rep.smallest_margin is not None:
            parts.append(f"these rounds could confirm the geometric means within ±{fm.pct(rep.smallest_margin, 1)}")
        if rep.unjudged:
            parts.append(f"{rep.unjudged} without a B/A interval (fewer than {sp.MIN_ROUNDS} rounds in A or B)")
        if rep.rounds_needed is not None:
            parts.append(f"±{fm.pct(rep.margin)} needs about {rep.rounds_needed} rounds in B")
        else:
            parts.append(f"±{fm.pct(rep.margin)} is out of reach by adding rounds to B alone")
    toks = [r.tok_s_ratio for r in rep.rows if r.tok_s_ratio]
    if toks:
        parts.append(f"absolute tok/s B/A {fm.ratio(min(toks))}-{fm.ratio(max(toks))} (hardware- and "
                     "state-dependent, not judged)")
    return "; ".join(parts)


def speedup_rule() -> str:
    return ("speedup = a strategy's tok/s over its baseline's on the same task, prompt and host in the same round "
            "(each round runs every cell once, shuffled); per cell the geometric mean of the paired ratios over "
            f"rounds (the 20%-trimmed geometric mean from {inf.TRIM_FROM} rounds), its 95% interval a Student-t "
            "interval whose variance is moderated toward the noise of the table's other cells (empirical Bayes); "
            f"cells with fewer than {sp.MIN_ROUNDS} paired rounds get none. Each cell is tested for a difference "
            f"from 1 and for lying within ±{fm.pct(sp.EQUIVALENCE_BAND)}, and Holm's procedure at 5% judges every "
            "test of the table as one family: ▲ faster / ▼ slower, ≈ equivalent, · not significant. The geometric "
            "mean over tasks is the mean of the cells' log estimates, its interval from their standard errors; the "
            "geometric means are judged as a family of their own")


def contamination_rule() -> str:
    return ("identical requests at temperature 0 in fresh containers must give identical draft counts and outputs: "
            "a change with acceptance rising after the first run is warm-cache, any other change unstable; a "
            "throughput trend after removing each round's common factor is drift (Kendall, Holm over every cell, "
            f"change > {fm.pct(ct.TREND_MIN_CHANGE)} and > {ct.TREND_NOISE_FACTOR:g}x the cell's noise), a cell "
            "significantly noisier than the run's others is unstable (F-test against the run's noise, same family); "
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
    return (f"a measurement is disturbed when other work on the host used more than {disturbed_cores:g} of a core on "
            f"average during its timed request (or the CPU throttled, or another process used the GPU); {retaken} "
            f"left out of every figure, unless more than {fm.pct(busy_share)} of a host's were disturbed: then they "
            "are kept and the host is named as busy")
