"""The report's explanation of its speedups, from a summary's `decomposition`, `positions` and `requests` parts
(harness/analysis/explanation.py), and the report-wide acceptance parity: small functions, each one table, text
or plot, so that they can move as they are into a rendering package. Every name from a run folder is escaped for
Markdown and drawn as plain text."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from harness import formatter as fm
from harness.report import breakeven as breakeven_report
from harness.report import plotting, view
from harness.store import shapes

#: Positions shown as columns of the by-position table (the plot shows them all).
TABLE_POSITIONS = 8


def _who(x: shapes.DecompositionJson | shapes.PositionFigures, several_hosts: bool) -> str:
    return fm.md(f"{x['host']}: {x['strategy']}" if several_hosts else x["strategy"])


def _factor(f: shapes.FactorJson) -> str:
    if f.get("low") is None:
        return f"{fm.sig(f['estimate'])} (no interval)"
    return f"{fm.sig(f['estimate'])} [{fm.sig(f['low'])}, {fm.sig(f['high'])}]"


# ---------------------------------------------------------------- decomposition


def cause_text(d: shapes.DecompositionJson) -> str:
    """What decides the cell, in words, with the figures that say so."""
    cause, tpp, step = d["cause"], d["tokens_per_pass"]["estimate"], d["step_cost_passes"]
    if cause == "tokens per pass pay":
        return f"{fm.sig(tpp)} tok/pass outweigh a step costing {fm.sig(step)} baseline passes"
    if cause == "each step too expensive":
        return (f"**each step too expensive**: a step costs {fm.sig(step)} baseline passes and yields "
                f"{fm.sig(tpp)} tokens")
    if cause == "acceptance too low":
        return (f"**acceptance too low**: {fm.pct(d['acceptance'])} of drafted tokens accepted, {fm.sig(tpp)} of "
                f"{fm.sig(d['offered_tokens_per_pass'])} tok/pass offered")
    if cause == "gain and cost balance":
        return (f"{fm.sig(tpp)} tok/pass and a step costing {fm.sig(step)} baseline passes balance (equivalent)")
    if cause == "not decided":
        return "not decided: the speedup has no mark"
    return f"**nothing drafted**: only the pass rate ({fm.sig(d['pass_rate']['estimate'])}) is left"


def decomposition_table(summary: shapes.Summary) -> str:
    """One row per speculative cell: speedup = tokens per pass x pass rate, each factor's interval, what decides,
    and where the server's statistics give them, the draft's share of the decode time and one verifying pass."""
    rows_in = summary.get("decomposition") or []
    if not rows_in:
        return ""
    several = len(summary["hosts"]) > 1
    timed = any(d.get("draft_share") is not None for d in rows_in)
    # where the run measured a break-even curve (harness/analysis/breakeven.py), what decides says it too
    needs = {(c["host"], c["real"], c["task"]): c for c in (summary.get("breakeven") or {}).get("curves", [])}
    rows = []
    for d in rows_in:
        curve = needs.get((d["host"], d["strategy"], d["task"]))
        row = [_who(d, several), fm.md(d["task"]),
               f"{fm.ratio(d['speedup'])} = {fm.sig(d['tokens_per_pass']['estimate'])} tok/pass × "
               f"{fm.sig(d['pass_rate']['estimate'])} pass rate", _factor(d["tokens_per_pass"]),
               _factor(d["pass_rate"]), cause_text(d) + (breakeven_report.decides(curve) if curve else "")]
        if timed:
            row += [fm.pct(d.get("draft_share")),
                    "-" if d.get("verify_pass_ms") is None else
                    f"{fm.num(d['verify_pass_ms'], 1)} ({fm.num(d.get('baseline_pass_ms'), 1)})"]
        rows.append(row)
    headers = ["strategy", "task", "speedup = tokens per pass × pass rate", "tok/pass (95%)", "pass rate (95%)",
               "what decides"]
    if timed:
        headers += ["draft share of decode", "verify pass ms (baseline's)"]
    return view.table(rows, headers)


DECOMPOSITION_RULE = (
    "Tokens per pass: the strategy's tokens per target pass over its baseline's (1: a pass yields one token); pass "
    "rate: its target passes per second over the baseline's. Round by round the two multiply to the paired "
    "speedup, so they multiply back to it here (the pass rate is the speedup over the tokens per pass). A cell "
    "marked slower is decided by the factor further from its ideal: acceptance (every drafted token accepted "
    "would have given the tokens per pass offered) or the step (a step as cheap as a baseline pass). A cell without "
    "a mark is not decided: which side of 1 its estimate fell on is the noise of its rounds. The draft's "
    "share and the verify pass come from the server's trace-level statistics (GPU backends).")


# ---------------------------------------------------------------- by position


def positions_table(summary: shapes.Summary) -> str:
    """Per speculative strategy (over its tasks): the share of draft calls whose first k drafted tokens were all
    accepted, k = 1..TABLE_POSITIONS and the last position."""
    strategies = [p for p in (summary.get("positions") or {}).get("strategies", []) if p["calls"]]
    if not strategies:
        return ""
    several = len(summary["hosts"]) > 1
    width = min(TABLE_POSITIONS, max(len(p["shares"]) for p in strategies))
    rows = []
    for p in strategies:
        shares = p["shares"]
        last = f"{fm.pct(shares[-1])} (k={len(shares)})" if len(shares) > width else "-"
        mean_len = 1 + sum(shares)  # 1 + accepted tokens per call
        rows.append([_who(p, several), fm.md(", ".join(p["sources"])), fm.count(p['calls']), fm.num(mean_len)]
                    + [fm.pct(shares[k]) if k < len(shares) else "-" for k in range(width)] + [last])
    return view.table(rows, ["strategy", "from", "draft calls", "mean accepted length"]
                  + [f"k={k + 1}" for k in range(width)] + ["last"])


def positions_fallback(summary: shapes.Summary) -> list[str]:
    """Where records carry no per-position figures: why (once), and the server's mean accepted length per call."""
    part = summary.get("positions") or {}
    if not part.get("requests_without"):
        return []
    several = len(summary["hosts"]) > 1
    rows = [[_who(p, several), p["requests_without"], fm.num(p["mean_len"]["median"]),
             f"{fm.num(p['mean_len']['min'])}-{fm.num(p['mean_len']['max'])}"]
            for p in part.get("strategies", []) if p["requests_without"]]
    return [f"{fm.count(part['requests_without'])} speculative request(s) of this run carry no per-position figures: "
            f"{fm.md(part['note'], 600)}. Shown for them: the server's mean accepted length per draft call "
            "(1 + accepted / calls), per request.", "",
            view.table(rows, ["strategy", "requests", "mean accepted length (median)", "range"]), ""]


def plot_positions(summary: shapes.Summary, path: Path) -> Path | None:
    """One panel per speculative strategy: share of draft calls with the first k drafted tokens all accepted,
    against k; a thin line per task, the strategy over its tasks bold. None when no strategy has the figures."""
    part = summary.get("positions") or {}
    strategies = [p for p in part.get("strategies", []) if p["calls"]]
    if not strategies:
        return None
    several = len(summary["hosts"]) > 1
    cols = min(4, len(strategies))
    rows = -(-len(strategies) // cols)
    with plotting.pyplot() as plt:
        fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.4 * rows), dpi=100, squeeze=False)
        for ax, p in zip(axes.flat, strategies, strict=False):
            for c in part.get("cells", []):
                if (c["host"], c["strategy"]) == (p["host"], p["strategy"]) and c["calls"]:
                    ks = range(1, len(c["shares"]) + 1)
                    ax.plot(list(ks), c["shares"], color="grey", linewidth=0.6, alpha=0.6)
            ax.plot(list(range(1, len(p["shares"]) + 1)), p["shares"], marker="o", markersize=3, linewidth=1.6)
            ax.set_ylim(0, 1.02)
            ax.set_title(fm.visible(f"{p['host']}: {p['strategy']}" if several else p["strategy"], 60), fontsize=9,
                         parse_math=False)
            ax.set_xlabel("draft position k", fontsize=8)
            ax.set_ylabel("calls with 1..k accepted", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in list(axes.flat)[len(strategies):]:
            ax.set_visible(False)
        fig.suptitle(fm.visible(f"{summary['manifest']['name']}: acceptance by draft position (grey: per task)",
                                100), fontsize=10)
        return plotting.save(plt, fig, path)


# ---------------------------------------------------------------- request by request


def fresh_peer(summary: shapes.Summary, peers: Sequence[shapes.Summary]) -> shapes.Summary | None:
    """For a reused-server run, a fresh-container run of the same manifest in the same report, if any."""
    if summary["protocol"] != "reuse-server":
        return None
    return next((p for p in peers if p["protocol"] == "fresh-container"
                 and p["manifest"]["name"] == summary["manifest"]["name"]), None)


def _fresh_index(peer: shapes.Summary | None) -> dict[tuple[str, str, str], shapes.PromptFigures]:
    if peer is None:
        return {}
    return {(x["strategy"], x["task"], x["prompt"]): x for x in peer["requests"]["prompts"]}


def _count(x: float | None) -> str:
    return fm.num(x, 0)


def requests_table(summary: shapes.Summary, peer: shapes.Summary | None) -> tuple[str, str]:
    """A reused server's requests by index, beside the same prompt in fresh containers; and a sentence that
    counts the requests whose drafts differ from a fresh container's (at temperature 0 they repeat there)."""
    servers = summary["requests"]["servers"]
    if not servers:
        return "", ""
    fresh = _fresh_index(peer)
    rows, differ, compared = [], 0, 0
    for r in servers:
        f = fresh.get((r["strategy"], r["task"], r["prompt"]))
        row = [r["server"], r["index"], fm.md(r["strategy"]), fm.md(f"{r['task']} / {r['prompt']}"),
               _count(r["drafted"]), _count(r["accepted"]), fm.pct(r["acceptance"]), fm.rate(r["tok_s"])]
        if peer is not None:
            mark = ""
            if f is not None and r["drafted"] is not None and f["drafted"] is not None:
                compared += 1
                lo, hi = f["drafted_range"]
                if not lo <= r["drafted"] <= hi:
                    differ += 1
                    mark = " ≠"
            row += ["-" if f is None else f"{_count(f['drafted'])}{mark}",
                    "-" if f is None else _count(f["accepted"]), "-" if f is None else fm.rate(f["tok_s"])]
        rows.append(row)
    headers = ["server", "request", "strategy", "task / prompt", "drafted", "accepted", "acceptance", "tok/s"]
    if peer is not None:
        headers += [f"fresh: drafted ({fm.md(peer['run_id'])})", "fresh: accepted", "fresh: tok/s"]
        sentence = (f"{differ} of {compared} requests drafted a count outside what fresh containers drafted for "
                    "the same prompt (≠): the server's state carried over from the requests before.")
    else:
        sentence = "No fresh-container run of the same manifest is in this report to hold these requests against."
    return view.table(rows, headers), sentence


def plot_requests(summary: shapes.Summary, peer: shapes.Summary | None, path: Path) -> Path | None:
    """Per reused server: tok/s and drafted tokens by request index; the same prompt in fresh containers as x."""
    servers = summary["requests"]["servers"]
    if not servers:
        return None
    fresh = _fresh_index(peer)
    by: dict[int, list[shapes.ServerRequest]] = {}
    for r in servers:
        by.setdefault(r["server"], []).append(r)
    with plotting.pyplot() as plt:
        from matplotlib.ticker import MaxNLocator

        fig, axes = plt.subplots(2, len(by), figsize=(max(5.0, 4.2 * len(by)), 4.6), dpi=100, squeeze=False,
                                 sharex="col")
        for col, rs in enumerate(by.values()):
            xs = [r["index"] for r in rs]
            for row, key, label in ((0, "tok_s", "tok/s"), (1, "drafted", "drafted tokens")):
                ax = axes[row][col]
                ax.plot(xs, [r[key] for r in rs], marker="o", markersize=4, linewidth=1, label="one server")
                fx = [(r["index"], fresh[k][key]) for r in rs
                      if (k := (r["strategy"], r["task"], r["prompt"])) in fresh and fresh[k][key] is not None]
                if fx:
                    ax.plot([a for a, _ in fx], [b for _, b in fx], marker="x", linestyle="none", color="black",
                            label="same prompt, fresh container")
                ax.set_ylabel(label, fontsize=8)
                ax.tick_params(labelsize=7)
                if row == 0:
                    ax.set_title(fm.visible(f"server {col + 1}: {rs[0]['strategy']} ({rs[0]['host']})", 80),
                                 fontsize=9, parse_math=False)
                    for text in ax.legend(fontsize=7).get_texts():
                        text.set_parse_math(False)
            axes[1][col].set_xlabel("request index in the server", fontsize=8)
            axes[1][col].xaxis.set_major_locator(MaxNLocator(integer=True))
        return plotting.save(plt, fig, path)


# ---------------------------------------------------------------- parity


def _setting(w: shapes.SettingJson, other: shapes.SettingJson, runs: list[str]) -> str:
    """A setting named by what differs from the other one (host, backend, build), with its runs."""
    dims = [f"{k} {w[k]}" for k in ("host", "backend", "build") if w[k] != other[k]] or ["same setting"]
    return fm.md(f"{', '.join(dims)} ({', '.join(runs)})")


def parity_text(found: list[shapes.ParityJson]) -> str:
    """Acceptance of the same strategy and files in two settings: the table and each difference beyond noise."""
    if not found:
        return ""
    rows, named = [], []
    for p in found:
        a, b = _setting(p["a"], p["b"], p["runs_a"]), _setting(p["b"], p["a"], p["runs_b"])
        iv = "" if p["low"] is None else f" [{fm.points(p['low'])}, {fm.points(p['high'])}]"
        verdict = ("**differs**" if p["differs"] else "same" if p["difference"] == 0
                   else "no spread to judge by" if p["p_differs"] is None else "within noise")
        rows.append([fm.md(p["strategy"]), fm.md(p["task"]), a, b, fm.pct(p["acceptance_a"], 1),
                     fm.pct(p["acceptance_b"], 1), f"{fm.points(p['difference'])}{iv}",
                     f"{'rounds' if p['paired'] else 'prompts'}: {p['units']}", verdict])
        if p["differs"]:
            named.append(f"- **{fm.md(p['strategy'])} / {fm.md(p['task'])}**: {fm.pct(p['acceptance_a'], 1)} "
                         f"with {a}, {fm.pct(p['acceptance_b'], 1)} with {b}: the same model files, prompts and "
                         "sampling accept differently, beyond the run-to-run spread: a finding, not noise.")
    return "\n".join([view.table(rows, ["strategy", "task", "A", "B", "acceptance A", "acceptance B", "B - A (95%)",
                                    "paired by", "verdict"]), ""] + named)


PARITY_RULE = (
    "Accepted of drafted tokens, per measurement, for the same strategy (spec type and arguments) on the same "
    "model files (sha256), prompts, output length and sampling, in two settings (host, backend or llama.cpp "
    "build). Within one run each prompt is paired with itself in the same round; across runs each prompt's mean "
    "is held against its own run-to-run spread, and the prompts are averaged. At temperature 0 acceptance repeats "
    "run to run, so any difference beyond that spread is real. The comparisons of a report are one family (Holm, "
    "5%).")


# ---------------------------------------------------------------- the pieces together


def write_plots(summary: shapes.Summary, folder: Path, peers: Sequence[shapes.Summary]) -> dict[str, Path]:
    """The by-position and request-by-request plots of a summary into its run folder: key -> file."""
    out: dict[str, Path] = {}
    p = plot_positions(summary, folder / "positions.png")
    if p:
        out["positions"] = p
    p = plot_requests(summary, fresh_peer(summary, peers), folder / "requests.png")
    if p:
        out["requests"] = p
    return out


def image(plots: dict[str, Path], key: str, out_path: Path, alt: str) -> str:
    """A plot as Markdown, linked relative to the report ('' when there is none)."""
    if key not in plots:
        return ""
    rel = os.path.relpath(plots[key].resolve(), out_path.resolve().parent)
    return f"![{alt}]({Path(rel).as_posix()})"


def section(summary: shapes.Summary, out_path: Path, plots: dict[str, Path],
            peers: Sequence[shapes.Summary]) -> str:
    """The report's explanation sections for one run ('' for a run without speculative cells)."""
    parts: list[str] = []
    table = decomposition_table(summary)
    if table:
        parts += ["### Why: speedup = tokens per pass × pass rate (paired by round; 95% intervals)", "",
                  f"> {DECOMPOSITION_RULE}", "", table, ""]
    pos, fallback = positions_table(summary), positions_fallback(summary)
    if pos or fallback:
        parts += ["### Acceptance by draft position", "",
                  "The share of draft calls whose first k drafted tokens were all accepted (the server's own "
                  "measure: of every verification step).", ""]
        if pos:
            parts += [pos, "", image(plots, "positions", out_path, "acceptance by draft position per strategy"), ""]
        parts += fallback
    req, sentence = requests_table(summary, fresh_peer(summary, peers))
    if req:
        parts += ["### Request by request in one server (the cache trap)", "",
                  "Each reused server's requests in the order it served them, beside the same prompt measured in "
                  "fresh containers (median over runs).", "", sentence, "", req, "",
                  image(plots, "requests", out_path, "tok/s and drafted tokens by request index"), ""]
    return "\n".join(parts)


def parity_section(found: list[shapes.ParityJson]) -> str:
    """The report-wide parity section ('' when no strategy ran on the same files in two settings)."""
    text = parity_text(found)
    if not text:
        return ""
    return "\n".join(["## Acceptance parity: the same strategy and files in several settings", "",
                      f"> {PARITY_RULE}", "", text, ""])

