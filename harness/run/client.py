"""The HTTP side of one measurement: the timed streamed request, the baseline's untimed probability request, and
N concurrent clients. Timestamps are taken as chunks arrive, so TTFT and the decode rate are client-side.

With `endpoint: chat` the server renders the prompt with the model's own chat template (POST /apply-template,
untimed), and the timed request streams /completion with the rendered text: the same work as the chat endpoint,
with token ids and top-2 margins available as for raw completions."""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from harness import formatter as fm
from harness.hosts.engine import Endpoint
from harness.intake.manifest import Manifest, Task
from harness.run import filler
from harness.run.interference import Watched, Window
from harness.store import result

#: A llama-server answer larger than this is not one the kit asked for.
MAX_RESPONSE_BYTES = 64 << 20


class MeasurementFailed(Exception):
    """The server or a request failed; the reason, the phase and the server's log tail go into the record."""

    def __init__(self, reason: str, log_tail: str = "", phase: str = "request",
                 interference: Window | None = None):
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail
        self.phase = phase
        #: Other work on the host during the failed request (a timeout on a saturated host is the host's).
        self.interference = interference


class _CompletionRequired(TypedDict):
    prompt: str
    n_predict: int
    temperature: float
    seed: int
    cache_prompt: bool
    stream: bool
    return_tokens: bool


class Completion(_CompletionRequired, total=False):
    """A /completion body as the kit sends it (llama-server's API): no prompt cache, token ids returned."""

    top_k: int
    n_probs: int


class Template(TypedDict):
    """An /apply-template body: one user message, or a conversation."""

    messages: list[dict[str, str]]


def get_status(endpoint: Endpoint, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    conn = endpoint.connection(timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_RESPONSE_BYTES)
    finally:
        conn.close()


def post_json(endpoint: Endpoint, path: str, body: Completion | Template, timeout: float, phase: str) -> dict[str, Any]:
    """POST a JSON body and return the JSON answer (not streamed)."""
    conn = endpoint.connection(timeout)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read(MAX_RESPONSE_BYTES)
        if resp.status != 200:
            raise MeasurementFailed(f"{path}: HTTP {resp.status}: {raw[:300].decode('utf-8', 'replace')}", phase=phase)
    except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as e:
        raise MeasurementFailed(f"{path} failed: {type(e).__name__}: {e}", phase=phase) from None
    finally:
        conn.close()
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise MeasurementFailed(f"{path}: not JSON ({e.msg})", phase=phase) from None


@dataclass
class StreamResult:
    ttft_s: float
    decode_s: float
    request_s: float
    chunks: int
    text: str
    tokens: list[int]
    final: dict[str, Any]
    #: Seconds between consecutive tokens after the first, as they arrived (a chunk of k tokens: its gap, k-1 zeros).
    gaps: list[float] = field(default_factory=list)

    @property
    def predicted_n(self) -> int:
        """Tokens generated: the server's count, else the token ids or chunks the stream carried."""
        return int(self.final.get("timings", {}).get("predicted_n", len(self.tokens) or self.chunks))

    @property
    def decode_tok_s(self) -> float | None:
        """Client-side decode rate: one token arrives with the first chunk, the rate counts the ones after it."""
        n = self.predicted_n
        return (n - 1) / self.decode_s if self.decode_s > 0 and n > 1 else None


def request_body(manifest: Manifest, task: Task, prompt: str, *, stream: bool, n_probs: int = 0) -> Completion:
    """The /completion body: temperature and seed from the manifest, no prompt cache, token ids returned."""
    body: Completion = {
        "prompt": prompt,
        "n_predict": task.n_predict,
        "temperature": manifest.sampling.temperature,
        "seed": manifest.sampling.seed,
        "cache_prompt": False,
        "stream": stream,
        "return_tokens": True,
    }
    if manifest.sampling.top_k is not None:
        body["top_k"] = manifest.sampling.top_k
    if n_probs:
        body["n_probs"] = n_probs
    return body


def render_prompt(endpoint: Endpoint, manifest: Manifest, prompt: str | list[dict[str, str]]) -> str:
    """The prompt as the model sees it: raw for `completion`, the model's chat template applied for `chat` (to one
    user message, or to a conversation: a suite's later turn, harness/run/conversations.py)."""
    if manifest.endpoint != "chat":
        if not isinstance(prompt, str):
            raise MeasurementFailed("a conversation is sent on the chat endpoint only", phase="template")
        return prompt
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    out = post_json(endpoint, "/apply-template", {"messages": messages}, manifest.request_timeout_s, "template")
    rendered = out.get("prompt")
    if not isinstance(rendered, str):
        raise MeasurementFailed("/apply-template answered without a prompt", phase="template")
    return rendered


def stream_completion(endpoint: Endpoint, body: Completion, timeout_s: float) -> StreamResult:
    """POST a streamed /completion; timestamps are taken as chunks arrive."""
    payload = json.dumps(body).encode("utf-8")
    conn = endpoint.connection(timeout_s)
    text_parts: list[str] = []
    tokens: list[int] = []
    chunks = 0
    received = 0
    t_first = t_last = None
    gaps: list[float] = []
    final: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        t_send = time.monotonic()
        conn.request("POST", "/completion", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read(300).decode("utf-8", "replace")
            raise MeasurementFailed(f"server answered HTTP {resp.status}: {detail}")
        while True:
            line = resp.readline(1 << 20)
            if not line:
                break
            now = time.monotonic()
            received += len(line)
            if now > deadline:
                raise MeasurementFailed(f"request took longer than {fm.fixed(timeout_s, 0)} s")
            if received > MAX_RESPONSE_BYTES:
                raise MeasurementFailed(f"the stream exceeded {MAX_RESPONSE_BYTES >> 20} MB")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                raise MeasurementFailed(f"server error: {obj['error']}")
            piece, toks = obj.get("content", "") or "", list(obj.get("tokens") or [])
            if piece or toks:
                chunks += 1
                if t_first is None:
                    t_first = now
                    gaps += [0.0] * (len(toks) - 1)
                else:
                    gaps += [now - t_last] + [0.0] * (len(toks) - 1)
                t_last = now
                text_parts.append(piece)
                tokens.extend(toks)
            if obj.get("stop") or obj.get("timings"):
                final = obj
                if obj.get("stop"):
                    break
        t_end = time.monotonic()
    except TimeoutError:
        raise MeasurementFailed(f"request timed out after {fm.fixed(timeout_s, 0)} s") from None
    except (ConnectionError, http.client.HTTPException, OSError, json.JSONDecodeError) as e:
        raise MeasurementFailed(f"connection to the server failed: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if t_first is None:
        raise MeasurementFailed("the server streamed no tokens")
    if not final:
        raise MeasurementFailed("the stream ended without a final chunk (server died?)")
    return StreamResult(t_first - t_send, (t_last or t_first) - t_first, t_end - t_send, chunks,
                        "".join(text_parts), tokens, final, gaps)


def percentiles(gaps: list[float]) -> dict[str, float | None]:
    """Inter-token latency p50 and p99 in seconds (numpy's linear interpolation; None without a gap). With
    speculation tokens arrive in bursts: p50 can be near 0 while p99 is a whole verification pass."""
    if not gaps:
        return {"itl_p50_s": None, "itl_p99_s": None}
    p50, p99 = np.percentile(np.asarray(gaps, dtype=float), [50, 99])
    return {"itl_p50_s": round(float(p50), 6), "itl_p99_s": round(float(p99), 6)}


def token_probs(endpoint: Endpoint, body: Completion, timeout_s: float) -> result.Probs:
    """Untimed request with n_probs=2: per position the chosen token and the top-2 logprobs (baseline only)."""
    obj = post_json(endpoint, "/completion", body, timeout_s, "probs")
    positions: list[result.Position] = []
    for entry in obj.get("completion_probabilities", []):
        top = entry.get("top_logprobs") or []
        lp1 = top[0]["logprob"] if len(top) > 0 else entry.get("logprob")
        lp2 = top[1]["logprob"] if len(top) > 1 else None
        positions.append({
            "id": entry.get("id"),
            "token": entry.get("token"),
            "top2_id": top[1]["id"] if len(top) > 1 else None,
            "top2_token": top[1]["token"] if len(top) > 1 else None,
            "margin": None if lp1 is None or lp2 is None or not math.isfinite(lp1 - lp2) else round(lp1 - lp2, 6),
        })
    return {"content_sha256": hashlib.sha256(obj.get("content", "").encode()).hexdigest(), "positions": positions}


def concurrent(manifest: Manifest, task: Task, endpoint: Endpoint, prompt: str,
               n: int) -> tuple[StreamResult, result.Concurrency]:
    """n identical streamed requests at once; stream 0's result and the aggregate figures."""
    results: list[StreamResult | None] = [None] * n
    errors: list[BaseException] = []
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            t0 = time.monotonic()
            results[i] = stream_completion(endpoint, request_body(manifest, task, prompt, stream=True),
                                           manifest.request_timeout_s)
            spans[i] = (t0, time.monotonic())
        except BaseException as e:  # noqa: BLE001 - reported below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        e = errors[0]
        raise e if isinstance(e, MeasurementFailed) else MeasurementFailed(f"concurrent request failed: {e}")
    done = [r for r in results if r is not None]
    tokens = sum(r.predicted_n for r in done)
    wall = max(b for _, b in spans) - min(a for a, _ in spans)
    per = [None if r.decode_tok_s is None else round(r.decode_tok_s, 3) for r in done]
    timings = [r.final.get("timings", {}) for r in done]
    return done[0], {"streams": n, "aggregate_tok_s": round(tokens / wall, 3) if wall > 0 else 0.0,
                     "wall_s": round(wall, 6), "per_stream_tok_s": per, "tokens": tokens,
                     "ttft_s": [round(r.ttft_s, 6) for r in done], **percentiles([g for r in done for g in r.gaps]),
                     "draft_n": [int(t.get("draft_n", 0)) for t in timings],
                     "draft_n_accepted": [int(t.get("draft_n_accepted", 0)) for t in timings]}


def figures(res: StreamResult) -> result.RequestPart:
    """The record's client, server and output parts from one streamed result."""
    timings = res.final.get("timings", {})
    decode_tok_s = res.decode_tok_s
    server = {k: timings.get(k) for k in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n",
                                          "predicted_ms", "predicted_per_second", "cache_n")}
    # Absent (not 0) when nothing was drafted.
    server["draft_n"] = int(timings.get("draft_n", 0))
    server["draft_n_accepted"] = int(timings.get("draft_n_accepted", 0))
    return {
        "client": {"ttft_s": round(res.ttft_s, 6), "decode_s": round(res.decode_s, 6),
                   "request_s": round(res.request_s, 6), "chunks": res.chunks,
                   "decode_tok_s": None if decode_tok_s is None else round(decode_tok_s, 3),
                   **percentiles(res.gaps)},
        "server": server,
        "output": {"text": res.text, "sha256": hashlib.sha256(res.text.encode("utf-8")).hexdigest(),
                   "tokens": res.tokens, "n_tokens": res.predicted_n, "stop_type": res.final.get("stop_type")},
    }


def run_request(manifest: Manifest, task: Task, endpoint: Endpoint, prompt: str | list[dict[str, str]],
                with_probs: bool, parallel: int = 1,
                window: Callable[[], AbstractContextManager[Watched]] | None = None) -> result.RequestPart:
    """The timed request (and for the baseline, the untimed probability request) against a ready server.
    With parallel > 1, that many identical requests run at once and the aggregate is recorded too. `window`
    wraps the timed request alone (the interference measurement); what it yields goes into `interference`.
    A task with a depth reads a filler of that many tokens before its prompt (harness/run/filler.py, untimed)."""
    context = None
    if task.depth:
        try:
            text, n = filler.prefix(endpoint, task.depth, manifest.request_timeout_s, post_json)
        except ValueError as e:
            raise MeasurementFailed(f"filler: {e}", phase="template") from None
        context = filler.context_record(task.depth, n, text)
        if isinstance(prompt, list):  # a conversation (a suite's later turn): the filler opens its first message
            prompt = [{**prompt[0], "content": filler.with_prompt(text, prompt[0]["content"])}, *prompt[1:]]
        else:
            prompt = filler.with_prompt(text, prompt)
    rendered = render_prompt(endpoint, manifest, prompt)
    concurrency = None
    observed = Watched()
    try:
        with window() if window is not None else nullcontext(observed) as observed:
            if parallel > 1:
                res, concurrency = concurrent(manifest, task, endpoint, rendered, parallel)
            else:
                res = stream_completion(endpoint, request_body(manifest, task, rendered, stream=True),
                                        manifest.request_timeout_s)
    except MeasurementFailed as e:
        e.interference = e.interference or observed.window  # the window is described when the request failed
        raise
    out = figures(res)
    if observed.window is not None:
        out["interference"] = observed.window.as_dict()
    if concurrency is not None:
        out["concurrency"] = concurrency
    if context is not None:
        out["context"] = context
    if with_probs:
        out["probs"] = token_probs(endpoint, request_body(manifest, task, rendered, stream=False, n_probs=2),
                                   manifest.request_timeout_s)
    return out
