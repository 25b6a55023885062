"""A stand-in for llama-server's HTTP answers, on 127.0.0.1, for testing the client without a container.

It answers /health, /apply-template, streamed and plain /completion the way llama-server b11434 does (SSE lines
`data: {...}`, a final chunk with `stop` and `timings`), and can be told to misbehave. Given `text` and `decode_s`, it
plays a recorded answer: the whole text with the first token, then the other tokens `decode_s` later (one sleep, so
the client's decode rate is what was asked, not the sum of many short sleeps)."""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeLlamaServer:
    def __init__(self, tokens: list[int] | None = None, *, delay_s: float = 0.002, mode: str = "ok",
                 timings: dict[str, Any] | None = None, text: str | None = None, decode_s: float | None = None,
                 on_first_token: Callable[[], None] | None = None, counters: dict[str, Any] | None = None,
                 metrics: Callable[[], str] | None = None):
        self.tokens = tokens or [5, 9, 4, 7, 7]
        self.delay_s = delay_s
        self.mode = mode
        self.text = text
        self.decode_s = decode_s
        self.on_first_token = on_first_token
        #: GET /metrics's Prometheus text as a test scripts it (None: the totals of `counters` below)
        self.metrics = metrics
        self.timings = timings or {"prompt_n": 3, "prompt_ms": 1.0, "prompt_per_second": 3000.0,
                                   "predicted_n": len(self.tokens), "predicted_ms": 10.0,
                                   "predicted_per_second": 500.0, "draft_n": 4, "draft_n_accepted": 2}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.vocab: dict[str, int] = {}
        #: One request's speculative counters (drafts, draft_tokens, accepted, accepted_per_pos), added to the
        #: totals /metrics serves at the end of each streamed request, as llama-server started with --metrics
        #: does; None: a server without --metrics (/metrics answers 501).
        self.counters = counters
        self.totals = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_pos": []}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/metrics":
                    self._json(200, {"status": "ok"})
                elif fake.counters is None and fake.metrics is None:
                    self._json(501, {"error": {"message": "This server does not support metrics endpoint."}})
                else:
                    data = (fake.metrics() if fake.metrics is not None else fake.prometheus()).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append((self.path, body))
                if self.path == "/tokenize":  # a token per word with its leading space, ids in order of first sight
                    pieces = re.findall(r"\s*\S+", body["content"])
                    self._json(200, {"tokens": [fake.vocab.setdefault(p, len(fake.vocab)) for p in pieces]})
                elif self.path == "/detokenize":
                    words = {i: p for p, i in fake.vocab.items()}
                    self._json(200, {"content": "".join(words[i] for i in body["tokens"])})
                elif self.path == "/apply-template":
                    turns = "".join(f"<start_of_turn>{'model' if m['role'] == 'assistant' else m['role']}\n"
                                    f"{m['content']}<end_of_turn>\n" for m in body["messages"])
                    self._json(200, {"prompt": f"{turns}<start_of_turn>model\n"})
                elif fake.mode == "http-error":
                    self._json(500, {"error": {"message": "boom"}})
                elif body.get("stream"):
                    self._stream()
                else:
                    self._json(200, fake.plain(body))

            def _json(self, status: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, tok in enumerate(fake.tokens):
                    if fake.decode_s is None:
                        time.sleep(fake.delay_s)
                    elif i == 1:
                        time.sleep(fake.decode_s)
                    piece = f"t{tok} " if fake.text is None else (fake.text if i == 0 else "")
                    self.wfile.write(f"data: {json.dumps({'content': piece, 'tokens': [tok]})}\n\n".encode())
                    self.wfile.flush()
                    if i == 0 and fake.on_first_token is not None:
                        fake.on_first_token()
                if fake.mode == "no-final":
                    return
                if fake.mode == "bad-json":
                    self.wfile.write(b"data: {not json\n\n")
                    return
                final = {"content": "", "stop": True, "stop_type": "limit", "timings": fake.timings}
                fake.count()  # the slot is released (and its counters flushed) as the final chunk goes out
                self.wfile.write(f"data: {json.dumps(final)}\n\n".encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        # a short poll: shutdown() waits for the serving loop to look, and a run stops many servers
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def count(self) -> None:
        if self.counters is None:
            return
        t = self.totals
        for k in ("drafts", "draft_tokens", "accepted"):
            t[k] += self.counters[k]
        add = self.counters["accepted_per_pos"]
        t["accepted_per_pos"] += [0] * (len(add) - len(t["accepted_per_pos"]))
        t["accepted_per_pos"] = [a + (add[i] if i < len(add) else 0) for i, a in enumerate(t["accepted_per_pos"])]

    def prometheus(self) -> str:
        """The /metrics text of llama-server b11434 (tools/server/server-task.cpp), other families included."""
        t = self.totals
        lines = []
        for name, value in (("prompt_tokens_total", 3), ("n_decode_total", 7),
                            ("spec_decode_num_draft_tokens_total", t["draft_tokens"]),
                            ("spec_decode_num_accepted_tokens_total", t["accepted"]),
                            ("spec_decode_num_drafts_total", t["drafts"])):
            lines += [f"# HELP llamacpp:{name} a counter", f"# TYPE llamacpp:{name} counter",
                      f"llamacpp:{name} {value}"]
        lines += ["# TYPE llamacpp:predicted_tokens_seconds gauge", "llamacpp:predicted_tokens_seconds 12.5"]
        if t["accepted_per_pos"]:
            lines.append("# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter")
            lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{k}"}} {v}'
                      for k, v in enumerate(t["accepted_per_pos"])]
        return "\n".join(lines) + "\n"

    def plain(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("temperature", 0) > 0 and "seed" in body:
            return self.sampled(body)
        probs = [{"id": t, "token": f"t{t}", "logprob": -0.1,
                  "top_logprobs": [{"id": t, "token": f"t{t}", "logprob": -0.1},
                                   {"id": t + 1, "token": f"t{t + 1}", "logprob": -0.1 - i}]}
                 for i, t in enumerate(self.tokens)]
        content = "".join(f"t{t} " for t in self.tokens) if self.text is None else self.text
        return {"content": content, "completion_probabilities": probs,
                "timings": self.timings}

    def sampled(self, body: dict[str, Any]) -> dict[str, Any]:
        """A sample at temperature > 0: n_predict tokens drawn with the request's seed from a fixed distribution over
        the recorded tokens (the likelier the earlier), flatter as the temperature (or top-k) grows; log-probabilities
        (those at temperature 1) where n_probs asks, 0.0 after the first position where the timings say drafts
        were made, as llama-server b11434 answers a drafting request."""
        vocab = sorted(set(self.tokens))
        width = min(len(vocab), body.get("top_k") or len(vocab))
        weights = [math.exp(-i / body["temperature"]) for i in range(width)]
        rng = random.Random(f"{body['seed']}")
        tokens = rng.choices(vocab[:width], weights, k=body.get("n_predict", len(self.tokens)))
        out: dict[str, Any] = {"content": "".join(f"t{t} " for t in tokens), "tokens": tokens, "stop_type": "limit",
                               "timings": {**self.timings, "predicted_n": len(tokens)}}
        if body.get("n_probs"):
            total = sum(math.exp(-i) for i in range(len(vocab)))
            drafted = bool(self.timings.get("draft_n"))
            out["completion_probabilities"] = [
                {"id": t, "token": f"t{t}", "logprob": 0.0 if drafted and i else -vocab.index(t) - math.log(total),
                 "top_logprobs": [{"id": c, "token": f"t{c}", "logprob": -j - math.log(total)}
                                  for j, c in enumerate(vocab[:body["n_probs"]])]} for i, t in enumerate(tokens)]
        return out

    def __enter__(self) -> FakeLlamaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
