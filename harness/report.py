"""`invoke report`: RESULTS.md (tabulate), summary.json (schema-checked) and a speedup plot per run folder.

Output is a pure function of the run folders: regenerating gives the same bytes. Every text that comes from a
run folder (names, reasons, host facts) is escaped before it goes into Markdown."""

from __future__ import annotations

import io
import json
import os
import statistics
from pathlib import Path
from typing import Any

from tabulate import tabulate

from harness import KitError, schema
from harness import formatter as fm
from harness.files import atomic_write_bytes, atomic_write_text
from harness.results import RunDir
from harness.runmeta import RunMeta
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
                    runs.append((str(json.loads(f.read_text()).get("created_at", "")), p.name, p))
                except (json.JSONDecodeError, UnicodeDecodeError, OSError, AttributeError):
                    continue
    if not runs:
        raise KitError(f"no run folders under {results_dir}; run `invoke run` first or name one")
    return max(runs)[2]


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


class View:
    """One run's summary as the report reads it: labels, columns and cells by key."""

    def __init__(self, summary: dict[str, Any]):
        self.s = summary
        self.several_hosts = len(summary["hosts"]) > 1
        self.grid = {(c["host"], c["strategy"], c["task"]): c for c in summary["cells"]}
        self.kinds = {s["id"]: s for s in summary["strategies"]}

    def label(self, host: str, strategy: str) -> str:
        return fm.md(f"{host}: {strategy}" if self.several_hosts else strategy)

    def columns(self, speculative_only: bool = False) -> list[tuple[str, str]]:
        cols = [(h, s["id"]) for h in self.s["hosts"] for s in self.s["strategies"]]
        return [(h, s) for h, s in cols if not speculative_only or self.kinds[s]["baseline"] is not None]

    def cell(self, host: str, strategy: str, task: str) -> dict[str, Any] | None:
        return self.grid.get((host, strategy, task))


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


def _header(summary: dict[str, Any], meta: RunMeta) -> str:
    b = meta.build
    plan = b["plan"]
    src = plan["source"]
    source = (f"sdist {src.get('package')}=={src.get('version')} (sha256 {str(src.get('sha256', ''))[:12]})"
              if src["kind"] == "sdist" else f"git {src.get('repo')} {str(src.get('commit', ''))[:12]}"
              if src["kind"] == "git" else "local folder")
    hw = summary["hardware"]
    proto = ("**naive: one server per strategy, caches carry over (reuse-server)**"
             if summary["protocol"] == "reuse-server" else "one fresh container per measurement")
    m = summary["measurements"]
    hosts = []
    for h, e in meta.environment.items():
        gpus = e.get("gpus") or []
        gpu = f", {', '.join(g['name'] for g in gpus)} (driver {gpus[0]['driver']})" if gpus else ""
        hosts.append(f"{h}: {e.get('cpu_model') or '?'}, {e.get('cpus')} CPUs{gpu}, Docker {e.get('docker_version')}")
    rows = [
        ("manifest", f"{fm.md(summary['manifest']['name'])} (sha256 {summary['manifest']['sha256'][:16]})"),
        ("run", f"{summary['run_id']} ({summary['status']}, {m['ok']} ok, {m['failed']} failed of {m['planned']} "
                "planned)"),
        ("hardware", f"{fm.md(hw['name'])}, {hw['memory_bandwidth_gbs']:g} GB/s ({fm.md(hw['bandwidth_source'])})"),
        ("hosts", fm.md("; ".join(hosts), 1000)),
        ("image", f"{fm.md(b['tag'])} ({fm.md(b['image_id'][:19])})"),
        ("llama.cpp", fm.md(f"build {src.get('build_number')}, commit {src.get('commit')}, {source}")),
        ("backend", fm.md(f"{plan['backend']}" + (f", CUDA arch {plan['build_args'].get('CUDA_ARCHITECTURES')}"
                                                  if plan["backend"] == "cuda" else ""))),
        ("cmake", " ".join(fm.code(a) for a in plan["cmake_args"]
                           if not a.startswith(("-DLLAMA_BUILD_NUMBER", "-DLLAMA_BUILD_COMMIT")))),
        ("protocol", f"{proto}; {summary['runs']} runs per cell in rounds, shuffled (seed {meta.plan.shuffle_seed})"),
        ("sampling", "temperature 0, cache_prompt false, seed fixed; tok/s is client-side wall clock of the decode"),
    ]
    out = _table([list(r) for r in rows], ["", ""])
    models = [[fm.md(k), fm.md(v["file"]), fm.size(v["size_bytes"]), fm.md(v.get("quantization") or "-"),
               fm.code(v["sha256"])] for k, v in meta.models.items()]
    return out + "\n\n" + _table(models, ["model", "file", "size", "quant", "sha256"])


def _throughput(v: View) -> tuple[str, list[str]]:
    cols = v.columns()
    rows, notes = [], []
    for t in v.s["tasks"]:
        row = [fm.md(t)]
        for h, s in cols:
            c = v.cell(h, s, t)
            if c is None or c["decode_tok_s"]["median"] is None:
                row.append("✗ failed" if c and c["runs_failed"] else "missing")
                continue
            d = c["decode_tok_s"]
            txt = f"{d['median']:,.2f} ±{d['spread_pct']:.0f}%"
            if c["speedup"] is not None:
                txt += f" ({c['speedup']:.2f}x)"
            flags = _flags(c)
            if flags:
                txt += " " + " ".join(flags)
                notes += _notes(v, c)
            row.append(txt)
        rows.append(row)
    mean_row = ["**geomean speedup**"]
    for h, s in cols:
        sp = [c["speedup"] for t in v.s["tasks"] if (c := v.cell(h, s, t)) and c["speedup"]]
        base = v.kinds[s]["baseline"] is None
        mean_row.append("baseline" if base else fm.ratio(statistics.geometric_mean(sp)) if sp else "-")
    rows.append(mean_row)
    return _table(rows, ["task"] + [v.label(h, s) for h, s in cols]), notes


def _notes(v: View, c: dict[str, Any]) -> list[str]:
    who = f"{v.label(c['host'], c['strategy'])} / {fm.md(c['task'])}"
    out = [f"- {who}: {fm.md(x['sentence'])}" for k in ("contamination", "physics")
           if (x := c["checks"].get(k)) and x["flagged"]]
    out += [f"- {who} run {f['run_index']} failed: {fm.md(f['reason'])}" for f in c["failures"]]
    return out


def _acceptance(v: View) -> str:
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
                row.append(f"{fm.pct(c['acceptance'])} of {c['draft_n']:,}, "
                           f"{fm.num(c['tokens_per_pass']['median'])} tok/pass")
        rows.append(row)
    return _table(rows, ["task"] + [v.label(h, s) for h, s in cols])


def _physics(v: View) -> str:
    rows = []
    for c in v.s["cells"]:
        x = c["checks"].get("physics")
        if not x or (v.kinds[c["strategy"]]["baseline"] is not None and not x["flagged"]):
            continue
        d = x["data"]
        rows.append([v.label(c["host"], c["strategy"]), fm.md(c["task"]), fm.num(d["tok_s"]),
                     fm.num(d["tokens_per_pass"]), fm.num(d["implied_passes_s"], 1), fm.num(d["ceiling_passes_s"], 1),
                     fm.pct(d["fraction"]), "⚠ " + fm.md(x["sentence"]) if x["flagged"] else "ok"])
    return _table(rows, ["strategy", "task", "tok/s", "tok/pass", "passes/s", "ceiling", "of roofline", "verdict"])


def _latency(v: View) -> str:
    rows = []
    for c in v.s["cells"]:
        if not c["runs_ok"]:
            continue
        ttft = c["ttft_s"]["median"]
        rows.append([v.label(c["host"], c["strategy"]), fm.md(c["task"]), fm.num(c["prefill_tok_s"]["median"], 1),
                     fm.num(ttft * 1000 if ttft is not None else None, 1), fm.num(c["load_s"]["median"], 2),
                     fm.num(c["memory_peak_mb"]["median"], 0), fm.num(c["server_decode_tok_s"]["median"])])
    return _table(rows, ["strategy", "task", "prefill tok/s", "TTFT ms", "load s", "memory MB", "server tok/s"])


def _concurrency(v: View) -> str:
    rows = [[v.label(c["host"], c["strategy"]), fm.md(c["task"]), c["streams"], fm.num(c["aggregate_tok_s"]["median"]),
             fm.num(c["per_stream_tok_s"]["median"]), fm.num(c["per_stream_tok_s"]["min"])]
            for c in v.s["cells"] if c.get("streams", 1) > 1 and c["runs_ok"]]
    if not rows:
        return ""
    return _table(rows, ["strategy", "task", "streams", "aggregate tok/s", "per-stream tok/s", "slowest stream"])


def _determinism(v: View) -> str:
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
        out += "\n\n" + _table(rows, ["strategy", "task", "first divergent token", "baseline margin",
                                      "rank (1 = narrowest)", "verdict"])
    return out


def render_run(rd: RunDir, summary: dict[str, Any], out_path: Path, plot: Path | None) -> str:
    meta = rd.read_meta()
    v = View(summary)
    parts = [f"## Run {fm.md(summary['run_id'])}", "", _header(summary, meta), ""]
    if summary["protocol"] == "reuse-server":
        parts += ["> ⚠ **Naive protocol.** This run reused one server per strategy, so n-gram tables and caches "
                  "carried over from one request to the next. Its figures show the artefact the default "
                  "protocol protects against; do not quote them as speedups.", ""]
    table, notes = _throughput(v)
    parts += ["### Decode throughput (tok/s, wall clock; median ±half-range over runs; speedup vs baseline)", "",
              table, ""]
    if notes:
        parts += ["Flags:", ""] + notes + [""]
    if plot is not None:
        rel = os.path.relpath(plot.resolve(), out_path.resolve().parent)
        parts += [f"![speedup per task and strategy]({Path(rel).as_posix()})", ""]
    parts += ["### Acceptance and tokens per target pass", "", f"> {CAVEAT}", "", _acceptance(v), ""]
    parts += ["### Physics: the memory-bandwidth roofline", "",
              "Ceiling = bandwidth / target weight bytes (target passes per second). Speculative cells are listed "
              "only when flagged.", "", _physics(v), ""]
    parts += ["### Determinism at temperature 0 (lossless in distribution, not bit-exact)", "", _determinism(v), ""]
    conc = _concurrency(v)
    if conc:
        parts += ["### Concurrency (N clients at once; aggregate = all streams' tokens / wall time)", "", conc, ""]
    parts += ["### Prefill, time to first token, load, memory (medians)", "", _latency(v), ""]
    if summary["missing"] or summary["measurements"].get("torn_last_line"):
        parts += ["### Missing cells", ""]
        parts += [f"- {v.label(m['host'], m['strategy'])} / {fm.md(m['task'])}: {m['recorded']} of {m['expected']} "
                  "runs recorded" for m in summary["missing"]]
        if summary["measurements"].get("torn_last_line"):
            parts.append("- the last line of measurements.jsonl was cut short (a crash mid-write): that measurement "
                         "is not counted")
        parts.append("")
    return "\n".join(parts)


def plot_speedups(summary: dict[str, Any], path: Path) -> Path | None:
    """A grouped bar chart of speedup per task per strategy (PNG), or None without a speculative strategy."""
    v = View(summary)
    cols = v.columns(speculative_only=True)
    if not cols:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Names come from the run folder: shown as plain text, never as mathtext ($...$) or LaTeX.
    with plt.rc_context({"text.usetex": False}):
        return _draw(plt, v, cols, summary, path)


def _draw(plt: Any, v: View, cols: list[tuple[str, str]], summary: dict[str, Any], path: Path) -> Path:
    """The bars, labels and legend of plot_speedups, every text without math parsing."""
    tasks = summary["tasks"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks) + 2), 3.6), dpi=100)
    width = 0.8 / max(1, len(cols))
    for i, (h, s) in enumerate(cols):
        ys = [(v.cell(h, s, t) or {}).get("speedup") or 0.0 for t in tasks]
        xs = [j + (i - (len(cols) - 1) / 2) * width for j in range(len(tasks))]
        ax.bar(xs, ys, width, label=f"{h}: {s}" if v.several_hosts else s)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right", parse_math=False)
    ax.set_ylabel("speedup vs baseline")
    ax.set_title(f"{summary['manifest']['name']}: decode tok/s relative to the baseline", parse_math=False)
    for text in ax.legend(fontsize=8).get_texts():
        text.set_parse_math(False)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(path, png.getvalue())
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
        atomic_write_text(sp, json.dumps(summary, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
        written.append(sp)
        png = plot_speedups(summary, rd.path / "plot.png") if plot else None
        if png:
            written.append(png)
        sections.append(render_run(rd, summary, out_path, png))
        names.append(summary["manifest"]["name"])
    if comparison is not None:
        from harness import compare as cmp

        sections.append("\n".join([f"## Comparison: {fm.md(comparison['a']['run_id'])} (A) vs "
                                   f"{fm.md(comparison['b']['run_id'])} (B)", "", "```",
                                   cmp.text(comparison, "simple").replace("```", "'''"), "```", ""]))
    title = f"# Results: {fm.md(', '.join(dict.fromkeys(names)))}"
    body = "\n".join([title, "", "<!-- Generated by `invoke report` from the run folders below; edits are lost. -->",
                      ""] + sections)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(body.rstrip() + "\n", encoding="utf-8")
    written.append(out_path)
    return written
