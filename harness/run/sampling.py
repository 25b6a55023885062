"""The sampling study drawn (its plan: harness/run/study.py). Timing is not the point here, the tokens are: each
batch of samples runs on a fresh server, one request per seed, and is recorded as one line of the run folder's
samples.jsonl (schemas/samples.schema.json): the token ids of each sample and, where the server gives them (no
drafting: b11434 answers 0.0 for drafted positions), each sampled token's log-probability under the target.

Within a batch the requests share that server: an n-gram table or a drafter's cache carries over from one sample
to the next (the report says so). With exact-match verification that can move draft counts, never tokens; a
server whose tokens did depend on it would show in stage 1 (harness/analysis/lossless.py)."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from typing import Any

from harness.files import now_iso
from harness.formatter import console
from harness.hosts.engine import Engine
from harness.run.client import Completion, MeasurementFailed, post_json, render_prompt
from harness.run.executor import sigterm_as_interrupt
from harness.run.protocol import Context
from harness.run.server import Server, labels_for
from harness.run.study import BASELINE_CANDIDATES, Arm, Batch, Study
from harness.schema import FORMAT_VERSIONS
from harness.store import result
from harness.store.rundir import RunDir


def request_body(batch: Batch, prompt: str, seed: int, tokens: int) -> Completion:
    """One sample's /completion body: not streamed, no prompt cache, token ids returned."""
    a = batch.arm
    body: Completion = {"prompt": prompt, "n_predict": tokens, "temperature": a.temperature, "seed": seed,
                            "cache_prompt": False, "stream": False, "return_tokens": True}
    if a.top_k is not None:
        body["top_k"] = a.top_k
    if a.n_probs:
        body["n_probs"] = a.n_probs
    return body


def _logprob(x: Any) -> float | None:
    return round(float(x), 5) if isinstance(x, int | float) and math.isfinite(x) else None


def sample_of(answer: dict[str, Any], seed: int, arm: Arm) -> result.Sample:
    """One sample as recorded: its token ids, the server's drafts, and for a server that does not draft, the
    log-probability of each sampled token under the target (softmax of its logits, before the sampling chain) and
    for the baseline arm its top candidates per position."""
    timings = answer.get("timings") or {}
    tokens = [int(x) for x in answer.get("tokens") or [] if isinstance(x, int)]
    out: result.Sample = {"seed": seed, "tokens": tokens, "stop_type": answer.get("stop_type"),
                           "draft_n": int(timings.get("draft_n", 0)),
                           "draft_n_accepted": int(timings.get("draft_n_accepted", 0))}
    if arm.n_probs:
        probs = [e for e in answer.get("completion_probabilities") or [] if isinstance(e, dict)]
        lps = [_logprob(e.get("logprob")) for e in probs]
        out["logprobs"] = lps if len(lps) == len(tokens) and None not in lps else None
        if arm.role == "baseline":
            out["top"] = [[[int(c["id"]), _logprob(c.get("logprob"))] for c in (e.get("top_logprobs") or [])
                           if isinstance(c, dict) and isinstance(c.get("id"), int)][:BASELINE_CANDIDATES]
                          for e in probs]
    return out


def new_record(ctx: Context, batch: Batch, tokens: int) -> result.BatchRecord:
    a = batch.arm
    return {"format_version": FORMAT_VERSIONS["samples"], "run_id": ctx.run_id, "batch_id": batch.id,
            "host": batch.host, "arm": a.id, "role": a.role, "strategy": a.strategy.id,
            "spec_type": a.strategy.spec_type, "model": a.strategy.model, "baseline": a.baseline,
            "task": batch.task.id, "prompt": batch.prompt.id, "round": batch.round, "order": 0,
            "started_at": now_iso(), "status": "ok", "temperature": a.temperature, "top_k": a.top_k,
            "n_predict": tokens, "samples": []}


def draw_batch(ctx: Context, engine: Engine, batch: Batch, tokens: int) -> result.BatchRecord:
    """One batch on a fresh server: start, /health, one request per seed, remove. A failure is recorded with the
    samples drawn before it (the analysis uses complete batches only)."""
    t0 = time.monotonic()
    rec = new_record(ctx, batch, tokens)
    s = batch.arm.strategy
    server = Server(engine, ctx.manifest, s, ctx.paths_by_host[engine.name], ctx.image, ctx.access_on(engine),
                    labels_for(ctx.run_id, s, batch.task, None))
    rec["server_command"] = server.spec.command
    try:
        with server:
            rec["container_id"] = server.container.id
            turn = ctx.conversations.get((batch.task.id, batch.prompt.id))  # a suite's later turn: its conversation
            prompt = render_prompt(server.endpoint, ctx.manifest, turn or batch.prompt.text())
            for seed in batch.seeds:
                try:
                    answer = post_json(server.endpoint, "/completion", request_body(batch, prompt, seed, tokens),
                                       ctx.manifest.request_timeout_s, "sample")
                except MeasurementFailed as e:
                    f = server.check_alive(e.reason)
                    raise MeasurementFailed(f.reason, f.log_tail, e.phase) from None
                rec["samples"].append(sample_of(answer, seed, batch.arm))
    except MeasurementFailed as e:
        rec["status"] = "failed"
        rec["failure"] = {"phase": e.phase, "reason": e.reason, "log_tail": e.log_tail[-4000:]}
        if server.container is not None:
            rec.setdefault("container_id", server.container.id)
    rec["wall_s"] = round(time.monotonic() - t0, 6)
    return rec


def draw(ctx: Context, engines: list[Engine], study: Study, rd: RunDir, log: Callable[[str], None],
         progress: bool = True) -> dict[str, int]:
    """Draw every batch of the study not yet in the run folder, host by host, appending each record as it
    finishes; Ctrl-C or SIGTERM removes the running server and leaves the finished batches for --resume. Returns
    counts: ok, failed and skipped batches, and the samples drawn."""
    done = {r["batch_id"] for r in rd.samples()}
    todo = [b for b in study.batches if b.id not in done]
    counts = {"ok": 0, "failed": 0, "skipped": len(study.batches) - len(todo), "samples": 0}
    order = itertools.count(len(done))
    by_name = {e.name: e for e in engines}
    for e in engines:
        for c in e.kit_containers(rd.run_id):  # a server an interrupted draw left
            e.remove(c)
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="batch", dynamic_ncols=True, leave=True)
    try:
        with sigterm_as_interrupt():
            for b in todo:
                rec = draw_batch(ctx, by_name[b.host], b, study.settings.tokens)
                rec["order"] = next(order)
                rd.append_samples(rec)
                counts[rec["status"]] += 1
                counts["samples"] += len(rec["samples"])
                if rec["status"] == "failed":
                    (bar.write if bar is not None else log)(console(f"failed: {b.id}: {rec['failure']['reason']}"))
                if bar is not None:
                    bar.set_description(f"sampling round {b.round} {b.arm.id}/{b.task.id}")
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return counts
