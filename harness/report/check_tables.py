"""The tables of what each check compared in a run: interference, acceptance, physics, devices, latency,
concurrency and determinism (RESULTS.md's sections after the speedups)."""

from __future__ import annotations

from harness import formatter as fm
from harness.report.view import View, table
from harness.store.runmeta import RunMeta


def interference(v: View) -> str:
    rows = []
    for h, x in (v.s.get("interference") or {}).items():
        rows.append([fm.md(h), x["measured"], x["disturbed"], fm.num(x["others_cores_median"]),
                     fm.num(x["others_cores_max"]),
                     "kept: most measurements were disturbed, the figures describe a busy machine" if x["kept"]
                     else ("left out of the figures" if x["disturbed"] else "-")])
    if not rows:
        return "(not measured in this run)"
    return table(rows, ["host", "measured", "disturbed", "others' cores (median)", "others' cores (max)",
                         "disturbed measurements"])


def acceptance(v: View) -> str:
    cols = v.columns(speculative_only=True)
    if not cols:
        return "(no speculative strategy)"
    rows = []
    for t in v.s["tasks"]:
        row = [fm.md(t)]
        for h, s in cols:
            c = v.cell(h, s, t)
            if c is None or not c["runs_ok"]:
                row.append("-")
            elif not c["draft_n"]:
                row.append("nothing drafted")
            else:
                mean_len = (c.get("server_mean_len") or {}).get("median")
                row.append(f"{fm.pct(c['acceptance'])} of {fm.count(c['draft_n'])}, "
                           f"{fm.num(c['tokens_per_pass']['median'])} tok/pass"
                           + (f", mean len {fm.num(mean_len)}" if mean_len is not None else ""))
        rows.append(row)
    return table(rows, ["task"] + [v.label(h, s) for h, s in cols])


def physics(v: View) -> str:
    rows = []
    for c in v.s["cells"]:
        x = c["checks"].get("physics")
        if not x or (v.kinds[c["strategy"]]["baseline"] is not None and not x["flagged"]):
            continue
        d = x["data"]
        pb = d.get("pass_bytes") or {}
        rows.append([v.label(c["host"], c["strategy"]), fm.md(c["task"]), fm.num(d["tok_s"]),
                     fm.num(d["tokens_per_pass"]), fm.size(pb.get("weights", d["weight_bytes"])), fm.size(pb.get("kv")),
                     fm.size(pb.get("draft")) if pb.get("draft") else "-", fm.size(d.get("bytes_per_pass")),
                     fm.num(d["implied_passes_s"], 1), fm.num(d["ceiling_passes_s"], 1), fm.pct(d["fraction"]),
                     "⚠ " + fm.md(x["sentence"]) if x["flagged"] else "ok"])
    return table(rows, ["strategy", "task", "tok/s", "tok/pass", "weights", "KV at depth", "draft", "per pass",
                         "passes/s", "ceiling", "of roofline", "verdict"])


def devices(v: View, meta: RunMeta) -> str:
    """GPU backends: which device ran each strategy's measurements, layers offloaded, device memory; and which
    bandwidth the physics check used."""
    rows, seen = [], set()
    for c in v.s["cells"]:
        d = c.get("device")
        key = (c["host"], c["strategy"])
        if d is None or key in seen:
            continue
        seen.add(key)
        cells = [x["device"] for x in v.s["cells"] if (x["host"], x["strategy"]) == key and x.get("device")]
        runs = sum(x["runs"] for x in cells)
        without = sum(x["runs_without_device"] for x in cells)
        mib = [x["device_mib"]["median"] for x in cells if x["device_mib"]["median"] is not None]
        rows.append([v.label(*key), fm.md(", ".join(d["devices"]) or "none: ran on the CPU"),
                     fm.md(d["target_layers"] or "-"), fm.md(d["draft_layers"] or "-"),
                     fm.num(sorted(mib)[len(mib) // 2] if mib else None, 1),
                     f"{runs - without}/{runs}"])
    if not rows:
        return ""
    hosts = v.s["hosts"]
    bw = meta.bandwidth
    lines = []
    for h in hosts:
        if bw and bw.on(h):
            on = f" on {fm.md(bw.device)}" if bw.device else ""
            lines.append(f"- physics on {fm.md(h)}: {fm.num(bw.gbs, 1)} GB/s measured by `invoke probe` "
                         f"({fm.md(bw.kind or '?')}{on})")
        else:
            hw = v.s["hardware"]
            lines.append(f"- physics on {fm.md(h)}: the manifest's {fm.plain(hw['memory_bandwidth_gbs'])} GB/s "
                         f"({fm.md(hw['bandwidth_source'])}); no `invoke probe` measurement of this host's device")
    return "\n".join([table(rows, ["strategy", "device (llama.cpp's name and description)", "target layers",
                                    "draft layers", "device MiB (median)", "runs on it"]), ""] + lines)


def latency(v: View) -> str:
    rows = []
    for c in v.s["cells"]:
        if not c["runs_ok"]:
            continue
        ttft = c["ttft_s"]["median"]
        rows.append([v.label(c["host"], c["strategy"]), fm.md(c["task"]), fm.num(c["prefill_tok_s"]["median"], 1),
                     fm.num(ttft * 1000 if ttft is not None else None, 1), fm.num(c["load_s"]["median"], 2),
                     fm.num(c["memory_peak_mb"]["median"], 0), fm.num(c["server_decode_tok_s"]["median"])])
    return table(rows, ["strategy", "task", "prefill tok/s", "TTFT ms", "load s", "memory MB", "server tok/s"])


def concurrency(v: View) -> str:
    rows = [[v.label(c["host"], c["strategy"]), fm.md(c["task"]), c["streams"], fm.num(c["aggregate_tok_s"]["median"]),
             fm.num(c["per_stream_tok_s"]["median"]), fm.num(c["per_stream_tok_s"]["min"])]
            for c in v.s["cells"] if c.get("streams", 1) > 1 and c["runs_ok"]]
    if not rows:
        return ""
    return table(rows, ["strategy", "task", "streams", "aggregate tok/s", "per-stream tok/s", "slowest stream"])


def determinism(v: View) -> str:
    if not v.s["determinism"] and v.s["baseline"] is None:
        return "(no baseline strategy: nothing to compare against)"
    lines = [f"- **{v.label(d['host'], d['strategy'])}**: {d['identical']}/{d['tasks']} tasks byte-identical to the "
             "baseline" for d in v.s["determinism"].values()]
    rows = []
    for c in v.s["cells"]:
        x = c["checks"].get("determinism")
        if x and x["flagged"]:
            rows.append([v.label(c["host"], c["strategy"]), fm.md(c["task"]),
                         x["data"].get("first_divergent_token", "-"), fm.num(x["data"].get("margin"), 3),
                         x["data"].get("margin_rank", "-"), fm.md(x["sentence"])])
    out = "\n".join(lines)
    if rows:
        out += "\n\n" + table(rows, ["strategy", "task", "first divergent token", "baseline margin",
                                      "rank (1 = narrowest)", "verdict"])
    return out
