"""The load study measured: open-loop arrivals against one fresh server per (strategy, slots, level, round).

- The schedule: request send times from the level's start, seeded; Poisson (exponential gaps of mean 1/rate) or
  gamma (shape = burstiness, scale = 1/(rate × burstiness): vLLM's `--burstiness`; 1 is Poisson, below 1 burstier).
  The schedule seed and the prompt sequence depend on the study's seed, the slot count, the level and the round,
  never on the strategy: every strategy at a level and round gets the same requests at the same times.
- The sender keeps the schedule open-loop: each request is sent on a thread of its own at its time, so a late
  response never delays the next send. Only the study's concurrency cap (`max_concurrency`, vLLM's
  `--max-concurrency`) can hold a send back; the record keeps each request's scheduled and actual send time, and
  the analysis names a level whose sends fell behind its offered rate (harness/analysis/load.py).
- Warm-up: `warmup` requests sent one at a time on the fresh server before the level, not recorded (their count is).
- A sweep (GuideLLM's): `synchronous` (one request at a time, each sent when the last ended), `throughput` (every
  request at once), then rates evenly between the two rates the baseline achieved there, in the first round at
  that slot count; every strategy is measured at those rates.
- Acceptance under load: the server runs with --metrics; its `llamacpp:spec_decode_*` counters are read (GET
  /metrics, a small bounded parser of the Prometheus text here) after the warm-up and after the level, on the
  level's own server, so the difference is the level's."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness import formatter as fm
from harness.analysis import load as judged
from harness.files import now_iso
from harness.formatter import console
from harness.hosts.engine import Endpoint, Engine
from harness.intake import load as load_block
from harness.intake.manifest import Manifest, Strategy
from harness.run.client import MeasurementFailed, get_status, render_prompt, request_body, stream_completion
from harness.run.executor import sigterm_as_interrupt
from harness.run.protocol import Context
from harness.run.server import Server, labels_for
from harness.store import load as store
from harness.store.rundir import RunDir

#: The /metrics answer read at most (the counters the kit needs are a few lines).
MAX_METRICS_BYTES = 1 << 20
METRIC_PREFIX = "llamacpp:spec_decode_"
#: How long past its last scheduled send a level waits for its last answers (besides the request timeout).
DRAIN_GRACE_S = 5.0


def schedule(n: int, rate: float, arrivals: str, burstiness: float, seed: str) -> list[float]:
    """n send times (seconds from the level's start, the first at 0): gaps drawn with the seed."""
    rng = np.random.default_rng(int.from_bytes(seed.encode()[:32].ljust(8, b"\0"), "little") % (2**63))
    shape = 1.0 if arrivals == "poisson" else burstiness
    gaps = rng.gamma(shape, 1.0 / (rate * shape), size=max(0, n - 1))
    return [0.0, *np.cumsum(gaps).tolist()][:n]


def schedule_seed(study: load_block.LoadStudy, slots: int, level: str, round_: int) -> str:
    return f"{study.seed}:slots={slots}:level={level}:round={round_}"


def prompt_sequence(prompts: Sequence[tuple[str, str]], n: int, seed: str) -> list[tuple[str, str]]:
    """n (task, prompt) pairs drawn with the seed: the same for every strategy at a level and round."""
    rng = random.Random(f"{seed}:prompts")
    return [prompts[rng.randrange(len(prompts))] for _ in range(n)]


def parse_metrics(text: str) -> dict[str, float]:
    """The speculative counters of a Prometheus text answer: `name{labels} value` lines whose name starts with
    llamacpp:spec_decode_, at most 200, finite values only."""
    out: dict[str, float] = {}
    for line in text.splitlines()[:10_000]:
        if not line.startswith(METRIC_PREFIX) or len(out) >= 200:
            continue
        name, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        if math.isfinite(v) and 0 <= v <= 1e15 and len(name) <= 200:
            out[name.strip()] = v
    return out


def read_metrics(endpoint: Endpoint) -> dict[str, float]:
    """The server's speculative counters now ({} where /metrics does not answer them)."""
    try:
        status, body = get_status(endpoint, "/metrics", timeout=5.0)
    except (TimeoutError, ConnectionError, OSError):
        return {}
    if status != 200:
        return {}
    return parse_metrics(body[:MAX_METRICS_BYTES].decode("utf-8", "replace"))


@dataclass
class Plan:
    """One level's requests: bodies, names, send times (None: synchronous) and the cap."""

    bodies: list[Any]
    names: list[str]
    offsets: list[float] | None
    cap: int | None


def send(endpoint: Endpoint, plan: Plan, timeout_s: float,
         clock: Callable[[], float] = time.monotonic) -> tuple[list[store.Request], float]:
    """The level's requests, open-loop at their send times (or one after another for synchronous), each on its own
    thread; every answer waited for. Returns each request as seen and the level's wall time (first send to last
    answer)."""
    n = len(plan.bodies)
    out: list[store.Request] = [{"prompt": plan.names[i], "scheduled_s": 0.0, "sent_s": None, "ttft_s": None,
                                 "e2el_s": None, "output_tokens": 0, "error": None} for i in range(n)]
    cap = threading.BoundedSemaphore(plan.cap) if plan.cap else None
    threads: list[threading.Thread] = []
    t0 = clock()

    def one(i: int) -> None:
        try:
            res = stream_completion(endpoint, plan.bodies[i], timeout_s)
            out[i].update(ttft_s=round(res.ttft_s, 6), e2el_s=round(res.request_s, 6), output_tokens=res.predicted_n,
                          itl_s=[round(g, 6) for g in res.gaps])
        except MeasurementFailed as e:
            out[i]["error"] = fm.visible(e.reason, 300)
        except Exception as e:  # noqa: BLE001 - recorded with the request: one failure never stops the level
            out[i]["error"] = fm.visible(f"{type(e).__name__}: {e}", 300)
        finally:
            if cap is not None:
                cap.release()

    for i in range(n):
        if plan.offsets is None:  # synchronous: the next request when the last has ended
            if threads:
                threads[-1].join()
            out[i]["scheduled_s"] = round(clock() - t0, 6)
        else:
            out[i]["scheduled_s"] = round(plan.offsets[i], 6)
            delay = t0 + plan.offsets[i] - clock()
            if delay > 0:
                time.sleep(delay)
        if cap is not None:
            cap.acquire()
        out[i]["sent_s"] = round(clock() - t0, 6)
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout_s + DRAIN_GRACE_S)
    return out, clock() - t0


def level_plan(manifest: Manifest, study: load_block.LoadStudy, rendered: dict[tuple[str, str], str],
               slots: int, level: str, rate: float | None, round_: int) -> tuple[Plan, str]:
    """The requests of one level and round (the same for every strategy) and its schedule seed."""
    seed = schedule_seed(study, slots, level, round_)
    n = study.requests_at(rate)
    names = prompt_sequence(study.prompts, n, seed)
    bodies = [request_body(manifest, manifest.task(t), rendered[(t, p)], stream=True) for t, p in names]
    if level == "synchronous":
        offsets = None
    elif level == "throughput":
        offsets = [0.0] * n
    else:
        assert rate is not None
        offsets = schedule(n, rate, study.arrivals, study.burstiness, seed)
    return Plan(bodies, [f"{t}/{p}" for t, p in names], offsets, study.max_concurrency), seed


def measure_level(ctx: Context, engine: Engine, study: load_block.LoadStudy, arm: Strategy, entry: Strategy,
                  level: str, rate: float | None, round_: int) -> store.Level:
    """One level on a fresh server: start, warm-up (not recorded), counters, the level's requests open-loop,
    counters, remove. A server that does not start, or answers nothing, is a failed level, said so."""
    t_start = time.monotonic()
    manifest = ctx.manifest
    mode = "rate" if rate is not None and level not in ("synchronous", "throughput") else level
    rec: store.Level = {
        "format_version": store.FORMAT_VERSION, "run_id": ctx.run_id, "strategy": arm.id, "entry": entry.id,
        "speculative": arm.speculative, "slots": arm.parallel, "level": level, "mode": mode,
        "offered_rate": rate if mode == "rate" else None, "round": round_, "arrivals": study.arrivals,
        "burstiness": study.burstiness, "schedule_seed": schedule_seed(study, arm.parallel, level, round_),
        "warmup": study.warmup, "status": "ok", "baseline": study.strategies[0], "slo": study.slo.given(),
        "requests": [], "wall_s": 0.0, "started_at": now_iso(),
        "max_concurrency": study.max_concurrency}
    server = Server(engine, manifest, with_metrics(arm, manifest), ctx.paths_by_host[engine.name], ctx.image_for(arm),
                    ctx.access_on(engine), labels_for(ctx.run_id, arm, None, round_))
    rec["server_command"] = server.spec.command
    try:
        with server:
            rec["container_id"] = server.container.id
            rendered = {(t, p): render_prompt(server.endpoint, manifest, manifest.task(t).get_prompt(p).text())
                        for t, p in dict.fromkeys(study.prompts)}
            plan, _ = level_plan(manifest, study, rendered, arm.parallel, level, rate, round_)
            for i in range(study.warmup):  # untimed, one at a time, not recorded
                stream_completion(server.endpoint, plan.bodies[i % len(plan.bodies)], manifest.request_timeout_s)
            rec["metrics_before"] = read_metrics(server.endpoint)
            rec["requests"], _ = send(server.endpoint, plan, manifest.request_timeout_s)
            rec["metrics_after"] = read_metrics(server.endpoint)
            if all(r["error"] for r in rec["requests"]):
                raise server.check_alive(rec["requests"][0]["error"] or "no request answered")
    except MeasurementFailed as e:
        rec["status"] = "failed"
        rec["failure"] = fm.visible(e.reason, 400)
    rec["wall_s"] = round(time.monotonic() - t_start, 6)
    return rec


def with_metrics(s: Strategy, manifest: Manifest) -> Strategy:
    """The strategy's server with --metrics (the counters the level reads), once."""
    return s if "--metrics" in (*manifest.server_args, *s.args) else replace(s, args=(*s.args, "--metrics"))


def between(sync_rate: float, top_rate: float, k: int) -> list[float]:
    """k rates evenly between a synchronous and a throughput rate (exclusive), rounded to 3 significant digits."""
    lo, hi = sorted((sync_rate, top_rate))
    return [_three_digits(lo + (hi - lo) * (i + 1) / (k + 1)) for i in range(k)]


def _three_digits(x: float) -> float:
    return round(x, 2 - math.floor(math.log10(abs(x)))) if x else 0.0


def levels_of(study: load_block.LoadStudy, done: Sequence[store.Level], slots: int) -> list[tuple[str, float | None]]:
    """The levels (name, offered rate) at a slot count: the study's rates, or for a sweep synchronous and
    throughput, then the rates between from the baseline's levels there (once measured)."""
    if study.rates is not None:
        return [(fm.plain(r), r) for r in study.rates]
    out: list[tuple[str, float | None]] = [("synchronous", None), ("throughput", None)]
    base = study.strategies[0]
    got = {}
    for rec in done:
        if rec["entry"] == base and rec["slots"] == slots and rec["status"] == "ok" and rec["mode"] != "rate":
            got.setdefault(rec["mode"], judged.achieved(rec).request_rate)
    if got.get("synchronous") and got.get("throughput"):
        out += [(fm.plain(r), r) for r in between(got["synchronous"], got["throughput"], study.sweep_rates)]
    return out


def draw(ctx: Context, engine: Engine, rd: RunDir, log: Callable[[str], None] = print) -> dict[str, int]:
    """The manifest's load study into the run folder's load.jsonl: round by round, slot count by slot count,
    level by level, the strategies in an order shuffled with the study's seed (a sweep's baseline first at its
    synchronous and throughput levels: the rates between come from it). Levels already recorded are skipped
    (resume). Returns counts: ok, failed, skipped."""
    study = ctx.manifest.load
    assert study is not None
    entries = {s.id: s for s in ctx.manifest.strategies}
    arms = load_block.arms(study, ctx.manifest.strategies)
    entry_of = {load_block.arm_id(sid, n, study): sid for n in study.slots for sid in study.strategies}
    done = store.read(rd.path)
    have = {(r["strategy"], r["level"], r["round"]) for r in done}
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    with sigterm_as_interrupt():
        for round_ in range(1, study.rounds + 1):
            for n in study.slots:
                here = [a for a in arms if a.parallel == n]
                for level, rate in _levels_growing(study, done, n):
                    order = list(here)
                    random.Random(f"{study.seed}:{n}:{level}:{round_}:order").shuffle(order)
                    if study.sweep and rate is None:  # the baseline first: the rates between come from it
                        order.sort(key=lambda a: entry_of[a.id] != study.strategies[0])
                    for arm in order:
                        if (arm.id, level, round_) in have:
                            counts["skipped"] += 1
                            continue
                        entry = entries[entry_of[arm.id]]
                        rec = measure_level(ctx, engine, study, arm, entry, level, rate, round_)
                        store.append(rd.path, rec)
                        done.append(rec)
                        counts[rec["status"]] += 1
                        log(console(level_line(rec)))
    return counts


def _levels_growing(study: load_block.LoadStudy, done: list[store.Level], slots: int):
    """The levels at a slot count, a sweep's rates between joining once its baseline's levels are measured."""
    seen: set[str] = set()
    while True:
        fresh = [(lv, r) for lv, r in levels_of(study, done, slots) if lv not in seen]
        if not fresh:
            return
        for lv, r in fresh:
            seen.add(lv)
            yield lv, r


def level_line(rec: store.Level) -> str:
    """One log line per level: offered against achieved, goodput, p99 TPOT."""
    head = f"load {rec['strategy']} {rec['level']} round {rec['round']}"
    if rec["status"] != "ok":
        return f"{head}: failed: {rec.get('failure', '')}"
    a = judged.achieved(rec)
    m = judged.metrics(rec["requests"], load_block.Slo(), a.duration_s)
    offered = (f"offered {fm.plain(rec['offered_rate'])} req/s (this schedule {fm.num(a.schedule_rate, 2)}), "
               if rec["offered_rate"] else "")
    if not a.offered:
        offered += f"NOT OFFERED ({a.behind} of {len(rec['requests'])} sends behind the schedule), "
    return (f"{head}: {offered}sent at {fm.num(a.send_rate, 2)} req/s, {m.completed}/{m.sent} answered, "
            f"{fm.num(m.request_throughput, 2)} req/s, {fm.num(m.output_tok_s, 1)} tok/s, p99 TPOT "
            f"{fm.num(m.tpot_ms.get('p99'), 1)} ms")
