"""The break-even section of a run: each strategy's speedup against synthetic acceptance length, the length it
needs to pay on this machine, the length it achieves, and its ceiling at full acceptance
(harness/analysis/breakeven.py). Every figure here is labelled synthetic acceptance (benchmarking only)."""

from __future__ import annotations

from harness import formatter as fm
from harness.report import view
from harness.store import shapes


def _length(x: float | None, lo: float | None, hi: float | None) -> str:
    if x is None:
        return fm.DASH
    if lo is None and hi is None:
        return f"{fm.num(x)} [unbounded]"
    return f"{fm.num(x)} [{fm.num(lo) if lo is not None else '-∞'}, {fm.num(hi) if hi is not None else '∞'}]"


def sentence(c: shapes.BreakevenCurve, several_hosts: bool) -> str:
    """One sentence per strategy and task: what it needs to pay here, and what it achieves."""
    who = fm.md(f"{c['host']}: {c['strategy']}" if several_hosts else c["strategy"])
    a = c["achieved"]
    got = (f"; it achieves {_length(a['length'], a['lo'], a['hi'])} ({', '.join(a['sources'])})" if a else
           "; its achieved length is not recorded")
    top = c["ceiling"]
    ceiling = (f" At full acceptance (length {top['length']}) it gives at most {fm.ratio(top['speedup'])} here"
               f"{'' if top['measured'] else ' (the fitted line)'}." if top["speedup"] is not None else "")
    be = c["breakeven"]
    if c["verdict"] == "needs" and be is not None:
        need = _length(be["length"], be["lo"], be["hi"])
        return (f"{who} on {fm.md(c['task'])} needs a mean acceptance length ≥ {need} per step to pay on this "
                f"machine{got}.{ceiling}")
    if c["verdict"] == "pays":
        return f"{who} on {fm.md(c['task'])} pays at any acceptance length ≥ 1 on this machine{got}.{ceiling}"
    if c["verdict"] == "never":
        return (f"{who} on {fm.md(c['task'])} does not pay on this machine even at full acceptance{got}."
                f"{ceiling}")
    return (f"{who} on {fm.md(c['task'])}: fewer than two rounds measured every length undisturbed, paired with "
            f"the baseline: no break-even line{got}.{ceiling}")


def decides(c: shapes.BreakevenCurve) -> str:
    """What the break-even curve adds to the decomposition's "what decides": the length needed beside the one
    achieved."""
    be, a = c["breakeven"], c["achieved"]
    got = f", achieves {fm.num(a['length'])}" if a else ""
    if c["verdict"] == "needs" and be is not None:
        return f"; needs a mean acceptance length ≥ {fm.num(be['length'])} here{got} (synthetic acceptance)"
    if c["verdict"] == "never":
        return f"; does not pay here even at full acceptance{got} (synthetic acceptance)"
    if c["verdict"] == "pays":
        return f"; pays here at any acceptance length{got} (synthetic acceptance)"
    return ""


def section(summary: shapes.Summary) -> list[str]:
    """The run's break-even section; nothing for a run without synthetic strategies."""
    part = summary.get("breakeven")
    if not part or not part["curves"]:
        return []
    several = len(summary["hosts"]) > 1
    label = fm.md(part["label"])
    out = [f"### Break-even acceptance: {label}", "",
           "Each strategy measured again with llama-server's `--spec-synth-len` / `--spec-synth-rates`: the drafter "
           "runs and costs what it costs, acceptance follows the given length (mean tokens per verification step, "
           "the target's own included), the output is not valid, so these figures are in no other table. Speedup "
           "against the baseline of the same rounds (geometric mean, 95% interval); the break-even length is where "
           "the line fitted per round crosses 1 (Fieller's 95% interval over rounds); achieved: the real strategy's "
           "mean acceptance length per step (95% interval over rounds).", ""]
    lengths = sorted({p["length"] for c in part["curves"] for p in c["points"]})
    rows = []
    for c in part["curves"]:
        at = {p["length"]: p for p in c["points"]}
        be, a = c["breakeven"], c["achieved"]
        rows.append([fm.md(f"{c['host']}: {c['strategy']}" if several else c["strategy"]), fm.md(c["task"])]
                    + [f"{fm.ratio(at[x]['speedup'])} {fm.interval(at[x]['lo'], at[x]['hi'])}".strip()
                       if x in at and at[x]["speedup"] is not None else fm.DASH for x in lengths]
                    + [_length(be["length"], be["lo"], be["hi"]) if be else fm.DASH,
                       _length(a["length"], a["lo"], a["hi"]) if a else fm.DASH,
                       f"{fm.ratio(c['ceiling']['speedup'])} (L={c['ceiling']['length']})"])
    out += [view.table(rows, ["strategy", "task"] + [f"L={fm.plain(x)}" for x in lengths]
                       + ["break-even L", "achieved L", "ceiling"]), ""]
    out += [f"- {sentence(c, several)}" for c in part["curves"]] + [""]
    return out
