"""One llama-server container: its command line, its start, its readiness, its removal."""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import LABEL_PREFIX, KitError
from harness import formatter as fm
from harness.hosts.devices import Access
from harness.hosts.engine import Endpoint, Engine, Mount
from harness.image import backends
from harness.intake import flags
from harness.intake.manifest import Manifest, Strategy, Task
from harness.run import serverlog
from harness.run.client import MeasurementFailed, get_status
from harness.store import result

MODELS_MOUNT = "/models"
#: GPU backends' servers log at trace level: llama.cpp's load lines (the device each model went to, layers
#: offloaded, device buffers) are there; the extra lines are per request, not per token.
GPU_LOG_FLAGS = ["-lv", "4"]
#: Speculative servers print one info-level line per draft call (`accepted  2/ 8 draft tokens`) when this is set:
#: what acceptance by draft position is counted from (harness/run/serverlog.py). One line per target pass at most;
#: it also lists each tensor once at load, before anything is timed.
TRACE_ENV = (("LLAMA_TRACE", "1"),)
#: Speculative servers serve their own counters (drafts, drafted, accepted, accepted per position) at GET /metrics,
#: read before and after the timed request (harness/run/metrics.py); off by default in llama-server.
METRICS_FLAGS = ["--metrics"]
HEALTH_POLL_S = 0.02
LOG_TAIL_LINES = 40
#: After a failed request, how long to wait for a dying container to be reported exited.
EXIT_GRACE_S = 2.0


@dataclass
class ServerSpec:
    """What one server container runs: the image, the strategy's command line, the model files and the devices."""

    image: str
    command: list[str]
    mounts: list[Mount]
    access: Access


def server_command(manifest: Manifest, strategy: Strategy, model_paths: dict[str, Path], port: int) -> list[str]:
    """The llama-server command line for a strategy (on its own target), bound to 127.0.0.1:port."""
    cmd = ["llama-server", "-m", f"{MODELS_MOUNT}/{strategy.model}/{model_paths[strategy.model].name}"]
    if strategy.draft:
        cmd += ["-md", f"{MODELS_MOUNT}/{strategy.draft}/{model_paths[strategy.draft].name}"]
    cmd += ["--spec-type", strategy.spec_type]
    common = flags.canonical(manifest.server_args)
    own = flags.canonical(strategy.args)
    if strategy.parallel > 1:
        # The strategy's slot count replaces any --parallel given; llama-server splits -c among the slots,
        # so each of N clients keeps the context a single-stream server gives it: -c times N.
        common = flags.remove(common, ("--parallel", "-np")) + ["--parallel", str(strategy.parallel)]
        own = flags.remove(own, ("--parallel", "-np"))
        at = [i + 1 for i in range(len(common) - 1) if common[i] in ("-c", "--ctx-size")]
        if at and common[at[-1]].isdigit() and int(common[at[-1]]) > 0:  # the last -c is the one read
            common[at[-1]] = str(int(common[at[-1]]) * strategy.parallel)
    else:
        # one client, one slot: a --parallel the manifest gives for other entries says 1 here
        common = ["1" if i and common[i - 1] in ("--parallel", "-np") else a for i, a in enumerate(common)]
        if any(a in ("--parallel", "-np") for a in common):  # said once: the strategy's own (1 too) goes
            own = flags.remove(own, ("--parallel", "-np"))
    cmd += common + own
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    return cmd


def server_spec(manifest: Manifest, strategy: Strategy, model_paths: dict[str, Path], image: str, port: int,
                access: Access) -> ServerSpec:
    """The container of one strategy: its command line, its model files mounted one by one, its devices."""
    # Each model file is mounted read-only on its own, so models may live anywhere on the host.
    mounts = [Mount(model_paths[k], f"{MODELS_MOUNT}/{k}/{model_paths[k].name}") for k in strategy.model_keys()]
    cmd = server_command(manifest, strategy, model_paths, port)
    if strategy.speculative:
        access = dataclasses.replace(access, environment=access.environment + TRACE_ENV)
        if not any(flags.option(a) == "--metrics" for a in cmd):
            at = cmd.index("--host")
            cmd = cmd[:at] + METRICS_FLAGS + cmd[at:]
    if backends.get(access.backend).gpu:
        at = cmd.index("--host")
        cmd = cmd[:at] + GPU_LOG_FLAGS + cmd[at:]
    return ServerSpec(image, cmd, mounts, access)


def labels_for(run_id: str, strategy: Strategy, task: Task | None, run_index: int | None) -> dict[str, str]:
    """Container labels: `invoke clean` finds a run's leftovers by them."""
    labels = {f"{LABEL_PREFIX}.run": run_id, f"{LABEL_PREFIX}.strategy": strategy.id}
    if strategy.build:  # a run of several builds: which build's image this container runs
        labels[f"{LABEL_PREFIX}.build"] = strategy.build
    if task is not None:
        labels[f"{LABEL_PREFIX}.task"] = task.id
    if run_index is not None:
        labels[f"{LABEL_PREFIX}.run-index"] = str(run_index)
    return labels


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
            raise MeasurementFailed(f"server not ready after {fm.fixed(timeout_s, 0)} s",
                                    engine.logs(container, LOG_TAIL_LINES), "load")
        time.sleep(HEALTH_POLL_S)


def last_error_line(log: str) -> str:
    """The telling part of a server log: the abort or load error that explains it (harness/run/serverlog.py), else
    its first and last error lines (llama.cpp marks them ' E '), else the last line that mentions an error,
    else the last line."""
    reason, detail = serverlog.failure(log.splitlines())
    if reason:
        return (f"{reason} ({detail})" if detail else reason)[:400]
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


class Server:
    """A llama-server container for one strategy, started, readied and always removed (use as a context)."""

    def __init__(self, engine: Engine, manifest: Manifest, strategy: Strategy, model_paths: dict[str, Path],
                 image: str, access: Access, labels: dict[str, str]):
        self.engine = engine
        self.manifest = manifest
        self.strategy = strategy
        self.port = engine.free_port()
        self.spec = server_spec(manifest, strategy, model_paths, image, self.port, access)
        self.labels = labels
        self.container = None
        self.endpoint: Endpoint | None = None
        self.start_s = 0.0
        self.load_s = 0.0
        self.stop_s = 0.0

    def __enter__(self) -> Server:
        t0 = time.monotonic()
        try:
            self.container = self.engine.start_server(self.spec.image, self.spec.command, self.spec.mounts,
                                                      self.labels, self.spec.access)
        except KitError as e:
            raise MeasurementFailed(str(e), phase="start") from None
        t1 = time.monotonic()
        self.start_s = t1 - t0
        self.endpoint = self.engine.endpoint(self.port)
        self.load_s = wait_ready(self.engine, self.container, self.endpoint, self.manifest.load_timeout_s)
        return self

    def slot_facts(self) -> result.Slots | None:
        """What the server says of its slots (untimed, after the request): the slot count (GET /props
        total_slots) and, per slot, whether it speculates (GET /slots `speculative`), with the per-slot context.
        The pinned build's /props says "none" for its speculative types even when speculation is on; /slots
        says what each slot does. None when neither answers (--no-slots, an older server)."""
        def get(path: str) -> Any:
            try:
                status, body = get_status(self.endpoint, path, timeout=5.0)
                return json.loads(body) if status == 200 else None
            except (TimeoutError, ConnectionError, http.client.HTTPException, OSError, ValueError,
                    *self.engine.transient_errors):
                return None
        props, slots = get("/props"), get("/slots")
        if not isinstance(props, dict) and not isinstance(slots, list):
            return None
        slots = [x for x in slots if isinstance(x, dict)][:1024] if isinstance(slots, list) else []
        total = props.get("total_slots") if isinstance(props, dict) else None
        n_ctx = next((x.get("n_ctx") for x in slots if isinstance(x.get("n_ctx"), int)), None)
        return {"total": total if isinstance(total, int) else len(slots) or None,
                "speculative": [x.get("speculative") if isinstance(x.get("speculative"), bool) else None
                                for x in slots], "n_ctx": n_ctx}

    def log(self, tail: int | str = LOG_TAIL_LINES) -> str:
        """The container's log, its last `tail` lines ("all": the whole log)."""
        return self.engine.logs(self.container, tail) if self.container is not None else ""

    def check_alive(self, reason: str) -> MeasurementFailed:
        """Turn a request failure into one that says whether the server died, with its log tail."""
        state = self.engine.status(self.container) if self.container else "removed"
        deadline = time.monotonic() + EXIT_GRACE_S
        while state == "running" and time.monotonic() < deadline:  # a killed server takes a moment to be "exited"
            time.sleep(0.1)
            state = self.engine.status(self.container)
        tail = self.log()
        if state in ("exited", "dead", "removed"):
            why = serverlog.failure(tail.splitlines())[0]
            reason = f"server container {state} during the request: {why or reason}"
        return MeasurementFailed(reason, tail)

    def __exit__(self, *exc: Any) -> None:
        t0 = time.monotonic()
        if self.container is not None:
            self.engine.remove(self.container)
        self.stop_s = time.monotonic() - t0
