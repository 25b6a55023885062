"""The load study in RESULTS.md: the goodput and latency table per level with intervals, the crossover sentences
(only what the marks show), the levels that could not be offered or failed, and the plot of goodput and p99 TPOT
against the offered rate per strategy, intervals drawn. Reads the run folder's load.jsonl (harness/store/load.py);
the figures come from harness/analysis/load.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import formatter as fm
from harness.analysis import load as judged
from harness.intake.load import Slo
from harness.report import plotting
from harness.store import load as store

MARKS = {1: "▲", -1: "▼", 0: ""}
FIGURE_NAMES = {"goodput": "goodput", "output_tok_s": "output tok/s", "p99_tpot": "p99 TPOT"}


def crossover_words(x: judged.Crossover, escape: Callable[[object], str] = fm.md, strong: str = "**") -> str:
    """One arm's crossover for one figure, saying only what the marks show (names through `escape`, the crossover
    itself between `strong`)."""
    name, arm = FIGURE_NAMES[x.figure], escape(x.arm)
    if x.worse_from is None:
        return (f"{arm}, {name}: the crossover is not within the rates measured"
                + (f" (speculation better up to {fm.plain(x.pays_up_to)} req/s)" if x.pays_up_to else
                   " (no level marked either way)"))
    if x.pays_up_to is None:
        return f"{arm}, {name}: speculation worse from {fm.plain(x.worse_from)} req/s, better at no rate measured"
    return (f"{strong}{arm}, {name}: speculation stops paying between {fm.plain(x.pays_up_to)} and "
            f"{fm.plain(x.worse_from)} req/s{strong} (the estimate crosses 1 near {fm.sig(x.estimate)} req/s)")


def _slo(levels: Sequence[store.Level]) -> Slo:
    return Slo(**levels[0]["slo"]) if levels else Slo()


def _cell(c: judged.Cell | None) -> str:
    if c is None or c.estimate is None:
        return fm.DASH
    return f"{fm.ratio(c.estimate)} {fm.interval(c.low, c.high)} {MARKS[c.mark]}".strip()


def _band(values: Sequence[float | None], nd: int = 2) -> str:
    m, lo, hi = judged.band(values)
    return fm.DASH if m is None else f"{fm.num(m, nd)} {fm.interval(lo, hi, nd)}" if lo is not None else fm.num(m, nd)


def table(levels: Sequence[store.Level]) -> tuple[list[str], judged.Judgement]:
    """The table's lines (one row per arm and level, the baseline's first) and the judgement it prints."""
    slo = _slo(levels)
    j = judged.judge(levels, levels[0]["baseline"], slo)
    cells = {(r.arm, r.level): r for r in j.rows}
    head = ("| slots | level (req/s) | strategy | sent (req/s) | answered | goodput (req/s) | output tok/s "
            "| p50 / p99 TTFT (ms) | p50 / p99 TPOT (ms) | p99 ITL (ms) | accepted / draft | goodput × | tok/s × "
            "| p99 TPOT × |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    arms = judged.by_arm(levels, slo)
    order = sorted(arms, key=lambda a: (_slots(levels, a), _entry(levels, a) != levels[0]["baseline"], a))
    for arm in order:
        for lv, _, rounds in arms[arm]:
            ms = [x["metrics"] for x in rounds]
            ac = [x["achieved"] for x in rounds]
            acc = [x["acceptance"]["mean_length"] for x in rounds]
            row = cells.get((arm, lv))
            out.append("| " + " | ".join([
                str(_slots(levels, arm)), fm.md(lv), fm.md(arm), _band([a.send_rate for a in ac]),
                f"{sum(m.completed for m in ms)}/{sum(m.sent for m in ms)}", _band([m.goodput for m in ms]),
                _band([m.output_tok_s for m in ms], 1),
                _pair(ms, "ttft_ms", 0), _pair(ms, "tpot_ms", 1),
                fm.num(_mean([m.itl_ms["p99"] for m in ms]), 1), fm.num(_mean(acc), 2),
                *(_cell(row.cells[f]) if row else "" for f in judged.FIGURES)]) + " |")
    return out, j


def _pair(ms: Sequence[judged.LevelMetrics], figure: str, nd: int) -> str:
    """The rounds' mean p50 and p99 of a latency."""
    return " / ".join(fm.num(_mean([getattr(m, figure)[p] for m in ms]), nd) for p in ("p50", "p99"))


def _mean(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return sum(v) / len(v) if v else None


def _slots(levels: Sequence[store.Level], arm: str) -> int:
    return next(x["slots"] for x in levels if x["strategy"] == arm)


def _entry(levels: Sequence[store.Level], arm: str) -> str:
    return next(x["entry"] for x in levels if x["strategy"] == arm)


def plot(levels: Sequence[store.Level], path: Path) -> Path | None:
    """Goodput and p99 TPOT against the offered rate, one line per strategy and slot count, each point the
    rounds' mean with its 95% interval; None where no level has an offered rate (a sweep's two probes alone)."""
    arms = judged.by_arm(levels, _slo(levels))
    if not any(r is not None for a in arms.values() for _, r, _ in a):
        return None
    with plotting.pyplot() as plt:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
        for arm, lvs in sorted(arms.items()):
            pts = [(r, rounds) for _, r, rounds in lvs if r is not None]
            for ax, get in ((axes[0], lambda m: m.goodput), (axes[1], lambda m: m.tpot_ms.get("p99"))):
                xs, ys, lo, hi = [], [], [], []
                for r, rounds in pts:
                    m, a, b = judged.band([get(x["metrics"]) for x in rounds])
                    if m is None:
                        continue
                    xs.append(r)
                    ys.append(m)
                    lo.append(m - (a if a is not None else m))
                    hi.append((b if b is not None else m) - m)
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=plotting.label(arm, 40))
        rates = sorted({r for a in arms.values() for _, r, _ in a if r is not None})
        for ax, title in ((axes[0], "goodput (req/s meeting every SLO)"), (axes[1], "p99 TPOT (ms)")):
            ax.set_xscale("log")
            ax.minorticks_off()  # the offered rates are the ticks, written as plain numbers (no mathtext)
            ax.set_xticks(rates, [fm.plain(r) for r in rates])
            ax.set_xlabel("offered rate (req/s)")
            ax.set_title(title, parse_math=False)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        return plotting.save(plt, fig, path)


def terminal(run_dir: Path, run_id: str) -> str:
    """A load study's headline for a terminal: what was measured and each arm's crossover ('' without a study)."""
    levels = store.read(run_dir)
    if not levels:
        return ""
    j = judged.judge(levels, levels[0]["baseline"], _slo(levels))
    arms = {x["strategy"] for x in levels}
    head = (f"{fm.console(run_id)}: load study, {len(arms)} arms, {fm.count(len(levels))} levels on fresh servers; "
            f"speculation over {fm.console(levels[0]['baseline'])} per level (Holm over {j.family} cells):")
    tail = [f"  {fm.count(len(j.not_offered))} levels could not be offered"] if j.not_offered else []
    tail += [f"  {fm.count(len(j.failed))} levels failed"] if j.failed else []
    return "\n".join([head, *(f"  {crossover_words(x, fm.console, '')}" for x in j.crossovers), *tail])


def section(run_dir: Path, out_path: Path, draw: bool = True) -> str:
    """The load study's part of a run's section ('' where the run folder has none)."""
    levels = store.read(run_dir)
    if not levels:
        return ""
    lines, j = table(levels)
    ok = [x for x in levels if x["status"] == "ok"]
    first = ok[0] if ok else levels[0]
    reqs = {len(x["requests"]) for x in ok}
    arrivals = "Poisson" if first["arrivals"] == "poisson" else f"gamma (burstiness {fm.plain(first['burstiness'])})"
    slo = _slo(levels)
    parts = [f"### Serving under load (open-loop arrivals; speculation over {fm.md(first['baseline'])} paired by "
             f"round; 95% intervals; ▲ better ▼ worse, Holm over the {j.family} cells of this table)", "",
             f"{arrivals} arrivals on a seeded schedule, the same requests at the same times for every strategy at a "
             f"level and round; {'/'.join(str(n) for n in sorted(reqs))} timed requests per level, each level on a "
             f"fresh server, its {first['warmup']} warm-up request(s) sent before it and not counted. SLOs: "
             f"{slo.words()}. Metrics as vLLM's `bench serve` defines them: TPOT = (E2EL − TTFT)/(output tokens − 1), "
             "ITL every inter-token gap pooled; GuideLLM's \"time per output token\" counts the first token and its "
             "\"inter-token latency\" is this TPOT. Goodput: requests meeting every SLO per second of the level "
             "(first send to last answer). Ratios are oriented so that above 1 speculation serves better (p99 "
             "TPOT: baseline over speculation); goodput counts + 0.5 each. Sent: the rate the sends achieved; "
             "accepted / draft: mean acceptance length from the server's counters (GET /metrics) over the level, "
             "the warm-up's left out. Within a level the requests share its server, as a served model's users do: "
             "an n-gram table or a drafter's cache carries over from one request to the next.",
             "", *lines, ""]
    if draw:
        png = plot(levels, Path(run_dir) / "load.png")
        if png is not None:
            rel = os.path.relpath(png.resolve(), out_path.resolve().parent)
            parts += [f"![goodput and p99 TPOT against the offered rate, 95% intervals]({Path(rel).as_posix()})", ""]
    parts += ["Where speculation stops paying:", ""] + [f"- {crossover_words(x)}" for x in j.crossovers] + [""]
    if j.not_offered:
        parts += ["Could not be offered (sends fell behind the schedule: the concurrency cap or the client), left out "
                  "of the ratios: " + ", ".join(f"{fm.md(a)} at {fm.md(lv)} round {r}" for a, lv, r in j.not_offered)
                  + ".", ""]
    if j.failed:
        parts += ["Failed levels (the server did not start or answered nothing): "
                  + ", ".join(f"{fm.md(a)} at {fm.md(lv)} round {r}" for a, lv, r in j.failed) + ".", ""]
    return "\n".join(parts)
