#!/usr/bin/env python3
"""Fidelity of the kit's throughput figures on the demo's CPU image and tiny target. Prints figures.

In one run: the kit's baseline decode tok/s (client-side, from the stream) and the server's own
predicted_per_second, against `llama-bench -p 0 -n N -d D` (D = the prompt's token count, so the decode starts
at the same context depth) with the same threads, in the same image, on the same model.

    python3 bench/fidelity.py [--task en-prose] [--n-predict 256] [--runs 5] [--threads 2]
                              [--embed 1024 --ff 2816 --layers 8]

The shape flags generate a heavier target (slower per token, closer to a real model's regime) instead of the
demo's 11 MB one: a cost that is fixed per streamed token shows as a large share of a 1 ms token and a small
share of a 40 ms one, and the bench prints that cost in milliseconds per token.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import DEFAULT_MANIFEST  # noqa: E402
from harness.hosts.engine import LocalEngine, Mount  # noqa: E402
from harness.image import images  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.intake import trust  # noqa: E402
from harness.models import ensure as md  # noqa: E402
from harness.run import runner  # noqa: E402
from harness.store.rundir import RunDir  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="en-prose")
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models-dir", type=Path, default=Path("models"))
    ap.add_argument("--embed", type=int, help="generate a target this wide instead of the demo's (256)")
    ap.add_argument("--ff", type=int, help="its feed-forward width (default 512)")
    ap.add_argument("--layers", type=int, help="its blocks (default 4)")
    args = ap.parse_args()

    demo = mf.load(DEFAULT_MANIFEST)
    eng = LocalEngine()
    rec = images.record(eng, demo, host="local")
    if rec is None:
        sys.exit("no demo image: run `invoke build` first")
    raw = yaml.safe_load(DEFAULT_MANIFEST.read_text())
    raw["strategies"] = [s for s in raw["strategies"] if s["spec_type"] == "none"]
    raw["tasks"] = [dict(t, n_predict=args.n_predict) for t in raw["tasks"] if t["id"] == args.task]
    raw["runs"] = args.runs
    shape = {k: getattr(args, k) for k in mf.SHAPE_KEYS if getattr(args, k)}
    if shape:
        name = "tiny-target-" + "-".join(f"{k}{v}" for k, v in shape.items()) + ".gguf"
        raw["models"] = {"target": {"file": name, "generate": {"kind": "tiny-target", "seed": 7, **shape}}}
    t = str(args.threads)
    raw["server_args"] = ["-c", "12288", "--parallel", "1", "-t", t, "-tb", t]
    with tempfile.TemporaryDirectory(prefix="specbench-fidelity-") as tmp:
        man = Path(tmp) / "fidelity.yaml"
        shutil.copytree(DEFAULT_MANIFEST.parent / "tasks", Path(tmp) / "tasks")
        man.write_text(yaml.safe_dump(raw, allow_unicode=True))
        bench_man = mf.load(man)
        paths = md.ensure(bench_man, args.models_dir, download=False, log=print)
        runner.run(trust.decide(bench_man, False), results_dir=Path(tmp) / "r", models_dir=args.models_dir,
                   run_id="fidelity", progress=False, log=lambda s: None)
        recs = [r for r in RunDir.open(Path(tmp) / "r" / "fidelity").measurements() if r["status"] == "ok"]
    client = [r["client"]["decode_tok_s"] for r in recs]
    server = [r["server"]["predicted_per_second"] for r in recs]
    depth = recs[0]["server"]["prompt_n"]
    target = paths["target"]

    def llama_bench() -> float:
        """One llama-bench repetition's decode tok/s."""
        out = eng.run_container(
            rec.tag, ["llama-bench", "-m", f"/models/{target.name}", "-p", "0", "-n", str(args.n_predict),
                         "-d", str(depth), "-t", t, "-r", "1", "-o", "json"], {"specbench.role": "fidelity"},
            mounts=(Mount(target, f"/models/{target.name}"),))
        return float(json.loads(out.stdout)[0]["avg_ts"])

    fresh, bench, streamed, plain = interleaved(eng, rec.tag, demo, paths, args, raw["server_args"],
                                                llama_bench)
    med = statistics.median
    tg = med(bench)
    print(f"task {args.task}: decode of {args.n_predict} tokens after {depth} prompt tokens, {t} threads, "
          f"{len(recs)} runs")
    print(f"llama-bench tg{args.n_predict} @ d{depth}: median {tg:,.1f} tok/s over {len(bench)} rounds")
    print(f"kit run, server predicted_per_second: median {med(server):,.1f} tok/s  ({med(server) / tg:.3f} of "
          "llama-bench, not interleaved)")
    print(f"kit run, client-side (stream):        median {med(client):,.1f} tok/s  ({med(client) / tg:.3f} of "
          "llama-bench, not interleaved)")
    ratios = [c / s for c, s in zip(client, server, strict=True)]
    print(f"client / server per run: median {med(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f})")
    per_token_ms = 1000 / med(streamed) - 1000 / med(plain)
    print("kit per run (fresh containers): " + ", ".join(f"{x:,.1f}" for x in client))
    print("interleaved, in order: fresh container " + ", ".join(f"{x:,.1f}" for x in fresh)
          + "; llama-bench " + ", ".join(f"{x:,.1f}" for x in bench)
          + "; long-lived streamed " + ", ".join(f"{x:,.1f}" for x in streamed)
          + "; long-lived non-streamed " + ", ".join(f"{x:,.1f}" for x in plain))
    ratios = [f / b for f, b in zip(fresh, bench, strict=True)]
    print(f"fresh container (server-side rate of its first request) / llama-bench, per round: median {med(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    ratios = [f / w for f, w in zip(fresh, streamed, strict=True)]
    print(f"a cold container's first request vs a long-lived server's: median {med(fresh):,.1f} vs "
          f"{med(streamed):,.1f} tok/s, per-round ratio median {med(ratios):.3f} (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f})")
    print(f"one server, {args.runs} requests each, interleaved: streamed {med(streamed):,.1f} tok/s, "
          f"non-streamed {med(plain):,.1f} tok/s (streaming costs {1 - med(streamed) / med(plain):.1%}, "
          f"{per_token_ms:.3f} ms per token)")
    print(f"non-streamed / llama-bench: {med(plain) / tg:.3f}; at the study's 11.5 tok/s baseline "
          f"({1000 / 11.5:.0f} ms per token) {per_token_ms:.3f} ms per token would cost "
          f"{per_token_ms / (1000 / 11.5):.2%}")


def interleaved(eng, image, demo, paths, args, server_args, llama_bench):
    """One long-lived server; per round a fresh container's first streamed request, one llama-bench repetition,
    then the long-lived server's streamed and non-streamed requests. Interleaving keeps the machine's own drift
    out of the ratios."""
    import dataclasses

    from harness.hosts.devices import Access
    from harness.run.client import request_body, stream_completion
    from harness.run.server import server_spec, wait_ready

    manifest = dataclasses.replace(demo, server_args=tuple(server_args))
    task = dataclasses.replace(demo.task(args.task), n_predict=args.n_predict)
    prompt = task.prompt()

    def start():
        port = eng.free_port()
        spec = server_spec(manifest, manifest.baseline(), paths, image, port, Access("cpu"))
        ctr = eng.start_server(spec.image, spec.command, spec.mounts, {"specbench.role": "fidelity"})
        try:
            ep = eng.endpoint(port)
            wait_ready(eng, ctr, ep, 300)
        except BaseException:
            eng.remove(ctr)
            raise
        return ctr, ep

    def streamed_rate(ep):
        res = stream_completion(ep, request_body(manifest, task, prompt, stream=True), 300)
        return res.final["timings"]["predicted_per_second"]

    fresh, bench, streamed, plain = [], [], [], []
    ctr, ep = start()
    try:
        streamed_rate(ep)  # the long-lived server's first request is not counted: it is the fresh case
        for _ in range(args.runs):
            c, cep = start()
            try:
                fresh.append(streamed_rate(cep))
            finally:
                eng.remove(c)
            bench.append(llama_bench())
            streamed.append(streamed_rate(ep))
            conn = ep.connection(300)
            conn.request("POST", "/completion", body=json.dumps(request_body(manifest, task, prompt, stream=False)),
                         headers={"Content-Type": "application/json"})
            plain.append(json.loads(conn.getresponse().read())["timings"]["predicted_per_second"])
            conn.close()
    finally:
        eng.remove(ctr)
    return fresh, bench, streamed, plain


if __name__ == "__main__":
    main()
