"""A run's prompt suites in RESULTS.md: per category and strategy, the speedup for these prompts (the table's cell,
with its mark) beside the interval for prompts like these (harness/analysis/prompt_sample.py)."""

from __future__ import annotations

import re

from harness import formatter as fm
from harness.report import view
from harness.report.marks import TOO_FEW, mark
from harness.store import shapes

#: What bench/prompt_coverage.py measured of the interval for prompts like these (2,000 simulated categories per
#: setting: 2-10 prompts, 3 and 5 rounds, prompts' sd 0-0.2 and rounds' sd 0.1-0.3 in logs).
COVERAGE = ("bench/prompt_coverage.py: it covered 94-97% of simulated categories whose prompts differ normally or "
            "with heavy tails, 89-94% where a few prompts are far faster than the rest; read as if it were about "
            "prompts like these, the interval for these prompts covered as little as 41%")


#: A later turn's category (harness/intake/suites.py turn_task): `<category>.t<k>`.
_LATER_TURN = re.compile(r"\.t[2-9]$")

#: Beyond these a 1-df interval's ends say only "far": shown as such rather than as 12-digit ratios.
SHOWN_RANGE = (0.01, 100.0)


def _span(lo: float, hi: float) -> str:
    if SHOWN_RANGE[0] <= lo and hi <= SHOWN_RANGE[1]:
        return fm.interval(lo, hi)
    low = f"<{fm.num(SHOWN_RANGE[0])}" if lo < SHOWN_RANGE[0] else fm.num(lo)
    high = f">{fm.num(SHOWN_RANGE[1], 0)}" if hi > SHOWN_RANGE[1] else fm.num(hi)
    return f"[{low}, {high}]"


def like_rounds(c: shapes.CategoryJson) -> int:
    return (c["these_prompts"] or {}).get("n", 0)


def section(summary: shapes.Summary) -> list[str]:
    """The per-category table, or nothing for a run without prompt suites."""
    cats = summary.get("categories") or []
    if not cats:
        return []
    several = len(summary["hosts"]) > 1
    rows = []
    for c in cats:
        who = f"{c['host']}/{c['strategy']}" if several else c["strategy"]
        these = c["these_prompts"] or {}
        span = f" {fm.interval(these['low'], these['high'])}" if these.get("low") is not None else ""
        sign = mark(c["verdict"])
        like = c["like_these"] or {}
        if like.get("low") is not None:
            like_text = f"{fm.ratio(c['like_these_speedup'])} {_span(like['low'], like['high'])}"
        elif c["prompts"] < 2:
            like_text = "one prompt: generalises to no other prompt"
        else:
            like_text = f"? {TOO_FEW} ({like_rounds(c)})"
        rows.append([fm.md(who), fm.md(f"{c['suite']}/{c['category']}"), str(c["prompts"]),
                     f"{fm.ratio(c['speedup'])}{span} {sign}".rstrip() if c["speedup"] is not None else "-",
                     like_text])
    table = view.table(rows, ["strategy", "category", "prompts", "for these prompts", "for prompts like these"])
    rule = ("> For these prompts: the speedup table's cell, rounds random and its prompts fixed, marked by that "
            "table's Holm family. For prompts like these: the category's prompts random and each prompt's rounds "
            "nested within it, a t-interval of the mean of the prompts' mean log speedups from their spread (k - 1 "
            "df for k prompts); it is not marked (no test is made of it, so the table's family is unchanged), and "
            f"with 2 prompts its t is 12.7. Coverage checked by {COVERAGE}.")
    out = ["### Per category of the prompt suites (speedup; 95% intervals)", "", table, "", rule, ""]
    if any(_LATER_TURN.search(c["category"]) for c in cats):
        out += ["> `<category>.t<k>`: turn k of the category's questions (`turns: all`), sent after the earlier turns "
                "and the target's own answers to them (made once before the timed rounds at temperature 0 without "
                "speculation, the same for every strategy; the run's answers.json). Turn k is its own row, never "
                "pooled with turn 1: a turn that reads an earlier answer is another workload.", ""]
    pw = summary.get("categories_power")
    if pw and pw["spread"] is not None:
        need = (f"about {pw['prompts_needed']} prompts per category" if pw["prompts_needed"] is not None
                else "more prompts per category than a suite holds")
        out += [f"Power: within a category the prompts' mean log speedups spread by a median sd of "
                f"{fm.fixed(pw['spread'], 3)} in this run (from {pw['prompts']} prompts per category, itself a rough "
                f"figure); at that spread an interval for prompts like these of ±{fm.pct(pw['target'])} needs {need} "
                "(t(k - 1) x sd / sqrt(k) at most; bench/prompt_coverage.py --power: at that count over half of "
                "the simulated categories' intervals were within it).", ""]
    return out
