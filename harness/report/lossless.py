"""The "Lossless in distribution at temperature T" section of RESULTS.md and its lines in `invoke compare`: the
sampling study's table (harness/analysis/lossless.py) in words. Rendering only: every verdict is decided there."""

from __future__ import annotations

import math

from harness import formatter as fm
from harness.analysis import lossless
from harness.report import view
from harness.store import shapes

#: Short names of the tests in the order lossless.TESTS lists them.
SHORT = {"first token": "first", "first tokens": "first {m}", "every position": "all", "log-probability": "log-p"}


def _setting(settings: shapes.StudySettings) -> str:
    top_k = f", top-k {settings['top_k']}" if settings.get("top_k") else ""
    return f"temperature {fm.plain(settings['temperature'])}{top_k}"


def _control(settings: shapes.StudySettings) -> str:
    kind, value = next(iter(settings["control"].items()))
    return f"the baseline at {kind.replace('_', '-')} {fm.plain(value)}"


def label(row: shapes.StudyRow, settings: shapes.StudySettings, several_hosts: bool) -> str:
    """What a row compares, in words: a strategy, the A/A row, the control."""
    host = f"{row['host']}: " if several_hosts else ""
    if row["kind"] == "aa":
        return fm.md(f"{host}{row['arm']} (A/A: the strategies' seeds)")
    if row["kind"] == "control":
        return fm.md(f"{host}control: {_control(settings)}")
    return fm.md(f"{host}{row['arm']}")


def _rank(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def stage1(row: shapes.StudyRow) -> str:
    """Seeded equality in a few words: identical k/n, where the others left the baseline, the verification kind."""
    s = row.get("stage1")
    if s is None:
        return "-"
    if not s["paired"]:
        return "no samples paired by seed"
    text = f"identical {s['identical']}/{s['paired']}"
    if s["divergent"]:
        ds = sorted(s["divergent"], key=lambda d: d["position"])
        text += "; first divergent token " + ", ".join(
            f"{d['position']} ({_rank(d['baseline_rank'])}→{_rank(d['rank'])})" for d in ds[:4]) \
            + (f", {len(ds) - 4} more" if len(ds) > 4 else "")
    if row.get("verification") == "rejection":
        text += " (samples by rejection: not expected)"
    if row.get("drafted") == 0:
        text += " ⚠ drafted nothing"
    return text


def stage2(row: shapes.StudyRow) -> str:
    """The row's verdict; for the control, whether the tests told it apart."""
    v = row["verdict"]
    p = fm.pvalue(row.get("p_adjusted"))
    if row["kind"] == "control":
        return {"differs": f"detected (p {p})", "no difference detected": "⚠ not detected: no power"}.get(v, v)
    return {"differs": f"**differs** (p {p})", "no difference detected": "no difference detected"}.get(v, v)


def tv(row: shapes.StudyRow) -> str:
    t = row.get("tv")
    if not t:
        return "-"
    return f"{fm.num(t['estimate'])} {fm.interval(t['low'], t['high'])}"


def tests(row: shapes.StudyRow, prefix: int) -> str:
    """Each test's own p-value (the verdict uses the Holm-adjusted ones), a test not run as n/a."""
    return " · ".join(f"{SHORT[t['name']].format(m=prefix)} {fm.pvalue(t['p']) if t['p'] is not None else 'n/a'}"
                      for t in row["tests"])


def table(study: shapes.StudySummary, several_hosts: bool) -> str:
    settings = study["settings"]
    rows = [[label(r, settings, several_hosts), fm.md(r["task"] if r["prompt"] == r["task"] else
                                                   f"{r['task']}/{r['prompt']}"),
             stage1(r), stage2(r), tv(r), fm.num(r.get("detectable_tv")), tests(r, settings["prefix"]),
             f"{r['samples']} vs {r['reference_samples']}"] for r in study["rows"]]
    m = settings["prefix"]
    return view.table(rows, ["strategy", "task", "seeded equality (stage 1)", "distribution (stage 2)",
                             f"TV, first {m} tokens [95%]", "could detect TV ≥", "p per test", "samples"])


def divergences(study: shapes.StudySummary, several_hosts: bool, limit: int = 12) -> list[str]:
    """Where samples left the baseline with the same seed, one line per strategy and prompt."""
    out = []
    for r in study["rows"]:
        s = r.get("stage1")
        if not s or not s["divergent"]:
            continue
        parts = []
        for d in s["divergent"][:4]:
            rank = f"its choice {d['rank']}" if d["rank"] is not None else "a token outside its top choices"
            lps = (f" (log-probability {fm.num(d['logprob'])}, the baseline's own {fm.num(d['baseline_logprob'])})"
                   if d["logprob"] is not None and d["baseline_logprob"] is not None else "")
            parts.append(f"seed {d['seed']} at token {d['position']}, from the baseline's choice "
                         f"{_rank(d['baseline_rank'])} to {rank}{lps}")
        more = f"; {len(s['divergent']) - 4} more" if len(s["divergent"]) > 4 else ""
        out.append(f"- {label(r, study['settings'], several_hosts)} / {fm.md(r['task'])}: {'; '.join(parts)}{more}")
    return out[:limit] + ([f"- … and {len(out) - limit} more rows"] if len(out) > limit else [])


def _control_distance(study: shapes.StudySummary) -> str:
    """How far the control moved each prompt's first tokens, beside the distance its rows say they could detect:
    a control far beyond that distance shows power at its own distance, not at the stated one."""
    stated: dict[tuple[str, str, str], float] = {}
    for r in study["rows"]:
        if r["kind"] == "strategy" and r.get("detectable_tv") is not None:
            key = (r["host"], r["task"], r["prompt"])
            stated[key] = max(stated.get(key, 0.0), r["detectable_tv"])
    parts, far = [], False
    for r in study["rows"]:
        key = (r["host"], r["task"], r["prompt"])
        if r["kind"] == "control" and r.get("tv") and key in stated:
            parts.append(f"TV {fm.num(r['tv']['estimate'])} on {fm.md(r['task'])}, where its rows could detect "
                         f"TV ≥ {fm.num(stated[key])}")
            far = far or r["tv"]["estimate"] > 1.5 * stated[key]
    if not parts:
        return ""
    return (f" ({'; '.join(parts)})" + ("; a control this far beyond the stated distance says nothing about smaller "
            "departures: a control near it (the baseline at a temperature a little off the study's, "
            "`distribution: {control: {temperature: T}}`) shows power where it is claimed, and "
            "bench/distribution_calibration.py checks the claim by simulation" if far else ""))


def power(study: shapes.StudySummary) -> str:
    settings = study["settings"]
    if study["power"] is None:
        return "The control was not drawn: this study cannot show that it could detect a difference."
    if study["power"]:
        return (f"The control ({_control(settings)}) was detected on every prompt: these samples can tell a "
                "difference of that size" + _control_distance(study) + ".")
    return (f"⚠ **The study had no power**: its control ({_control(settings)}) was not detected on every prompt, "
            "so \"no difference detected\" below says little. Draw more samples (`invoke run --distribution N`).")


def section(study: shapes.StudySummary | None, several_hosts: bool = False, build: str = "b11434") -> list[str]:
    """The RESULTS.md section of a run's sampling study (nothing for a run without one); `build`: which build its
    server facts are said of (harness/analysis/builds.py `measured_on`)."""
    if not study:
        return []
    st = study["settings"]
    b = study["batches"]
    lines = [f"### Lossless in distribution at {_setting(st)}", "",
             f"{st['samples']} samples of {st['tokens']} tokens per strategy and prompt, each one request with its "
             f"own seed; the baseline drawn with the same seeds (stage 1: seeded equality), with other seeds (the "
             f"reference of stage 2's two-sample tests) and as the positive control ({_control(st)}). "
             f"{fm.count(study['samples'])} samples, {fm.count(study['tokens'])} tokens in {b['ok']} batches"
             + (f" ({b['failed']} failed, left out)" if b["failed"] else "") + f" of up to {st['batch']} samples, "
             "each on a fresh server: the samples of a batch share it, so an n-gram table or a drafter's state carries "
             "over between them (exact-match verification makes that move draft counts, never tokens: stage 1 would "
             "show it).", "", power(study), "",
             f"The {study['family']['tests']} distinct tests of this table are judged as one family (Holm's procedure "
             "at 5%; a strategy whose every sample is the baseline's runs the A/A row's tests on the same data, "
             f"counted once; permutation p-values with {fm.count(study['family']['permutations'])} relabellings"
             + _relabellings(study) + ").", "",
             table(study, several_hosts), ""]
    div = divergences(study, several_hosts)
    if div:
        lines += ["Where samples left the baseline's with the same seed:", "", *div, ""]
    lines += [f"> {RULE.format(m=st['prefix'], build=fm.md(build))}", ""]
    return lines


RULE = ("Stage 1: each sample against the baseline's with the same seed. Exact-match verification (the default "
        "of {build}: drafts taken greedily, each checked against the token the target samples itself with the same "
        "random numbers) should reproduce the baseline token for token; a divergence to a neighbour of the "
        "baseline's token in its ranking (choice 1→2: the same random number falls just across the boundary) points "
        "at the verification pass's probabilities differing slightly from the baseline's one-token passes, not at "
        "a sampler that draws differently. Rejection sampling (`--spec-draft-sampling probabilistic` on "
        "draft-simple and draft-mtp) spends its random numbers differently: seeded equality is not expected of it. "
        "Stage 2: the strategy's samples against the baseline's with other seeds: the first token (sampled before "
        "any draft exists: it can show only a difference in how the server samples), the first {m} tokens as "
        "sequences (categories seen fewer than 5 times pooled; chi-square), every position at once (Hamming-kernel "
        "MMD) and each sample's total log-probability under the target (Kolmogorov-Smirnov; drafting servers report "
        "none, so a strategy's are the baseline's where its sample is identical; where any left the baseline's the "
        "test does not run, \"n/a\": llama-server scores no given tokens, its /v1/completions refuses echo). "
        "TV = total-variation distance of "
        "the first {m} tokens' pooled categories, basic bootstrap interval; \"could detect\" = the smallest TV "
        "between those categories that the first-tokens test finds with 80% power at the family's strictest level, "
        "simulated for the least detectable departures (mass moved between two balanced halves of the outcomes, at "
        "the first token and, keeping it, at later ones; mass moved among outcomes too rare to be told apart is not "
        "in it; where one is found less often even at the largest distance these outcomes allow, just above that "
        "distance). \"No "
        "difference detected\" says no more than that.")


def _relabellings(study: shapes.StudySummary) -> str:
    """What the count of relabellings leaves unsaid: fewer than the kit draws (a study this large bounds its report's
    cost), every distinct one for rows with fewer (the exact test)."""
    count = study["family"]["permutations"]
    out = ""
    if count < lossless.PERMUTATIONS:
        out += (f", fewer than the {fm.count(lossless.PERMUTATIONS)} the kit draws for a smaller study: this one's "
                f"size bounds the report's cost, and no p-value is below 1/{fm.count(count + 1)}")
    if any(math.comb(r["samples"] + r["reference_samples"], r["samples"]) <= count + 1 for r in study["rows"]
           if r["tests"]):
        out += "; every distinct relabelling where a row has fewer (the exact test)"
    return out


def compare_lines(result: shapes.StudyComparison | None) -> list[str]:
    """`invoke compare`: the two runs' distribution verdicts; each changed verdict named."""
    if result is None:
        return []
    if result["only"]:
        return [f"lossless in distribution: only {result['only']} drew a sampling study"]
    missing = result.get("missing") or []
    head = (f"lossless in distribution (A at {_setting(result['settings_a'])}, B at "
            f"{_setting(result['settings_b'])}): {result['same']} of {result['same'] + result['changed']} verdicts "
            "the same" + ("" if result["changed"] else ", none changed")
            + (f"; {len(missing)} row{'s' if len(missing) > 1 else ''} only one run has, not compared"
               if missing else ""))
    return [head] + [f"  changed: {fm.console(r['arm'], 200)} / {fm.console(r['task'], 100)}: A {r['a']} -> B "
                     f"{r['b']} (p {fm.pvalue(r['p_adjusted_b'])})" for r in result["rows"] if r["changed"]] + [
        f"  only in {r['side']}: {fm.console(r['arm'], 200)} / {fm.console(r['task'], 100)} / "
        f"{fm.console(r['prompt'], 100)} ({fm.console(r['verdict'], 100)})" for r in missing]
