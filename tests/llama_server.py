"""One llama-server container, one request, with the Docker SDK directly: start on a free port, wait for
/health, ask, read the log, remove. Shared by the spec-type tests and bench/drafters.py."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
from harness.run import serverlog


@dataclass
class Outcome:
    """What one container did: its answer (None when it failed) and what its log says."""

    args: list[str]
    content: str | None
    timings: dict[str, Any]
    log: str
    parsed: serverlog.ServerLog = field(default_factory=serverlog.ServerLog)
    exit_code: int | None = None

    @property
    def draft_n(self) -> int:
        return int(self.timings.get("draft_n", 0))

    @property
    def accepted(self) -> int:
        return int(self.timings.get("draft_n_accepted", 0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except (urllib.error.URLError, OSError):
        return 0


def run_once(client: docker.DockerClient, image: str, models_dir: Path, model_args: list[str], prompt: str,
             n_predict: int, *, threads: int = 2, ctx: int = 12288, load_s: float = 60,
             request_s: float = 300) -> Outcome:
    """Start `llama-server <model_args>` (paths under /models), send one temperature-0 completion, stop."""
    port = free_port()
    cmd = ["llama-server", *model_args, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
           "-tb", str(threads), "-c", str(ctx), "--parallel", "1"]
    container = client.containers.run(image, cmd, detach=True, network_mode="host",
                                      volumes={str(models_dir): {"bind": "/models", "mode": "ro"}},
                                      labels={"specbench.role": "test"})
    content, timings, exit_code = None, {}, None
    try:
        deadline = time.monotonic() + load_s
        while time.monotonic() < deadline:
            container.reload()
            if container.status in ("exited", "dead"):
                break
            if _get(f"http://127.0.0.1:{port}/health", 1) == 200:
                body = json.dumps({"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                   "cache_prompt": False, "seed": 42}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=body,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=request_s) as r:
                        answer = json.loads(r.read())
                    content, timings = answer["content"], answer.get("timings", {})
                except (urllib.error.URLError, OSError, KeyError, ValueError):
                    time.sleep(0.5)  # let a crashing server finish writing its log
                break
            time.sleep(0.1)
        container.reload()
        if container.status in ("exited", "dead"):
            exit_code = container.wait(timeout=10)["StatusCode"]
        else:
            container.stop(timeout=5)
        log = container.logs().decode("utf-8", errors="replace")
    finally:
        container.remove(force=True)
    return Outcome(model_args, content, timings, log, serverlog.parse(log), exit_code)
