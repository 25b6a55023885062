"""The report's sweep and serving sections and their plots, from a summary's `sweeps` and `serving` parts
(harness/analysis/tuning.py). Every name from the run folder is escaped for Markdown and drawn as plain text."""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness import formatter as fm
from harness.report import plotting, view
from harness.store import shapes


def _fig(f: shapes.FigureJson | None) -> str:
    """'1.23x [1.10, 1.37]' from a figure's dict; '-' without an estimate."""
    if not f or f.get("estimate") is None:
        return fm.DASH
    iv = fm.interval(f.get("low"), f.get("high")) if f.get("low") is not None else "(no interval)"
    return f"{fm.ratio(f['estimate'])} {iv}"


def _rounds(rounds: list[int]) -> str:
    return f"round {rounds[0]}" if len(rounds) == 1 else f"rounds {rounds[0]}-{rounds[-1]}"


def _who(res: shapes.SweepJson, several_hosts: bool) -> str:
    return fm.md(f"{res['host']}: {res['family']}" if several_hosts else res["family"])


def _headline(res: shapes.SweepJson, sel: str, conf_rounds: str | None) -> list[str]:
    """The sweep's headline: the winner where the best two are distinguishable, else "best two not
    distinguishable", each figure with the rounds it comes from."""
    overall, conf, win = res["overall"], res["confirmation"], res.get("winner")
    sweep_fig = {c["combination"]: c["figure"] for c in overall["candidates"]}
    if conf and conf["runner_up"]:
        w, ru = conf["winner"], conf["runner_up"]
        figs = {w: conf["winner_figure"], ru: conf["runner_up_figure"]}
        vs = conf["winner_vs_runner_up"]
        if win:
            other = ru if win == w else w
            ahead = vs if win == w else {"estimate": 1 / vs["estimate"], "low": 1 / vs["high"], "high": 1 / vs["low"]}
            first = "" if win == w else " (the selection rounds' runner-up)"
            return [f"**Winner {fm.md(win)}{first}: confirmed {_fig(figs[win])}** in the confirmation {conf_rounds}, "
                    f"ahead of {fm.md(other)} by {_fig(ahead)} (paired by round); in the selection {sel} "
                    f"{_fig(sweep_fig.get(win))}."]
        why = "too few confirmation rounds to compare them" if vs.get("low") is None else \
            f"{fm.md(w)} over {fm.md(ru)} {_fig(vs)}, paired by round"
        return [f"**Best two not distinguishable: {fm.md(w)} and {fm.md(ru)}** in the confirmation {conf_rounds} "
                f"({why}): no winner is named. Confirmed: {fm.md(w)} {_fig(figs[w])}, {fm.md(ru)} {_fig(figs[ru])}; "
                f"in the selection {sel}: {_fig(sweep_fig.get(w))} and {_fig(sweep_fig.get(ru))}."]
    best = overall["best"]
    runner = overall["candidates"][1] if len(overall["candidates"]) > 1 else None
    tail = ("confirmed in the confirmation " + conf_rounds + f": {_fig(conf['winner_figure'])}" if conf else
            "not confirmed (no confirmation rounds): the best of several noisy combinations reads high")
    if win:
        vs = "" if runner is None else (f", the runner-up {fm.md(runner['combination'])} worse (Holm-adjusted p = "
                                        f"{fm.num(runner['p_holm'], 3)})")
        return [f"**Winner {fm.md(best)} in the selection {sel}: {_fig(sweep_fig[best])}**{vs}; {tail}."]
    return [f"**Best two not distinguishable: {fm.md(best)} and {fm.md(runner['combination'])}** in the selection "
            f"{sel} (Holm-adjusted p = {fm.num(runner['p_holm'], 3)}): no winner is named; {fm.md(best)} "
            f"{_fig(sweep_fig[best])}, {tail}."]


def sweep_text(res: shapes.SweepJson, several_hosts: bool, selection: list[int] | None = None) -> list[str]:
    """One sweep: the headline (a winner only where the best two are distinguishable), every combination against
    the best, and each task's best; selection and confirmation figures in columns of their own, labelled with
    their rounds."""
    overall = res["overall"]
    if overall is None:
        return [f"#### Sweep {_who(res, several_hosts)}", "", "no paired rounds: nothing to choose from", ""]
    conf = res["confirmation"]
    sel_rounds = selection or list(range(1, max(c["figure"]["rounds"] for c in overall["candidates"]) + 1))
    sel = _rounds(sel_rounds) if sel_rounds else "rounds"
    conf_rounds = _rounds(conf["rounds"]) if conf else None
    out = [f"#### Sweep {_who(res, several_hosts)}: {len(res['combinations'])} combinations", ""]
    out += _headline(res, sel, conf_rounds)
    tied = overall["tied"]
    out += ["", f"Not distinguishable from the best in the selection {sel} (Holm, family-wise 5%): "
            f"{', '.join(fm.md(t) for t in tied)}" if len(tied) > 1 else
            f"Every other combination is worse than the best in the selection {sel} (Holm, family-wise 5%).", ""]
    confirmed = {}
    if conf:
        confirmed = {conf["winner"]: conf["winner_figure"]}
        if conf["runner_up"]:
            confirmed[conf["runner_up"]] = conf["runner_up_figure"]
    rows = []
    for c in overall["candidates"]:
        mark = ("best" if c["combination"] == overall["best"] else "worse" if c["distinguishable"]
                else "not distinguishable")
        rows.append([fm.md(c["combination"]), _fig(c["figure"]),
                     fm.DASH if c["combination"] == overall["best"] else _fig(c["vs_best"]),
                     fm.num(c["p_holm"], 3), mark] + ([_fig(confirmed.get(c["combination"]))] if conf else []))
    out += [view.table(rows, ["combination", f"speedup, selection {sel}", "vs best, by round", "p (Holm)", ""]
                   + ([f"confirmed, {conf_rounds}"] if conf else [])), ""]
    if res["tasks"]:
        two = [c for c in (conf["winner"], conf["runner_up"]) if c] if conf else []
        per = {conf["winner"]: conf.get("winner_tasks", {})} if conf else {}
        if conf and conf["runner_up"]:
            per[conf["runner_up"]] = conf.get("runner_up_tasks", {})
        rows = []
        for t in res["tasks"]:
            best = next(c for c in t["candidates"] if c["combination"] == t["best"])
            rows.append([fm.md(t["task"]), fm.md(t["best"]), _fig(best["figure"]),
                         ", ".join(fm.md(x) for x in t["tied"][1:]) or fm.DASH]
                        + [_fig(per[c].get(t["task"])) for c in two])
        out += [f"Per task (best and not distinguishable from it in the selection {sel}"
                + (f"; the two confirmed, in the confirmation {conf_rounds}" if conf else "") + "):", "",
                view.table(rows, ["task", "best", f"speedup, selection {sel}", "not distinguishable from it"]
                       + [f"{fm.md(c)}, confirmed" for c in two]), ""]
    return out


def serving_text(part: shapes.ServingJson, several_hosts: bool) -> list[str]:
    """One host's serving curves and where batching overtakes each speculative strategy."""
    host = f" on {fm.md(part['host'])}" if several_hosts else ""
    rows = []
    for pts in part["curves"].values():
        for p in pts:
            agg = p["aggregate_tok_s"]
            spec = {True: "yes", False: "no", None: fm.DASH}[p["speculating"]]
            rows.append([fm.md(p["strategy"]), p["streams"], fm.rate(agg["estimate"]),
                         fm.interval(agg["low"], agg["high"], 1) if agg["low"] is not None else fm.DASH,
                         fm.rate(p["per_stream_tok_s"]), fm.num(p["tpot_ms"], 1), fm.num(p["ttft_ms"], 1),
                         fm.num(p["itl_p50_ms"], 1), fm.num(p["itl_p99_ms"], 1), spec])
    out = [view.table(rows, ["strategy", "clients", "aggregate tok/s", "95% interval", "per-stream tok/s",
                         "ms per token", "TTFT ms", "ITL p50 ms", "ITL p99 ms", "speculating (/slots)"]), ""]
    for c in part["crossovers"]:
        steps = []
        for lv in c["levels"]:
            at = ("no level" if lv["speculative_streams"] is None else
                  f"{lv['speculative_streams']} slot{'s' if lv['speculative_streams'] > 1 else ''}")
            fig = _fig(lv["ratio"]) if lv["ratio"]["estimate"] is not None else "no paired rounds"
            steps.append(f"{lv['streams']} client{'s' if lv['streams'] > 1 else ''}: {fig} (speculation at {at})")
        rounds = (f" In the confirmation rounds only ({_rounds(part['confirmation_rounds'][c['strategy']])}): the "
                  "sweep's rounds chose this combination." if c["strategy"] in part.get("confirmation_rounds", {})
                  else "")
        out.append(f"- **{fm.md(c['strategy'])}** against {fm.md(c['baseline'])} (aggregate tok/s, speculation / "
                   f"baseline): {'; '.join(steps)}: {crossover_verdict(c, host)}.{rounds}")
    return out + [""]


def _clients(ns: list[int]) -> str:
    """[1, 2, 4] -> '1, 2 and 4 clients'."""
    text = ", ".join(map(str, ns[:-1])) + (" and " if len(ns) > 1 else "") + str(ns[-1])
    return f"{text} client{'s' if len(ns) > 1 or ns[-1] > 1 else ''}"


def crossover_verdict(c: shapes.CrossoverJson, host: str = "") -> str:
    """Where batching overtakes one speculative strategy, in words: overtaken at the first N whose interval lies
    below 1; "does not overtake" only at levels whose interval lies above 1; every other level "not shown"."""
    levels = c["levels"]
    if not levels:
        return "no level to compare"
    first = levels[0]
    if first["streams"] == c["overtaken_at"] and first["streams"] == first["speculative_streams"]:
        return (f"speculation is slower than the baseline already at {_clients([first['streams']])}: there is "
                "nothing for batching to overtake")
    if c["overtaken_at"] is not None:
        return f"**batching overtakes speculation at {c['overtaken_at']} concurrent clients{host}**"
    ahead = [lv["streams"] for lv in levels if lv["ratio"]["low"] is not None and lv["ratio"]["low"] > 1]
    open_ = [lv for lv in levels if lv["streams"] not in ahead]
    if not open_:
        return f"batching does not overtake speculation up to {_clients([levels[-1]['streams']])}{host}"
    why = " and ".join(dict.fromkeys("no interval" if lv["ratio"]["low"] is None else "the interval reaches 1"
                                     for lv in open_))
    shown = (f"batching does not overtake speculation at {_clients(ahead)}{host}; not shown at " if ahead
             else "that batching does not overtake speculation is not shown at ")
    text = f"{shown}{_clients([lv['streams'] for lv in open_])}{'' if ahead else host} ({why})"
    if c["estimate_below_at"] is not None:
        text += f"; on the estimate batching gives more from {_clients([c['estimate_below_at']])}, not certainly"
    return text


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]


def plot_sweep(res: shapes.SweepJson, path: Path) -> Path | None:
    """A line per value of the other swept flags, the first flag's values along x, the sweep figure with its
    interval from the selection rounds, and the confirmed figures of the best two (their own rounds) as stars."""
    overall = res["overall"]
    if overall is None:
        return None
    import matplotlib.ticker

    figs = {c["combination"]: c["figure"] for c in overall["candidates"]}
    values = {c: dict(v) for c, v in res.get("values", {}).items()}
    first = next(iter(next(iter(values.values()))), None) if values else None
    with plotting.pyplot() as plt:
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        xs_all = list(dict.fromkeys(v.get(first) for v in values.values()))
        lines: dict[str, list[str]] = {}
        for c, v in values.items():
            rest = plotting.label(", ".join(f"{k.lstrip('-')}={x}" for k, x in v.items() if k != first) or "sweep")
            lines.setdefault(rest, []).append(c)
        for rest, combos in lines.items():
            pts = [(xs_all.index(values[c].get(first)), figs[c]) for c in combos if figs.get(c, {}).get("estimate")]
            pts.sort()
            ys = [f["estimate"] for _, f in pts]
            lo = [max(0.0, y - (f["low"] if f["low"] is not None else y)) for y, (_, f) in zip(ys, pts, strict=True)]
            hi = [max(0.0, (f["high"] if f["high"] is not None else y) - y) for y, (_, f) in zip(ys, pts, strict=True)]
            ax.errorbar([x for x, _ in pts], ys, yerr=[lo, hi], marker="o", capsize=3, label=rest)
        conf = res.get("confirmation")
        shown = [f["estimate"] for f in figs.values() if f.get("estimate")]
        if conf:
            for key, fkey, marker, dx in (("winner", "winner_figure", "*", 0.1), ("runner_up", "runner_up_figure", "P",
                                                                                   -0.1)):
                c, f = conf.get(key), conf.get(fkey) or {}
                if c in values and f.get("estimate"):
                    x = xs_all.index(values[c].get(first))
                    est = f["estimate"]
                    shown.append(est)
                    err = [[max(0.0, est - (f["low"] or est))], [max(0.0, (f["high"] or est) - est)]]
                    ax.errorbar([x + dx], [est], yerr=err, marker=marker, markersize=11, color="black",
                                capsize=3, linestyle="none", label=f"confirmed: {plotting.label(c)}")
        ax.set_yscale("log")  # speedups are ratios; an interval of a few rounds is wide upward
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_ylim(min(shown + [1.0]) / 2, max(shown + [1.0]) * 2)  # estimates in view, wild intervals cut
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(xs_all)), [plotting.label(x, 40) for x in xs_all], parse_math=False)
        ax.set_xlabel(plotting.label(first), parse_math=False)
        ax.set_ylabel("speedup vs baseline (95% interval)")
        ax.set_title(f"sweep {plotting.label(res['family'])} ({plotting.label(res['host'])})", parse_math=False)
        for text in ax.legend(fontsize=7).get_texts():
            text.set_parse_math(False)
        return plotting.save(plt, fig, path)


def plot_serving(part: shapes.ServingJson, path: Path) -> Path | None:
    """Aggregate tok/s against per-stream time per token, a line per strategy through its levels (N marked)."""
    if not part["curves"]:
        return None
    with plotting.pyplot() as plt:
        fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
        top = 0.0
        for family, pts in part["curves"].items():
            pts = [p for p in pts if p["tpot_ms"] and p["aggregate_tok_s"]["estimate"]]
            if not pts:
                continue
            xs = [p["tpot_ms"] for p in pts]
            ys = [p["aggregate_tok_s"]["estimate"] for p in pts]
            lo = [max(0.0, y - (p["aggregate_tok_s"]["low"] or y)) for y, p in zip(ys, pts, strict=True)]
            hi = [max(0.0, (p["aggregate_tok_s"]["high"] or y) - y) for y, p in zip(ys, pts, strict=True)]
            label = plotting.label(pts[0]["strategy"] if len(pts) == 1 else family)
            line = ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
            top = max(top, *ys)
            for x, y, p in zip(xs, ys, pts, strict=True):
                ax.annotate(f"N={p['streams']}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=line[0].get_color())
        ax.set_ylim(0, top * 1.6 or 1)  # estimates in view, wild intervals cut
        ax.set_xlabel("per-stream latency: ms per output token")
        ax.set_ylabel("aggregate tok/s (95% interval)")
        ax.set_title(f"serving: throughput against latency ({plotting.label(part['host'])})", parse_math=False)
        for text in ax.legend(fontsize=7).get_texts():
            text.set_parse_math(False)
        return plotting.save(plt, fig, path)


def write_plots(summary: shapes.Summary, folder: Path) -> dict[str, Path]:
    """The sweep and serving plots of a summary into its run folder: key -> file."""
    out: dict[str, Path] = {}
    several = len(summary["hosts"]) > 1
    for res in summary.get("sweeps", []):
        name = f"sweep-{_safe(res['host']) + '-' if several else ''}{_safe(res['family'])}.png"
        p = plot_sweep(res, folder / name)
        if p:
            out[f"sweep:{res['host']}:{res['family']}"] = p
    for part in summary.get("serving", []):
        p = plot_serving(part, folder / f"serving{'-' + _safe(part['host']) if several else ''}.png")
        if p:
            out[f"serving:{part['host']}"] = p
    return out


def section(summary: shapes.Summary, out_path: Path, plots: dict[str, Path]) -> str:
    """The report's sweep and serving sections for one run ('' for a run with neither)."""
    several = len(summary["hosts"]) > 1

    def image(key: str, alt: str) -> list[str]:
        if key not in plots:
            return []
        rel = os.path.relpath(plots[key].resolve(), out_path.resolve().parent)
        return [f"![{alt}]({Path(rel).as_posix()})", ""]

    parts: list[str] = []
    if summary.get("sweeps"):
        parts += ["### Sweeps: which setting (the best two confirmed in fresh rounds)", "",
                  f"> {fm.md(summary['rules_sweep'], 1200)}", ""]
        for res in summary["sweeps"]:
            parts += sweep_text(res, several, summary.get("selection_rounds"))
            parts += image(f"sweep:{res['host']}:{res['family']}", "sweep: speedup per combination, 95% intervals")
    if summary.get("serving"):
        parts += ["### Serving: throughput against per-stream latency at N concurrent clients", "",
                  f"> {fm.md(summary['rules_serving'], 1200)}", ""]
        for part in summary["serving"]:
            parts += serving_text(part, several)
            parts += image(f"serving:{part['host']}", "serving curve: aggregate tok/s against ms per token")
    return "\n".join(parts)
