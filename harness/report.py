"""`invoke report`: RESULTS.md (tabulate), summary.json (schema-checked) and a speedup plot per run folder.

Output is a pure function of the run folders: regenerating gives the same bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness import KitError, schema
from harness.results import RunDir
from harness.summary import summarize

CAVEAT = ("Acceptance is not comparable across drafter architectures: a sequential drafter (draft-simple) and a "
          "block drafter (DFlash, DSpark) accept different amounts per pass. Compare wall-clock tok/s.")


def latest_run(results_dir: Path) -> Path:
    """The newest run folder under results_dir (by run.json's created_at)."""
    runs = []
    if results_dir.is_dir():
        for p in results_dir.iterdir():
            f = p / "run.json"
            if f.is_file():
                try:
                    runs.append((json.loads(f.read_text()).get("created_at", ""), p))
                except json.JSONDecodeError:
                    continue
    if not runs:
        raise KitError(f"no run folders under {results_dir}; run `invoke run` first or name one")
    return max(runs)[1]


def _fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _cell_label(summary: dict[str, Any], c: dict[str, Any]) -> str:
    return c["strategy"] if len(summary["hosts"]) == 1 else f"{c['host']}: {c['strategy']}"


def _flags(c: dict[str, Any]) -> list[str]:
    out = []
    con = c["checks"].get("contamination")
    if con and con["flagged"]:
        out.append({"naive": "⚠ naive", "drift": "⚠ drift"}.get(con["data"].get("kind"), "⚠ warm-cache"))
    phy = c["checks"].get("physics")
    if phy and phy["flagged"]:
        out.append("⚠ impossible")
    if c["runs_failed"]:
        out.append(f"✗ {c['runs_failed']} failed")
    return out


def _columns(summary: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h, s["id"]) for h in summary["hosts"] for s in summary["strategies"]]


def _grid(summary: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(c["host"], c["strategy"], c["task"]): c for c in summary["cells"]}


def _header(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    b = meta["build"]
    plan = b["plan"]
    src = plan["source"]
    source = (f"sdist {src.get('package')}=={src.get('version')} (sha256 {src.get('sha256', '')[:12]})"
              if src["kind"] == "sdist" else f"git {src.get('repo')} {src.get('commit', '')[:12]}"
              if src["kind"] == "git" else f"local {src.get('path')}")
    hw = summary["hardware"]
    envs = meta["environment"]
    proto = ("**naive: one server per strategy, caches carry over (reuse-server)**"
             if summary["protocol"] == "reuse-server" else "one fresh container per measurement")
    rows = [
        ("manifest", f"{summary['manifest']['name']} (sha256 {summary['manifest']['sha256'][:16]})"),
        ("run", f"{summary['run_id']} ({summary['status']}, {summary['measurements']['ok']} ok, "
                f"{summary['measurements']['failed']} failed of {summary['measurements']['planned']} planned)"),
        ("hardware", f"{hw['name']}, {hw['memory_bandwidth_gbs']:g} GB/s ({hw['bandwidth_source']})"),
        ("hosts", "; ".join(f"{h}: {e.get('cpu_model') or '?'}, {e.get('cpus')} CPUs"
                            + (f", {', '.join(g['name'] for g in e['gpus'])} (driver {e['gpus'][0]['driver']})"
                               if e.get("gpus") else "") + f", Docker {e.get('docker_version')}"
                            for h, e in envs.items())),
        ("image", f"{b['tag']} ({b['image_id'][:19]})"),
        ("llama.cpp", f"build {src.get('build_number')}, commit {src.get('commit')}, {source}"),
        ("backend", f"{plan['backend']}" + (f", CUDA arch {plan['build_args'].get('CUDA_ARCHITECTURES')}"
                                            if plan["backend"] == "cuda" else "")),
        ("cmake", " ".join(f"`{a}`" for a in plan["cmake_args"]
                           if not a.startswith(("-DLLAMA_BUILD_NUMBER", "-DLLAMA_BUILD_COMMIT")))),
        ("protocol", f"{proto}; {summary['runs']} runs per cell in rounds, shuffled "
                     f"(seed {meta['plan']['shuffle_seed']})"),
        ("sampling", "temperature 0, cache_prompt false, seed fixed; tok/s is client-side wall clock of the decode"),
    ]
    out = tabulate(rows, headers=["", ""], tablefmt="github")
    models = [(k, v["file"], f"{v['size_bytes'] / 1e6:,.1f} MB", v.get("quantization") or "-", f"`{v['sha256']}`")
              for k, v in meta["models"].items()]
    out += "\n\n" + tabulate(models, headers=["model", "file", "size", "quant", "sha256"], tablefmt="github")
    return out


def _throughput(summary: dict[str, Any]) -> tuple[str, list[str]]:
    grid = _grid(summary)
    cols = _columns(summary)
    headers = ["task"] + [s if len(summary["hosts"]) == 1 else f"{h}: {s}" for h, s in cols]
    rows, notes = [], []
    for t in summary["tasks"]:
        row = [t]
        for h, s in cols:
            c = grid.get((h, s, t))
            if c is None or c["decode_tok_s"]["median"] is None:
                row.append("✗ failed" if c and c["runs_failed"] else "missing")
                continue
            d = c["decode_tok_s"]
            txt = f"{d['median']:,.2f} ±{d['spread_pct']:.0f}%"
            if c["speedup"] is not None and s != summary["baseline"]:
                txt += f" ({c['speedup']:.2f}x)"
            flags = _flags(c)
            if flags:
                txt += " " + " ".join(flags)
                for key in ("contamination", "physics"):
                    v = c["checks"].get(key)
                    if v and v["flagged"]:
                        notes.append(f"- {_cell_label(summary, c)} / {t}: {v['sentence']}")
                for f in c["failures"]:
                    notes.append(f"- {_cell_label(summary, c)} / {t} run {f['run_index']} failed: {f['reason']}")
            row.append(txt)
        rows.append(row)
    # The geometric-mean speedup over tasks, as the study's bottom line.
    mean_row = ["**geomean speedup**"]
    for h, s in cols:
        sp = [grid[(h, s, t)]["speedup"] for t in summary["tasks"] if (h, s, t) in grid and grid[(h, s, t)]["speedup"]]
        if not sp or s == summary["baseline"]:
            mean_row.append("1.00x" if s == summary["baseline"] and sp else "-")
            continue
        g = 1.0
        for x in sp:
            g *= x
        mean_row.append(f"{g ** (1 / len(sp)):.2f}x")
    rows.append(mean_row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True), notes


def _acceptance(summary: dict[str, Any]) -> str:
    grid = _grid(summary)
    cols = [(h, s) for h, s in _columns(summary) if s != summary["baseline"]]
    if not cols:
        return "(no speculative strategy)"
    headers = ["task"] + [f"{s if len(summary['hosts']) == 1 else f'{h}: {s}'}" for h, s in cols]
    rows = []
    for t in summary["tasks"]:
        row = [t]
        for h, s in cols:
            c = grid.get((h, s, t))
            if c is None or not c["runs_ok"]:
                row.append("-")
            elif not c["draft_n"]:
                row.append("nothing drafted")
            else:
                tpp = _fmt(c["tokens_per_pass"]["median"])
                row.append(f"{c['acceptance']:.0%} of {c['draft_n']:,}, {tpp} tok/pass")
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _physics(summary: dict[str, Any]) -> str:
    rows = []
    for c in summary["cells"]:
        v = c["checks"].get("physics")
        if not v:
            continue
        if c["strategy"] != summary["baseline"] and not v["flagged"]:
            continue
        d = v["data"]
        rows.append([_cell_label(summary, c), c["task"], _fmt(d["tok_s"]), _fmt(d["tokens_per_pass"]),
                     _fmt(d["implied_passes_s"], 1), _fmt(d["ceiling_passes_s"], 1), f"{d['fraction']:.0%}",
                     "⚠ " + v["sentence"] if v["flagged"] else "ok"])
    return tabulate(rows, headers=["strategy", "task", "tok/s", "tok/pass", "passes/s", "ceiling", "of roofline",
                                   "verdict"], tablefmt="github", disable_numparse=True)


def _latency(summary: dict[str, Any]) -> str:
    rows = []
    for c in summary["cells"]:
        if not c["runs_ok"]:
            continue
        rows.append([_cell_label(summary, c), c["task"], _fmt(c["prefill_tok_s"]["median"], 1),
                     _fmt(c["ttft_s"]["median"] * 1000 if c["ttft_s"]["median"] is not None else None, 1),
                     _fmt(c["load_s"]["median"], 2), _fmt(c["memory_peak_mb"]["median"], 0),
                     _fmt(c["server_decode_tok_s"]["median"])])
    return tabulate(rows, headers=["strategy", "task", "prefill tok/s", "TTFT ms", "load s", "memory MB",
                                   "server tok/s"], tablefmt="github", disable_numparse=True)


def _concurrency(summary: dict[str, Any]) -> str:
    rows = [[_cell_label(summary, c), c["task"], c["streams"], _fmt(c["aggregate_tok_s"]["median"]),
             _fmt(c["per_stream_tok_s"]["median"]), _fmt(c["per_stream_tok_s"]["min"])]
            for c in summary["cells"] if c.get("streams", 1) > 1 and c["runs_ok"]]
    if not rows:
        return ""
    return tabulate(rows, headers=["strategy", "task", "streams", "aggregate tok/s", "per-stream tok/s",
                                   "slowest stream"], tablefmt="github", disable_numparse=True)


def _determinism(summary: dict[str, Any]) -> str:
    if summary["baseline"] is None:
        return "(no baseline strategy: nothing to compare against)"
    lines = []
    for d in summary["determinism"].values():
        who = d["strategy"] if len(summary["hosts"]) == 1 else f"{d['host']}: {d['strategy']}"
        lines.append(f"- **{who}**: {d['identical']}/{d['tasks']} tasks byte-identical to the baseline")
    rows = []
    for c in summary["cells"]:
        v = c["checks"].get("determinism")
        if v and v["flagged"]:
            rows.append([_cell_label(summary, c), c["task"], v["data"].get("first_divergent_token", "-"),
                         _fmt(v["data"].get("margin"), 3), v["data"].get("margin_rank", "-"), v["sentence"]])
    out = "\n".join(lines)
    if rows:
        out += "\n\n" + tabulate(rows, headers=["strategy", "task", "first divergent token", "baseline margin",
                                                "rank (1 = narrowest)", "verdict"], tablefmt="github",
                                 disable_numparse=True)
    return out


def render_run(rd: RunDir, summary: dict[str, Any], out_path: Path, plot: Path | None) -> str:
    meta = rd.read_meta()
    parts = [f"## Run {summary['run_id']}", "", _header(summary, meta), ""]
    if summary["protocol"] == "reuse-server":
        parts += ["> ⚠ **Naive protocol.** This run reused one server per strategy, so n-gram tables and caches "
                  "carried over from one request to the next. Its figures show the artefact the default "
                  "protocol protects against; do not quote them as speedups.", ""]
    table, notes = _throughput(summary)
    parts += ["### Decode throughput (tok/s, wall clock; median ±half-range over runs; speedup vs baseline)", "",
              table, ""]
    if notes:
        parts += ["Flags:", ""] + notes + [""]
    if plot is not None:
        rel = os.path.relpath(plot, out_path.parent)
        parts += [f"![speedup per task and strategy]({Path(rel).as_posix()})", ""]
    parts += ["### Acceptance and tokens per target pass", "", f"> {CAVEAT}", "", _acceptance(summary), ""]
    parts += ["### Physics: the memory-bandwidth roofline", "",
              "Ceiling = bandwidth / target weight bytes (target passes per second). Speculative cells are listed "
              "only when flagged.", "", _physics(summary), ""]
    parts += ["### Determinism at temperature 0 (lossless in distribution, not bit-exact)", "",
              _determinism(summary), ""]
    conc = _concurrency(summary)
    if conc:
        parts += ["### Concurrency (N clients at once; aggregate = all streams' tokens / wall time)", "", conc, ""]
    parts += ["### Prefill, time to first token, load, memory (medians)", "", _latency(summary), ""]
    if summary["missing"]:
        parts += ["### Missing cells", ""]
        for m in summary["missing"]:
            parts.append(f"- {m['host']} / {m['strategy']} / {m['task']}: {m['recorded']} of {m['expected']} runs "
                         "recorded")
        parts.append("")
    return "\n".join(parts)


def plot_speedups(summary: dict[str, Any], path: Path) -> Path | None:
    """A grouped bar chart of speedup per task per strategy (PNG), or None without a baseline."""
    if summary["baseline"] is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [(h, s) for h, s in _columns(summary) if s != summary["baseline"]]
    grid = _grid(summary)
    tasks = summary["tasks"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks) + 2), 3.6), dpi=100)
    width = 0.8 / max(1, len(cols))
    for i, (h, s) in enumerate(cols):
        ys = [(grid.get((h, s, t)) or {}).get("speedup") or 0.0 for t in tasks]
        xs = [j + (i - (len(cols) - 1) / 2) * width for j in range(len(tasks))]
        ax.bar(xs, ys, width, label=s if len(summary["hosts"]) == 1 else f"{h}: {s}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_ylabel(f"speedup vs {summary['baseline']}")
    ax.set_title(f"{summary['manifest']['name']}: decode tok/s relative to {summary['baseline']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
    return path


def write(run_dirs: list[Path], out_path: Path, plot: bool = True,
          comparison: dict[str, Any] | None = None) -> list[Path]:
    """Write summary.json (+ plot.png) in each run folder and one Markdown report for all of them."""
    written: list[Path] = []
    sections = []
    names = []
    for d in run_dirs:
        rd = RunDir.open(d)
        summary = summarize(rd)
        schema.check("summary", summary, f"{rd.path}/summary.json")
        sp = rd.path / "summary.json"
        sp.write_text(json.dumps(summary, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
        written.append(sp)
        png = plot_speedups(summary, rd.path / "plot.png") if plot else None
        if png:
            written.append(png)
        sections.append(render_run(rd, summary, out_path, png))
        names.append(summary["manifest"]["name"])
    if comparison is not None:
        from harness import compare as cmp

        sections.append("\n".join([f"## Comparison: {comparison['a']['run_id']} (A) vs {comparison['b']['run_id']} (B)",
                                   "", "```", cmp.text(comparison, "simple"), "```", ""]))
    title = f"# Results: {', '.join(dict.fromkeys(names))}"
    body = "\n".join([title, "", "<!-- Generated by `invoke report` from the run folders below; edits are lost. -->",
                      ""] + sections)
    out_path.write_text(body.rstrip() + "\n", encoding="utf-8")
    written.append(out_path)
    return written
