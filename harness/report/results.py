"""`invoke report`: RESULTS.md (tabulate), summary.json (schema-checked) and a speedup plot per run folder.

Output is a pure function of the run folders: regenerating gives the same bytes. Every text that comes from a
run folder (names, reasons, host facts) is escaped before it goes into Markdown."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness import LABEL_PREFIX, KitError, schema
from harness import formatter as fm
from harness.analysis import breakeven, builds, explanation, stats, tuning
from harness.analysis import compare as cmp
from harness.analysis.records import CellIndex
from harness.analysis.speedups import MIN_ROUNDS
from harness.analysis.stability import DISPERSION_CV
from harness.analysis.summary import summarize
from harness.files import atomic_write_text
from harness.report import breakeven as breakeven_report
from harness.report import builds as builds_report
from harness.report import categories as categories_report
from harness.report import check_tables, headline, intervals, plotting
from harness.report import compare as compare_words
from harness.report import dimensions as dimensions_report
from harness.report import explanation as why_report
from harness.report import load as load_report
from harness.report import lossless as lossless_report
from harness.report import tuning as tuning_report
from harness.report.marks import NO_VERDICT, TOO_FEW, marked, too_few
from harness.report.view import View, table
from harness.store import shapes
from harness.store.rundir import RunDir, read_run_json
from harness.store.runmeta import RunMeta

CAVEAT = ("Acceptance is not comparable across drafter architectures: a sequential drafter (draft-simple) and a "
          "block drafter (DFlash, DSpark) accept different amounts per pass. Compare wall-clock tok/s.")


TORN_SAMPLES = ("the last line of samples.jsonl was cut short (a crash mid-write): that batch of the sampling study "
                "is not counted")


def latest_run(results_dir: Path) -> Path:
    """The newest run folder under results_dir (by run.json's created_at)."""
    runs = []
    if results_dir.is_dir():
        for p in results_dir.iterdir():
            f = p / "run.json"
            if f.is_file():
                try:  # bounded as every reader of a run folder is (a forged run.json may sit beside the others)
                    obj = read_run_json(f)
                except KitError:
                    continue
                if isinstance(obj, dict):
                    runs.append((str(obj.get("created_at", ""))[:64], p.name, p))
    if not runs:
        raise KitError(f"no run folders under {results_dir}; run `invoke run` first or name one")
    return max(runs)[2]


def _flags(c: shapes.CellSummary) -> list[str]:
    out = []
    con = c["checks"].get("contamination")
    if con and con["flagged"]:
        out.append(f"⚠ {con['data'].get('kind', 'flagged')}")
    phy = c["checks"].get("physics")
    if phy and phy["flagged"]:
        out.append("⚠ impossible")
    spec = c["checks"].get("speculation")
    if spec and spec["flagged"]:
        out.append("⚠ no drafting")
    if c["runs_failed"]:
        out.append(f"✗ {c['runs_failed']} failed")
    return out


def _unconfirmed(meta: RunMeta) -> str:
    """What the header says of a finished run whose plan has confirmation rounds after a sweep but lists none
    (no paired round to choose from, or a run.json that lost them): its sweep figures are not confirmed."""
    if meta.status != "complete" or not meta.plan.confirm_rounds or meta.plan.confirm_from() is not None \
            or not tuning.swept(meta):
        return ""
    return (f"**{meta.plan.confirm_rounds} confirmation round(s) planned after the sweep, none listed in run.json**: "
            "every sweep figure below is the sweep's own, unconfirmed (the best of several reads high)")


def _header(summary: shapes.Summary, meta: RunMeta, load_alone: bool = False) -> str:
    b = meta.build
    plan, src = b.plan, b.source
    source = (f"sdist {src.get('package')}=={src.get('version')} (sha256 {str(src.get('sha256', ''))[:12]})"
              if src["kind"] == "sdist" else f"git {src.get('repo')} {str(src.get('commit', ''))[:12]}"
              if src["kind"] == "git" else "local folder")
    hw = summary["hardware"]
    proto = ("**naive: one server per strategy, caches carry over (reuse-server)**"
             if summary["protocol"] == "reuse-server" else "one fresh container per measurement")
    m = summary["measurements"]
    hosts = []
    for h, e in meta.environment.items():
        gpu = f", {', '.join(e.gpu_names())} (driver {e.gpus[0]['driver']})" if e.gpus else ""
        hosts.append(f"{h}: {e.cpu_model or '?'}, {e.cpus} CPUs{gpu}, Docker {e.docker_version}")
    # a backend that compiles for GPU architectures names them in the image's label (harness/image/recipe.py)
    arches = plan["labels"].get(f"{LABEL_PREFIX}.cuda-architectures")
    rows = [
        ("manifest", f"{fm.md(summary['manifest']['name'])} (sha256 {summary['manifest']['sha256'][:16]})"),
        ("run", f"{summary['run_id']} ({summary['status']}, {m['ok']} ok, {m['failed']} failed of {m['planned']} "
                "planned" + (f", {m['retakes']} measurement{'s' if m['retakes'] != 1 else ''} retaken"
                             + (f", restoring {m['retake_pairs']} pair{'s' if m['retake_pairs'] != 1 else ''}"
                                if m.get("retake_pairs") is not None else "")
                             if m.get("retakes") else "") + ")"),
        ("hardware",
         f"{fm.md(hw['name'])}, {fm.plain(hw['memory_bandwidth_gbs'])} GB/s ({fm.md(hw['bandwidth_source'])})"),
        ("hosts", fm.md("; ".join(hosts), 1000)),
        ("image", f"{fm.md(b.tag)} ({fm.md(b.image_id[:19])})"),
        ("llama.cpp", fm.md(f"build {src.get('build_number')}, commit {src.get('commit')}, {source}")),
        ("backend", fm.md(b.backend + (f", CUDA arch {arches}" if arches else ""))),
        ("cmake", " ".join(fm.code(a) for a in plan["cmake_args"]
                           if not a.startswith(("-DLLAMA_BUILD_NUMBER", "-DLLAMA_BUILD_COMMIT")))),
        ("protocol", f"{proto}; {summary['runs']} runs per cell in rounds, shuffled (seed {meta.plan.shuffle_seed})"
                     + _confirmation_note(summary)),
        ("sampling", "temperature 0, cache_prompt false, seed fixed; tok/s is client-side wall clock of the decode"),
    ]
    if summary.get("distribution") and not m["planned"]:  # a sampling study drawn alone: no timed measurement
        rows[1] = ("run", f"{summary['run_id']} ({summary['status']}, the sampling study alone)")
        rows[-2:] = [("protocol", f"one fresh container per batch of samples, rounds shuffled (seed "
                                  f"{meta.plan.shuffle_seed})")]
    if load_alone:  # a load study measured alone: its levels are in its own section
        rows[1] = ("run", f"{summary['run_id']} ({summary['status']}, the load study alone)")
        rows[-2:] = [("protocol", "one fresh server per strategy, slot count, level and round (the load study's "
                                  "section below)")]
    if meta.builds:  # several builds: each one's image and source (their tables name them too)
        rows[4:6] = [("builds", fm.md("; ".join(f"{n}: {r.tag} ({r.image_id[:19]}), {builds.source_text(r)}"
                                                for n, r in meta.builds.items()), 1000))]
    unconfirmed = _unconfirmed(meta)
    if unconfirmed:
        rows.insert(2, ("plan", unconfirmed))
    reach = summary.get("reproduction_reach")
    if reach:
        rows.append(("reproduction", fm.md(reach["sentence"][0].upper() + reach["sentence"][1:], 1000)))
    qw = summary.get("quiet_wait")
    if qw:
        rows.insert(rows.index(next(r for r in rows if r[0] == "protocol")) + 1, ("quiet wait", _quiet_wait(qw)))
    devices = [f"{h}: " + "; ".join(d["line"] for d in e.devices["devices"])
               + (f" (llama.cpp told to use Vulkan {e.devices['chosen']})" if e.devices["chosen"] is not None
                  else "")
               for h, e in meta.environment.items() if e.devices]
    if devices:  # GPU backends (records since the device facts): CPU runs' headers stay as they were
        rows.insert(4, ("devices", fm.md(" | ".join(devices), 1000)))
    out = table([list(r) for r in rows], ["", ""])
    models = [[fm.md(k), fm.md(v.file), fm.size(v.size_bytes), fm.md(v.quantization or "-"),
               fm.code(v.sha256)] for k, v in meta.models.items()]
    return out + "\n\n" + table(models, ["model", "file", "size", "quant", "sha256"])


def _quiet_wait(qw: shapes.QuietWaitSummary) -> str:
    """The header's line on --quiet-wait: the bound, and what the waits came to."""
    out = (f"up to {fm.num(qw['bound_s'], 1)} s before each timed request, until other work on the host used less "
           f"than {fm.plain(stats.DISTURBED_CORES)} of a core (the server ready and idle)")
    if qw["measurements"]:
        out += (f": {qw['measurements']} measurements waited a median {fm.num(qw['waited_median_s'], 1)} s (at most "
                f"{fm.num(qw['waited_max_s'], 1)} s); {qw['bound_reached']} reached the bound with the host still busy")
    return out
def _confirmation_note(summary: shapes.Summary) -> str:
    """Where a sweep's confirmation rounds are reported: in its own section, never in the run's tables."""
    rounds = summary.get("confirmation_rounds")
    if not rounds:
        return ""
    which = f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"
    return f"; {which} confirm the sweep's best two and are reported in the sweep section only, not in these tables"


def _no_figure(c: shapes.CellSummary | None) -> str:
    """What a throughput cell without a median says: its runs failed, other work disturbed every run it measured
    (set aside, none retaken clean), or nothing was measured."""
    if c is not None and c["runs_ok"] and not c["runs_used"]:
        return f"⚠ all {c['runs_ok']} runs disturbed"
    return "✗ failed" if c and c["runs_failed"] else "missing"


def _throughput(v: View) -> tuple[str, list[str]]:
    cols = v.columns()
    rows, notes = [], []
    for t in v.s["tasks"]:
        row = [fm.md(t)]
        for h, s in cols:
            c = v.cell(h, s, t)
            if c is None or c["decode_tok_s"]["median"] is None:
                row.append(_no_figure(c))
                continue
            d = c["decode_tok_s"]
            txt = f"{fm.num(d['median'], 2)} ±{fm.fixed(d['spread_pct'], 0)}%"
            flags = _flags(c)
            if flags:
                txt += " " + " ".join(flags)
                notes += _notes(v, c)
            row.append(txt)
        rows.append(row)
    return table(rows, ["task"] + [v.label(h, s) for h, s in cols]), notes


def _speedup_text(estimate: float | None, iv: shapes.IntervalJson | None, verdict: shapes.VerdictJson | None) -> str:
    if estimate is None:
        return "-"
    if (verdict or {}).get("kind") == TOO_FEW:
        return too_few(estimate, (iv or {}).get("n", 0))
    return marked(estimate, iv, verdict)


def _speedups(v: View) -> str:
    """Strategies x tasks: paired speedup, its 95% interval and the verdict's mark; the geomean last."""
    geo = {(g["host"], g["strategy"]): g for g in v.s.get("geomeans", [])}
    rows = []
    for h, s in v.columns(speculative_only=True):
        row = [v.label(h, s), fm.md(v.kinds[s]["baseline"])]
        for t in v.s["tasks"]:
            c = v.cell(h, s, t)
            row.append(_speedup_text(c["speedup"], c.get("speedup_interval"), c.get("verdict")) if c else "-")
        g = geo.get((h, s))
        part = f" (over {len(g['tasks'])} of {len(g['tasks']) + len(g['left_out'])} tasks)" \
            if g and g.get("left_out") else ""
        row.append(f"**{_speedup_text(g['estimate'], g['interval'], g['verdict'])}**{part}" if g else "-")
        tasks = (g or {}).get("between_tasks")
        row.append(fm.interval(tasks["low"], tasks["high"]) if tasks and tasks.get("low") is not None else "-")
        rows.append(row)
    if not rows:
        return "(no strategy with a baseline)"
    return table(rows, ["strategy", "vs"] + [fm.md(t) for t in v.s["tasks"]] +
                  ["geomean (for these prompts)", "for tasks like these"])


def _notes(v: View, c: shapes.CellSummary) -> list[str]:
    who = f"{v.label(c['host'], c['strategy'])} / {fm.md(c['task'])}"
    out = [f"- {who}: {fm.md(x['sentence'])}" for k in ("contamination", "physics")
           if (x := c["checks"].get(k)) and x["flagged"] and k != "speculation"]
    out += [f"- {who}: {fm.md(x['sentence'])}" for x in [c["checks"].get("speculation")] if x and x["flagged"]]
    out += [f"- {who} run {f['run_index']} failed: {fm.md(f['reason'])}" for f in c["failures"]]
    return out


def _warnings(v: View) -> list[str]:
    """Stability warnings, hyperfine-style: the everywhere-kinds counted once, the specific ones listed."""
    by_kind: dict[str, list[tuple[shapes.CellSummary, shapes.CellWarning]]] = {}
    for c in v.s["cells"]:
        for w in c.get("warnings", []):
            by_kind.setdefault(w["kind"], []).append((c, w))
    lines = []
    total = sum(1 for c in v.s["cells"] if c["runs_ok"])
    for kind in ("few-rounds", "dispersion"):
        items = by_kind.pop(kind, [])
        if items:
            cells = sorted({f"{v.label(c['host'], c['strategy'])} / {fm.md(c['task'])}" for c, _ in items})
            what = {"few-rounds": f"fewer than {fm.count(MIN_ROUNDS)} paired rounds: no interval and no verdict",
                    "dispersion": f"tok/s varies more than {fm.pct(DISPERSION_CV)} across runs"}[kind]
            who = "every cell" if len(cells) >= total else ", ".join(cells[:12]) + (" ..." if len(cells) > 12 else "")
            lines.append(f"- **{kind}** ({len(cells)} of {total} cells): {what}: {who}")
    for kind, items in sorted(by_kind.items()):
        for c, w in items[:20]:
            lines.append(f"- **{kind}** {v.label(c['host'], c['strategy'])} / {fm.md(c['task'])}: "
                         f"{fm.md(w['sentence'])}")
    return lines


def sensitivity_table(summary: shapes.Summary, fmt: str = "github") -> str:
    """Probe tasks: each variant against the reference prompt, per strategy."""
    several = len(summary["hosts"]) > 1
    rows = []
    for x in summary.get("sensitivity", []):
        iv = x["tok_s_ratio_interval"]
        rows.append(([fm.md(x["host"])] if several else []) + [
            fm.md(x["strategy"]), fm.md(f"{x['task']}: {x['variant']}"),
            _speedup_text(x["tok_s_ratio"], iv, None), f"{fm.pct(x['acceptance_reference'])} → "
            f"{fm.pct(x['acceptance_variant'])}", f"{fm.ratio(x['speedup_reference'])} → "
            f"{fm.ratio(x['speedup_variant'])}",
            "-" if x["output_common_prefix_tokens"] is None else
            f"{x['output_common_prefix_tokens']} of {x['output_tokens']}"])
    if not rows:
        return ""
    return tabulate(rows, headers=(["host"] if several else []) + [
        "strategy", "variant", "tok/s vs reference", "acceptance", "speedup vs baseline",
        "output tokens as the reference's"], tablefmt=fmt, disable_numparse=True)


def _family(fam: shapes.FamilyJson) -> str:
    """What the printed table's marks guarantee, with the family they were judged in, and what its rounds could
    mark."""
    if not fam["cells"]:
        return NO_VERDICT
    text = (f"Every mark of this table, cells and geometric means alike, is judged in one family: "
            f"{fam['cells']} cell{'s' if fam['cells'] != 1 else ''} and {fam['geomeans']} geometric "
            f"mean{'s' if fam['geomeans'] != 1 else ''}, {fam['tests']} tests (differs from 1; within "
            f"±{fm.pct(fam.get('band', 0.02))} by two one-sided tests), Holm's procedure at 5%: in 95% of tables no "
            "mark of the table is wrong. The geometric mean's interval is for these prompts; the one for tasks like "
            "these also counts how much tasks differ.")
    sentence = (fam.get("power") or {}).get("sentence")
    return f"{text} {sentence}" if sentence else text


def render_run(rd: RunDir, summary: shapes.Summary, out_path: Path, plot: Path | None, beside: str = "",
               load: str = "") -> str:
    """One run's section; `beside`: Markdown of plots shown on the speedup plot's line."""
    meta = rd.read_meta()
    v = View(summary)
    load_alone = not summary["measurements"]["planned"] and bool(load)  # `load`: the run's load section, if any
    parts = [f"## Run {fm.md(summary['run_id'])}", "", *headline.markdown(summary), _header(summary, meta, load_alone),
             ""]
    if not summary["measurements"]["planned"] and summary.get("distribution"):  # a sampling study drawn alone
        return "\n".join(parts + lossless_report.section(summary["distribution"], v.several_hosts,
                                                                builds.measured_on(builds.build_names(meta)))
                         + ([f"- {TORN_SAMPLES}", ""] if summary["measurements"].get("torn_samples_line") else []))
    if not summary["measurements"]["planned"]:  # a load study measured alone: its section follows (write)
        return "\n".join(parts)
    if summary["protocol"] == "reuse-server":
        parts += ["> ⚠ **Naive protocol.** This run reused one server per strategy, so n-gram tables and caches "
                  "carried over from one request to the next. Its figures show the artefact the default "
                  "protocol protects against; do not quote them as speedups.", ""]
    views = [(name, View(sub)) for name, sub in builds_report.by_build(summary)]  # one per build
    throughput = [(name, _throughput(bv)) for name, bv in views]
    notes = [n for _, (_, ns) in throughput for n in ns]
    fam = summary["family"]
    braced = intervals.braces([(c.get("speedup_interval"), c.get("verdict")) for c in summary["cells"]]
                    + [(g["interval"], g["verdict"]) for g in summary.get("geomeans", [])])
    parts += ["### Speedup (paired by round; 95% interval; ▲ faster ▼ slower ≈ equivalent · not significant)", "",
              _family(fam) + builds_report.family_note(summary)
              + (" " + intervals.family_note(fam["tests"], fam["alpha"]) if braced and fam["tests"] else ""), ""]
    for name, bv in views:
        parts += builds_report.heading(summary, name) + [_speedups(bv), ""]
    parts += [f"> {fm.md(summary['rules']['speedup'], 2000)}", ""]
    parts += categories_report.section(summary)  # a run with prompt suites
    parts += builds_report.section(summary)
    if plot is not None:
        rel = os.path.relpath(plot.resolve(), out_path.resolve().parent)
        parts += [f"![speedup per task and strategy with 95% intervals]({Path(rel).as_posix()}) {beside}".rstrip(), ""]
    parts += ["### Decode throughput (tok/s, wall clock; median ±half-range over runs)", ""]
    for name, (tput, _) in throughput:
        parts += builds_report.heading(summary, name, short=True) + [tput, ""]
    if notes:
        parts += ["Flags:", ""] + notes + ["", f"> {fm.md(summary['rules']['contamination'], 1000)}", ""]
    if summary.get("checks_ran"):
        parts += ["Checks that ran (each says what it compared, also when it found nothing):", ""]
        parts += [f"- {fm.md(x['sentence'], 1000)}" for x in summary["checks_ran"]] + [""]
    warnings = _warnings(v)
    if warnings:
        parts += ["### Stability warnings", ""] + warnings + [""]
    conv = summary.get("convergence")
    if conv:
        parts += [f"### Adaptive rounds (--until ±{fm.pct(conv['target'])}, at most {conv['max_rounds']} rounds)", ""]
        if conv["not_converged"]:
            parts += [f"{len(conv['not_converged'])} cell(s) did not reach ±{fm.pct(conv['target'])} in "
                      f"{conv['rounds']} rounds:", ""]
            parts += [f"- {v.label(c['host'], c['strategy'])} / {fm.md(c['task'])}: {c['rounds']} rounds, "
                      f"±{fm.pct(c['half_width'])}" + (f", about {c['rounds_estimate']} rounds needed"
                                                       if c["rounds_estimate"] else "")
                      for c in conv["not_converged"]]
        else:
            parts.append(f"every speedup interval is within ±{fm.pct(conv['target'])} after {conv['rounds']} rounds")
        parts.append("")
    parts += ["### Interference: other work on the host during each timed request", "",
              check_tables.interference(v), "",
              f"> {fm.md(summary['rules']['interference'], 1000)}", ""]
    sens = sensitivity_table(summary)
    if sens:
        parts += ["### Prompt sensitivity (each variant against its task's first prompt, paired by round)", "",
                  "A phrase added or removed: how throughput (95% interval), acceptance, the speedup against the "
                  "baseline and the output (tokens in common with the reference prompt's output) move.", "", sens,
                  ""]
    parts += ["### Acceptance and tokens per target pass", "", f"> {CAVEAT}", "",
              "Accepted of drafted (the server's timings), tokens per target pass (predicted / (predicted - "
              "accepted)), and the server's own mean accepted length per draft call where its log prints one.", ""]
    for name, bv in views:
        parts += builds_report.heading(summary, name, short=True) + [check_tables.acceptance(bv), ""]
    parts += ["### Physics: the memory-bandwidth roofline", "",
              "Ceiling = bandwidth / bytes one target pass reads (its weights, or for a mixture of experts the shared "
              "weights and the routed experts; the KV cache at the decode depth; the draft's weights times its "
              "steps per pass), read from the GGUF headers; implied passes/s = tok/s / tokens per pass. A figure "
              "above the ceiling is a measurement bug. Speculative cells are listed only when flagged.", "",
              check_tables.physics(v), ""]
    parts += breakeven_report.section(summary)  # the ceiling at full acceptance, beside the roofline
    parts += ["### Determinism at temperature 0 (lossless in distribution, not bit-exact)", "",
              check_tables.determinism(v), ""]
    parts += lossless_report.section(summary.get("distribution"), v.several_hosts,
                                     builds.measured_on(builds.build_names(meta)))
    conc = check_tables.concurrency(v)
    if conc:
        parts += ["### Concurrency (N clients at once; aggregate = all streams' tokens / wall time)", "", conc, ""]
    dev = check_tables.devices(v, meta)
    if dev:
        parts += ["### Devices: where the measurements ran (the server's load lines)", "",
                  "Layers offloaded of the model's (target, then drafter), and the device buffers llama-server "
                  "allocated (model, KV cache, compute) in MiB.", "", dev, ""]
    parts += ["### Prefill, time to first token, load, memory (medians)", "", check_tables.latency(v), ""]
    torn = summary["measurements"].get("torn_samples_line")
    if summary["missing"] or summary["measurements"].get("torn_last_line") or torn:
        parts += ["### Missing cells", ""]
        parts += [f"- {v.label(m['host'], m['strategy'])} / {fm.md(m['task'])}: {m['recorded']} of {m['expected']} "
                  "runs recorded" for m in summary["missing"]]
        if summary["measurements"].get("torn_last_line"):
            parts.append("- the last line of measurements.jsonl was cut short (a crash mid-write): that measurement "
                         "is not counted")
        if torn:
            parts.append(f"- {TORN_SAMPLES}")
        parts.append("")
    return "\n".join(parts)


def completion_text(summary: shapes.Summary) -> str:
    """The run section's last words where cells lack a verdict the run could still give them: which, why, and the
    one command that completes it (harness/analysis/completion.py); '' where there is none."""
    c = summary.get("completion") or {}
    if not c.get("command"):
        return ""
    v = View(summary)
    cells = c["fillable"] or c["short_planned"]
    names = ", ".join(f"{v.label(x['host'], x['strategy'])} / {fm.md(x['task'])}" for x in cells[:12])
    names += f" and {len(cells) - 12} more" if len(cells) > 12 else ""
    out = ["### To complete this run", ""]
    if c["fillable"]:
        what = [f"{n} measurement{'s' if n != 1 else ''} {w}"
                for w, n in (("not made yet (the run was interrupted)", c["unmeasured"]),
                             ("disturbed by other work", c["disturbed"]),
                             ("failed while other work ran or where their cell succeeded", c["failed"])) if n]
        cap = c["retake_cap"]
        out.append(f"{len(cells)} cell{' has' if len(cells) == 1 else 's have'} no verdict (fewer than "
                   f"{MIN_ROUNDS} paired rounds) that measuring again would give: {names}. To measure (again): "
                   f"{'; '.join(what)}; "
                   + (f"the run retook {c['retakes_made']} of its cap of {cap}" if cap is not None else
                      "the run predates retakes") + ". This resumes it and measures them (the retakes where they "
                   "restore the most pairs first):")
    else:
        out.append(f"{len(cells)} cell{' was' if len(cells) == 1 else 's were'} planned with fewer rounds than a "
                   f"verdict needs ({MIN_ROUNDS}): {names}. "
                   + ("This resumes the run with the rounds they lack:" if c["resumes"] else
                      "Rounds follow the planned ones (a sweep's confirmation, --until), so the planned runs "
                      "cannot grow; a new run with enough rounds:"))
    out += ["", fm.code(c["command"], 1000), ""]
    said = {"--retakes": "the run's new cap of retakes, the retakes already made counting against it",
            "--quiet-wait": "each measurement first waits up to that long for a quiet host"}
    notes = [f"{fm.code(f'{k} {val}')}: {said[k]}" for k, val in c["flags"].items() if k in said]
    if notes and c["fillable"]:
        out += ["; ".join(notes) + ".", ""]
    return "\n".join(out)


def plot_speedups(summary: shapes.Summary, path: Path) -> Path | None:
    """A grouped bar chart of speedup per task per strategy (PNG), or None without a speculative strategy."""
    v = View(summary)
    cols = v.columns(speculative_only=True)
    if not cols:
        return None
    # Names come from the run folder: shown as plain text, never as mathtext ($...$) or LaTeX.
    with plotting.pyplot() as plt:
        return _draw(plt, v, cols, summary, path)


def _draw(plt: Any, v: View, cols: list[tuple[str, str]], summary: shapes.Summary, path: Path) -> Path:
    """The bars, labels and legend of plot_speedups, every text without math parsing."""
    tasks = summary["tasks"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks) + 2), 3.6), dpi=100)
    width = 0.8 / max(1, len(cols))
    # a run of several builds: one colour per strategy across builds, the first build's bars plain, later hatched
    later, colour = builds_report.later_builds(summary), builds_report.colours(summary, cols)
    for i, (h, s) in enumerate(cols):
        cells = [v.cell(h, s, t) or {} for t in tasks]
        ys = [c.get("speedup") or 0.0 for c in cells]
        ivs = [c.get("speedup_interval") or {} for c in cells]
        lo = [max(0.0, y - (iv.get("low") or y)) for y, iv in zip(ys, ivs, strict=True)]
        hi = [max(0.0, (iv.get("high") or y) - y) for y, iv in zip(ys, ivs, strict=True)]
        xs = [j + (i - (len(cols) - 1) / 2) * width for j in range(len(tasks))]
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, error_kw={"linewidth": 0.7},
               hatch="//" if v.kinds[s].get("build") in later else None, color=colour.get((h, s), f"C{i % 10}"),
               label=plotting.label(f"{h}: {s}" if v.several_hosts else s))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), [plotting.label(t, 60) for t in tasks], rotation=30, ha="right",
                  parse_math=False)
    ax.set_ylabel("speedup vs baseline (95% interval)")
    ax.set_title(f"{plotting.label(summary['manifest']['name'])}: paired decode speedup per task", parse_math=False)
    for text in ax.legend(fontsize=7, ncol=max(1, len(cols) // 6)).get_texts():
        text.set_parse_math(False)
    return plotting.save(plt, fig, path)


def reach_text(run_dir: Path) -> str:
    """How well a reproduction of the run can confirm it (summary.json's `reproduction_reach`, as `write` left it
    in the run folder), '' without one."""
    summary = json.loads((RunDir.open(run_dir).path / "summary.json").read_text(encoding="utf-8"))
    reach = summary.get("reproduction_reach")
    return f"reproduction: {reach['sentence']}" if reach else ""


def headlines(run_dirs: list[Path]) -> str:
    """What each run says (harness/report/headline.py), from the summary.json `write` left in its folder."""
    out = []
    for d in run_dirs:
        rd = RunDir.open(d)
        text = headline.terminal(json.loads((rd.path / "summary.json").read_text(encoding="utf-8")))
        load = load_report.terminal(rd.path, rd.path.name)
        out += [x for x in (text, load) if x] + [""] if text or load else []
    return "\n".join(out).rstrip()


def write(run_dirs: list[Path], out_path: Path, plot: bool = True,
          comparison: cmp.Comparison | None = None) -> list[Path]:
    """Write summary.json (+ plot.png) in each run folder and one Markdown report for all of them."""
    written: list[Path] = []
    sections = []
    names = []
    summaries = {d: summarize(RunDir.open(d)) for d in run_dirs}  # a reused-server run is shown beside fresh ones
    for d in run_dirs:
        rd = RunDir.open(d)
        summary = summaries[d]
        schema.check("summary", summary, f"{rd.path}/summary.json")
        sp = rd.path / "summary.json"
        atomic_write_text(sp, json.dumps(summary, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
        written.append(sp)
        timed = bool(summary["measurements"]["planned"])  # a sampling study drawn alone has no speedup to draw
        png = plot_speedups(summary, rd.path / "plot.png") if plot and timed else None
        if png:
            written.append(png)
        extra = tuning_report.write_plots(summary, rd.path) if plot else {}
        why = why_report.write_plots(summary, rd.path, list(summaries.values())) if plot else {}
        dims = dimensions_report.write_plots(summary, rd.path) if plot else {}
        written += [*extra.values(), *why.values(), *dims.values()]
        load = load_report.section(rd.path, out_path, plot)
        sections.append(render_run(rd, summary, out_path, png, why_report.image(why, "positions", out_path,
                                                                                "acceptance by draft position"), load)
                        + tuning_report.section(summary, out_path, extra)
                        + dimensions_report.section(summary, out_path, dims)
                        + why_report.section(summary, out_path, why, list(summaries.values()))
                        + completion_text(summary))
        if load:  # the load study's section, a blank line after what came before
            sections[-1] = sections[-1].rstrip("\n") + "\n\n" + load
        names.append(summary["manifest"]["name"])
    real = [breakeven.split(rd.read_meta(), rd.measurements()) for rd in map(RunDir.open, run_dirs)]
    parity = why_report.parity_section(explanation.report_parity([(m, CellIndex(r)) for m, r in real]))
    sections += [parity] if parity else []
    if comparison is not None:
        sections.append("\n".join([f"## Comparison: {fm.md(comparison.a.run_id)} (A) vs "
                                   f"{fm.md(comparison.b.run_id)} (B)", "", "```",
                                   compare_words.text(comparison, "simple").replace("```", "'''"), "```", ""]))
    title = f"# Results: {fm.md(', '.join(dict.fromkeys(names)))}"
    body = "\n".join([title, "", "<!-- Generated by `invoke report` from the run folders below; edits are lost. -->",
                      ""] + sections)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(body.rstrip() + "\n", encoding="utf-8")
    written.append(out_path)
    return written
