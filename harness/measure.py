"""One measurement: a fresh container, /health, one streamed request, the record, the container removed."""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import LABEL_PREFIX, KitError
from harness.engine import Endpoint, Engine, Mount
from harness.manifest import Manifest, Strategy, Task

MODELS_MOUNT = "/models"
HEALTH_POLL_S = 0.02
LOG_TAIL_LINES = 20


class MeasurementFailed(Exception):
    """The server or the request failed; the reason and the log tail go into the record."""

    def __init__(self, reason: str, log_tail: str = "", phase: str = "request"):
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail
        self.phase = phase


@dataclass
class ServerSpec:
    """What one server container runs: the image, the strategy's command line and the model files."""

    image: str
    command: list[str]
    mounts: list[Mount]
    gpu: bool


def server_command(manifest: Manifest, strategy: Strategy, model_paths: dict[str, Path], port: int) -> list[str]:
    """The llama-server command line for a strategy, bound to 127.0.0.1:port."""
    cmd = ["llama-server", "-m", f"{MODELS_MOUNT}/target/{model_paths['target'].name}"]
    if strategy.draft:
        cmd += ["-md", f"{MODELS_MOUNT}/{strategy.draft}/{model_paths[strategy.draft].name}"]
    cmd += ["--spec-type", strategy.spec_type]
    common = list(manifest.server_args)
    if strategy.parallel > 1:
        # The strategy's slot count replaces the manifest's --parallel.
        for flag in ("--parallel", "-np"):
            while flag in common:
                i = common.index(flag)
                del common[i:i + 2]
        common += ["--parallel", str(strategy.parallel)]
    cmd += common + list(strategy.args)
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    return cmd


def server_spec(manifest: Manifest, strategy: Strategy, model_paths: dict[str, Path], image: str, port: int,
                backend: str) -> ServerSpec:
    keys = ["target"] + ([strategy.draft] if strategy.draft else [])
    # Each model file is mounted read-only on its own, so models may live anywhere on the host.
    mounts = [Mount(model_paths[k], f"{MODELS_MOUNT}/{k}/{model_paths[k].name}") for k in keys]
    return ServerSpec(image, server_command(manifest, strategy, model_paths, port), mounts, backend == "cuda")


# ---------------------------------------------------------------- HTTP


def get_status(endpoint: Endpoint, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    conn = endpoint.connection(timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_ready(engine: Engine, container, endpoint: Endpoint, timeout_s: float) -> float:
    """Poll /health until 200; return seconds waited. Fails early with the log tail if the container exits."""
    start = time.monotonic()
    next_status_check = start
    while True:
        now = time.monotonic()
        try:
            status, _ = get_status(endpoint, "/health", timeout=1.0)
            if status == 200:
                return time.monotonic() - start
        except (TimeoutError, ConnectionError, http.client.HTTPException, OSError, *engine.transient_errors):
            pass
        if now >= next_status_check:
            state = engine.status(container)
            if state in ("exited", "dead", "removed"):
                code = engine.exit_code(container)
                tail = engine.logs(container, LOG_TAIL_LINES)
                raise MeasurementFailed(f"server exited during load (exit code {code}): {last_error_line(tail)}",
                                        tail, "load")
            next_status_check = now + 0.25
        if now - start > timeout_s:
            raise MeasurementFailed(f"server not ready after {timeout_s:.0f} s", engine.logs(container, LOG_TAIL_LINES),
                                    "load")
        time.sleep(HEALTH_POLL_S)


def last_error_line(log: str) -> str:
    """The telling part of a server log: its first and last error lines (llama.cpp marks them ' E '),
    else the last line that mentions an error, else the last line."""
    lines = [ln.strip() for ln in log.strip().splitlines() if ln.strip()]
    marked = [ln for ln in lines if " E " in f" {ln} "[:40]]
    if marked:
        first, last = marked[0][:200], marked[-1][:200]
        return first if first == last else f"{first} ... {last}"
    for ln in reversed(lines):
        low = ln.lower()
        if "error" in low or "failed" in low or "abort" in low:
            return ln[:300]
    return lines[-1][:300] if lines else "(no log output)"


@dataclass
class StreamResult:
    ttft_s: float
    decode_s: float
    request_s: float
    chunks: int
    text: str
    tokens: list[int]
    final: dict[str, Any]

    @property
    def predicted_n(self) -> int:
        """Tokens generated: the server's count, else the token ids or chunks the stream carried."""
        return int(self.final.get("timings", {}).get("predicted_n", len(self.tokens) or self.chunks))

    @property
    def decode_tok_s(self) -> float | None:
        """Client-side decode rate: one token arrives with the first chunk, the rate counts the ones after it."""
        n = self.predicted_n
        return (n - 1) / self.decode_s if self.decode_s > 0 and n > 1 else None


def request_body(manifest: Manifest, task: Task, prompt: str, *, stream: bool, n_probs: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {
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


def chat_to_prompt_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat endpoint variant of a completion body."""
    out = dict(body)
    out["messages"] = [{"role": "user", "content": out.pop("prompt")}]
    out["max_tokens"] = out.pop("n_predict")
    return out


def stream_completion(server: Endpoint, body: dict[str, Any], timeout_s: float,
                      endpoint: str = "completion") -> StreamResult:
    """POST a streamed completion; timestamps are taken as chunks arrive."""
    path = "/completion" if endpoint == "completion" else "/v1/chat/completions"
    if endpoint == "chat":
        body = chat_to_prompt_body(body)
    payload = json.dumps(body).encode("utf-8")
    conn = server.connection(timeout_s)
    text_parts: list[str] = []
    tokens: list[int] = []
    chunks = 0
    t_first = t_last = None
    final: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        t_send = time.monotonic()
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            detail = resp.read()[:300].decode("utf-8", "replace")
            raise MeasurementFailed(f"server answered HTTP {resp.status}: {detail}")
        while True:
            line = resp.readline()
            if not line:
                break
            now = time.monotonic()
            if now > deadline:
                raise MeasurementFailed(f"request took longer than {timeout_s:.0f} s")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if "error" in obj:
                raise MeasurementFailed(f"server error: {obj['error']}")
            piece, toks = _chunk_content(obj, endpoint)
            if piece or toks:
                chunks += 1
                if t_first is None:
                    t_first = now
                t_last = now
                text_parts.append(piece)
                tokens.extend(toks)
            if obj.get("stop") or obj.get("timings") and endpoint == "completion":
                final = obj
                if obj.get("stop"):
                    break
            elif endpoint == "chat" and obj.get("timings"):
                final = obj
        t_end = time.monotonic()
    except TimeoutError:
        raise MeasurementFailed(f"request timed out after {timeout_s:.0f} s") from None
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        raise MeasurementFailed(f"connection to the server failed: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if t_first is None:
        raise MeasurementFailed("the server streamed no tokens")
    if not final:
        raise MeasurementFailed("the stream ended without a final chunk (server died?)")
    return StreamResult(t_first - t_send, (t_last or t_first) - t_first, t_end - t_send, chunks,
                        "".join(text_parts), tokens, final)


def _chunk_content(obj: dict[str, Any], endpoint: str) -> tuple[str, list[int]]:
    if endpoint == "completion":
        return obj.get("content", "") or "", list(obj.get("tokens") or [])
    choices = obj.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return delta.get("content") or "", []


def token_probs(server: Endpoint, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Untimed request with n_probs=2: per position the chosen token and the top-2 logprobs (baseline only)."""
    conn = server.connection(timeout_s)
    try:
        conn.request("POST", "/completion", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise MeasurementFailed(f"probability request: HTTP {resp.status}", phase="probs")
    except (TimeoutError, ConnectionError, http.client.HTTPException, OSError) as e:
        raise MeasurementFailed(f"probability request failed: {e}", phase="probs") from None
    finally:
        conn.close()
    obj = json.loads(raw)
    positions = []
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


# ---------------------------------------------------------------- one measurement


@dataclass
class Outcome:
    """What one request in a server gave, before it becomes a record."""

    fields: dict[str, Any]
    timeline: dict[str, float] = field(default_factory=dict)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _concurrent(manifest: Manifest, task: Task, server: Endpoint, prompt: str, n: int) -> tuple[StreamResult,
                                                                                                dict[str, Any]]:
    """n identical streamed requests at once; stream 0's result and the aggregate figures."""
    import threading

    results: list[StreamResult | None] = [None] * n
    errors: list[BaseException] = []
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * n
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            t0 = time.monotonic()
            results[i] = stream_completion(server, request_body(manifest, task, prompt, stream=True),
                                           manifest.request_timeout_s, manifest.endpoint)
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
    tokens = sum(r.predicted_n for r in results)
    wall = max(b for _, b in spans) - min(a for a, _ in spans)
    per = [None if r.decode_tok_s is None else round(r.decode_tok_s, 3) for r in results]
    return results[0], {"streams": n, "aggregate_tok_s": round(tokens / wall, 3) if wall > 0 else 0.0,
                        "wall_s": round(wall, 6), "per_stream_tok_s": per, "tokens": tokens}


def run_request(manifest: Manifest, task: Task, server: Endpoint, with_probs: bool,
                parallel: int = 1) -> dict[str, Any]:
    """The timed request (and for the baseline, the untimed probability request) against a ready server.
    With parallel > 1, that many identical requests run at once and the aggregate is recorded too."""
    prompt = task.prompt()
    concurrency = None
    if parallel > 1:
        res, concurrency = _concurrent(manifest, task, server, prompt, parallel)
    else:
        res = stream_completion(server, request_body(manifest, task, prompt, stream=True),
                                manifest.request_timeout_s, manifest.endpoint)
    timings = res.final.get("timings", {})
    predicted_n = res.predicted_n
    decode_tok_s = res.decode_tok_s
    figures = {k: timings.get(k) for k in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n",
                                            "predicted_ms", "predicted_per_second", "cache_n")}
    # Absent (not 0) when nothing was drafted.
    figures["draft_n"] = int(timings.get("draft_n", 0))
    figures["draft_n_accepted"] = int(timings.get("draft_n_accepted", 0))
    out: dict[str, Any] = {
        "client": {"ttft_s": round(res.ttft_s, 6), "decode_s": round(res.decode_s, 6),
                   "request_s": round(res.request_s, 6), "chunks": res.chunks,
                   "decode_tok_s": None if decode_tok_s is None else round(decode_tok_s, 3)},
        "server": figures,
        "output": {"text": res.text, "sha256": hashlib.sha256(res.text.encode("utf-8")).hexdigest(),
                   "tokens": res.tokens, "n_tokens": predicted_n,
                   "stop_type": res.final.get("stop_type")},
    }
    if concurrency is not None:
        out["concurrency"] = concurrency
    if with_probs:
        out["probs"] = token_probs(server, request_body(manifest, task, prompt, stream=False, n_probs=2),
                                   manifest.request_timeout_s)
    return out


def labels_for(run_id: str, strategy: Strategy, task: Task | None, run_index: int | None) -> dict[str, str]:
    labels = {f"{LABEL_PREFIX}.run": run_id, f"{LABEL_PREFIX}.strategy": strategy.id}
    if task is not None:
        labels[f"{LABEL_PREFIX}.task"] = task.id
    if run_index is not None:
        labels[f"{LABEL_PREFIX}.run-index"] = str(run_index)
    return labels


class Server:
    """A llama-server container for one strategy, started, readied and always removed (use as a context)."""

    def __init__(self, engine: Engine, manifest: Manifest, strategy: Strategy, model_paths: dict[str, Path],
                 image: str, backend: str, labels: dict[str, str]):
        self.engine = engine
        self.manifest = manifest
        self.strategy = strategy
        self.port = engine.free_port()
        self.spec = server_spec(manifest, strategy, model_paths, image, self.port, backend)
        self.labels = labels
        self.container = None
        self.url: Endpoint | None = None
        self.start_s = 0.0
        self.load_s = 0.0
        self.stop_s = 0.0

    def __enter__(self) -> Server:
        t0 = time.monotonic()
        try:
            self.container = self.engine.start_server(self.spec.image, self.spec.command, self.spec.mounts,
                                                      self.labels, self.spec.gpu)
        except KitError as e:
            raise MeasurementFailed(str(e), phase="start") from None
        t1 = time.monotonic()
        self.start_s = t1 - t0
        self.url = self.engine.endpoint(self.port)
        self.load_s = wait_ready(self.engine, self.container, self.url, self.manifest.load_timeout_s)
        return self

    def check_alive(self, reason: str) -> MeasurementFailed:
        """Turn a request failure into one that says whether the server died, with its log tail."""
        tail = self.engine.logs(self.container, LOG_TAIL_LINES) if self.container else ""
        state = self.engine.status(self.container) if self.container else "removed"
        if state in ("exited", "dead", "removed"):
            reason = f"server container {state} during the request: {reason}"
        return MeasurementFailed(reason, tail)

    def __exit__(self, *exc: Any) -> None:
        t0 = time.monotonic()
        if self.container is not None:
            self.engine.remove(self.container)
        self.stop_s = time.monotonic() - t0


def measure(engine: Engine, manifest: Manifest, strategy: Strategy, task: Task, model_paths: dict[str, Path],
            image: str, backend: str, labels: dict[str, str], with_probs: bool,
            on_container: Callable[[str], None] | None = None) -> dict[str, Any]:
    """One measurement in its own container. Returns record fields; failures come back as status 'failed'."""
    t0 = time.monotonic()
    rec: dict[str, Any] = {"started_at": now_iso(), "status": "ok"}
    server = Server(engine, manifest, strategy, model_paths, image, backend, labels)
    rec["server_command"] = server.spec.command
    try:
        with server:
            rec["container_id"] = server.container.id
            if on_container:
                on_container(server.container.id)
            t_ready = time.monotonic()
            try:
                rec.update(run_request(manifest, task, server.url, with_probs, strategy.parallel))
            except MeasurementFailed as e:
                raise server.check_alive(e.reason) from None
            t_done = time.monotonic()
            rec["memory_peak_bytes"] = engine.memory_peak(server.container)
            rec["timing"] = {"container_start_s": round(server.start_s, 6), "load_s": round(server.load_s, 6),
                             "request_s": rec["client"]["request_s"],
                             "probs_s": round(t_done - t_ready - rec["client"]["request_s"], 6)}
    except MeasurementFailed as e:
        rec["status"] = "failed"
        rec["failure"] = {"phase": e.phase, "reason": e.reason, "log_tail": e.log_tail[-4000:]}
        if server.container is not None:
            rec.setdefault("container_id", server.container.id)
    rec["wall_s"] = round(time.monotonic() - t0, 6)
    if rec["status"] == "ok":
        t = rec["timing"]
        t["stop_s"] = round(server.stop_s, 6)
        # What the kit itself adds: bookkeeping, the memory read, the HTTP client; not Docker's start/stop.
        t["overhead_s"] = round(rec["wall_s"] - t["container_start_s"] - t["load_s"] - t["request_s"]
                                - t["probs_s"] - t["stop_s"], 6)
    return rec
