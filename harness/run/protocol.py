"""How a measurement is made: the fresh-container protocol (the kit's), and the naive reuse-server protocol (on
purpose, labelled as such), both a `MeasurementProtocol`. Both build their records with the same functions, so a
record means the same thing whichever protocol made it; they differ only in which server a request goes to."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from harness import formatter as fm
from harness.files import now_iso
from harness.hosts import environment
from harness.hosts.devices import Access, access_from_nodes
from harness.hosts.engine import Engine
from harness.image import backends
from harness.run import builds, interference, metrics, serverlog
from harness.run.client import MeasurementFailed, run_request
from harness.run.plan import Planned
from harness.run.server import Server, labels_for
from harness.schema import FORMAT_VERSIONS
from harness.store import result

Emit = Callable[[result.ResultRecord], None]
#: Log lines read after a request for the server's own statistics (printed at its end).
SERVER_LOG_LINES = 200
#: How long to wait for the acceptance line of a request whose draft calls are already in the log.
STATS_WAIT_S = 5.0


@dataclass
class Context:
    """What every measurement of a run shares."""

    run_id: str
    manifest: Any  # harness.intake.manifest.Manifest
    image: str
    backend: str
    paths_by_host: dict[str, dict[str, Path]]
    on_warning: Callable[[Engine, dict[str, str]], None]
    #: What each host's containers get (harness/hosts/devices.py); a host missing here gets none.
    access: dict[str, Access] = field(default_factory=dict)
    #: Each build's image, for a run of several builds (harness/run/builds.py); else every container runs `image`.
    images: dict[str | None, str] = field(default_factory=dict)
    #: Wait at most this long before each timed request for a quiet host (0: no wait; harness/run/interference.py).
    quiet_wait_s: float = 0.0
    #: A suite's later turns (`turns: all`): (task, prompt) -> the conversation sent (harness/run/conversations.py).
    conversations: dict[tuple[str, str], list[dict[str, str]]] = field(default_factory=dict)

    def access_on(self, engine: Engine) -> Access:
        """The devices a container of this run gets on the engine's host."""
        return self.access.get(engine.name) or access_from_nodes(backends.get(self.backend), [])

    def image_for(self, strategy: Any) -> str:
        """The image of a strategy's containers: its own build's."""
        return builds.image_for(self.images, strategy, self.image)


# ---------------------------------------------------------------- the record


def new_record(ctx: Context, item: Planned, protocol: str) -> result.ResultRecord:
    """The identity of a measurement: which cell, which run, where, how."""
    s, t, p = item.cell.strategy, item.cell.task, item.cell.prompt
    rec: result.ResultRecord = {
        "format_version": FORMAT_VERSIONS["result"], "run_id": ctx.run_id, "measurement_id": item.measurement_id,
        "strategy": s.id, "spec_type": s.spec_type, "model": s.model, "task": t.id, "prompt": p.id,
        "run_index": item.run_index, "round": item.round, "order": 0, "host": item.host, "protocol": protocol,
        "started_at": now_iso(), "status": "ok"}  # wall_s follows when the measurement has ended
    if item.retake_of is not None:
        rec["retake_of"] = item.retake_of  # the disturbed record this one measures again; both are kept
    return rec


def set_failure(rec: result.ResultRecord, e: MeasurementFailed) -> None:
    rec["status"] = "failed"
    rec["failure"] = {"phase": e.phase, "reason": e.reason, "log_tail": e.log_tail[-4000:]}


def request_into(rec: result.ResultRecord, ctx: Context, engine: Engine, server: Server, item: Planned) -> None:
    """The timed request against a ready server, its figures into the record (with the interference other work
    caused during it), after the run's quiet wait; a failure says whether the server died, with its log tail.
    A speculative server's counters are read before and after it, outside the timed window (`spec_counters`)."""
    s, t, p = item.cell.strategy, item.cell.task, item.cell.prompt
    before = metrics.scrape(server.endpoint, engine.transient_errors) if s.speculative else None
    if ctx.quiet_wait_s > 0:
        rec.setdefault("quiet", {})["wait"] = interference.wait_quiet(engine, server.container, ctx.quiet_wait_s)
    try:
        prompt = ctx.conversations.get((t.id, p.id)) or p.text()  # a suite's later turn: its conversation
        rec.update(run_request(ctx.manifest, t, server.endpoint, prompt, with_probs=not s.speculative
                               and s.parallel == 1, parallel=s.parallel,
                               window=lambda: interference.around(engine, server.container)))
    except MeasurementFailed as e:
        if e.interference:
            rec["interference"] = e.interference.as_dict()  # a failure while other work ran may be the host's: retaken
        f = server.check_alive(e.reason)
        raise MeasurementFailed(f.reason, f.log_tail, e.phase) from None
    if before is not None:
        rec["spec_counters"] = metrics.request_counters(before, metrics.scrape(server.endpoint,
                                                                               engine.transient_errors))


def server_statistics(server: Server, item: Planned, seen: set[int]) -> result.ServerLogFacts:
    """What the server itself says of its drafting (read after the timed request): its acceptance line, per-type
    statistics, the speculative implementations it added with their parameters, and each draft call's accepted
    and drafted lengths (`draft_calls`) of the requests (server tasks) not in `seen`, which then holds them too."""
    # every draft call prints a line: at most one per token of each stream
    tail = SERVER_LOG_LINES + 2 * item.cell.task.n_predict * item.cell.strategy.parallel
    deadline = time.monotonic() + STATS_WAIT_S
    while True:
        parsed = serverlog.parse(server.log(tail=tail))
        # the server logs from a thread of its own: a request's last lines may follow its response
        late = [t for t in parsed.calls if t not in seen and t not in parsed.task_accepted]
        if not late or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if parsed.malformed is not None:  # figures from a line the kit cannot read are none: the measurement fails
        raise MeasurementFailed(f"server log: a line the kit cannot read: {parsed.malformed}",
                                server.log(tail=SERVER_LOG_LINES), phase="request")
    out = parsed.speculation()
    calls = serverlog.draft_calls(parsed, seen)
    seen.update(parsed.calls, parsed.task_accepted)
    if calls is not None:
        out["draft_calls"] = calls
    return out


def device_use(ctx: Context, server: Server) -> result.DeviceLoad | None:
    """For a GPU backend, what the server's load lines say: the device each model went to, the layers offloaded,
    the device memory its buffers take (harness/run/serverlog.py). The load lines come first: the whole log."""
    if not backends.get(ctx.backend).gpu:
        return None
    malformed: list[str] = []
    used = serverlog.devices(server.log(tail="all"), malformed)
    if malformed:
        raise MeasurementFailed(f"server log: a load line the kit cannot read: {malformed[0]}",
                                server.log(tail=SERVER_LOG_LINES), phase="load")
    return used


def quiet(ctx: Context, engine: Engine) -> result.Quiet:
    q = result.Quiet(**environment.quiet_check(engine, ctx.run_id))  # harness/hosts stays below the record
    for w in q["warnings"]:
        ctx.on_warning(engine, w)
    return q


def warm_shader_cache(ctx: Context, engine: Engine, strategies: list[Any], task: Any,
                      log: Callable[[str], None]) -> None:
    """Vulkan: one short untimed request per strategy, each in a container of its own, before the first
    measurement on a host, so the driver's shader cache (a volume, harness/hosts/devices.py) holds the pipelines
    the measurements use. A GPU host's driver keeps that cache on disk between runs; without this the first
    measurement of each strategy would time shader compiles. Nothing is recorded; a failure here is left for the
    measurement itself to record."""
    short = dataclasses.replace(task, n_predict=min(task.n_predict, 32))
    for s in strategies:
        server = Server(engine, ctx.manifest, s, ctx.paths_by_host[engine.name], ctx.image_for(s),
                        ctx.access_on(engine), labels_for(ctx.run_id, s, None, None))
        t0 = time.monotonic()
        try:
            with server:
                run_request(ctx.manifest, short, server.endpoint, task.prompts[0].text(), with_probs=False)
            log(f"{engine.name}: shader cache warmed for {s.id} ({fm.fixed(time.monotonic() - t0, 0)} s, untimed)")
        except MeasurementFailed as e:
            if server.container is not None:  # a server that never got ready is not removed by its `with`
                engine.remove(server.container)
            log(f"{engine.name}: warming the shader cache for {s.id} failed ({e.reason}); the measurements "
                "will say why")


# ---------------------------------------------------------------- the protocols


@runtime_checkable
class MeasurementProtocol(Protocol):
    """How the measurements planned for one host are made (the executor runs one per host, in parallel)."""

    #: Recorded in run.json and in every record: a reader knows which protocol made a figure.
    name: str
    #: Whether a disturbed measurement may be measured again (harness/run/executor.py).
    retakes: bool

    def run(self, ctx: Context, engine: Engine, items: list[Planned], emit: Emit, stop: threading.Event) -> None:
        """Measure `items` on `engine` in their order, `emit` each record as it is made, return early once `stop`
        is set."""
        ...


class FreshContainer:
    """One new container per measurement: start, /health, one request, remove."""

    name = "fresh-container"
    #: A disturbed measurement can be measured again in a container of its own (harness/run/executor.py).
    retakes = True

    def run(self, ctx: Context, engine: Engine, items: list[Planned], emit: Emit, stop: threading.Event) -> None:
        for item in items:
            if stop.is_set():
                return
            emit(self.measure(ctx, engine, item))

    def measure(self, ctx: Context, engine: Engine, item: Planned) -> result.ResultRecord:
        """One measurement in its own container; failures come back as status 'failed'."""
        t0 = time.monotonic()
        s, t = item.cell.strategy, item.cell.task
        rec = new_record(ctx, item, self.name)
        rec["quiet"] = quiet(ctx, engine)
        server = Server(engine, ctx.manifest, s, ctx.paths_by_host[engine.name], ctx.image_for(s),
                        ctx.access_on(engine), labels_for(ctx.run_id, s, t, item.run_index))
        rec["server_command"] = server.spec.command
        try:
            with server:
                rec["container_id"] = server.container.id
                t_ready = time.monotonic()
                request_into(rec, ctx, engine, server, item)
                t_done = time.monotonic()
                rec["slots"] = server.slot_facts()
                rec["memory_peak_bytes"] = engine.memory_peak(server.container)
                rec["server_log"] = server_statistics(server, item, set())
                if backends.get(ctx.backend).gpu:
                    rec["device"] = device_use(ctx, server)
                rec["timing"] = {"container_start_s": round(server.start_s, 6), "load_s": round(server.load_s, 6),
                                 "request_s": rec["client"]["request_s"],
                                 "probs_s": round(t_done - t_ready - rec["client"]["request_s"], 6)}
        except MeasurementFailed as e:
            set_failure(rec, e)
            if server.container is not None:
                rec.setdefault("container_id", server.container.id)
        rec["wall_s"] = round(time.monotonic() - t0, 6)
        if rec["status"] == "ok":
            tm = rec["timing"]
            tm["stop_s"] = round(server.stop_s, 6)
            # What the kit itself adds: bookkeeping, the memory read, the HTTP client; not Docker's start/stop.
            tm["overhead_s"] = round(rec["wall_s"] - tm["container_start_s"] - tm["load_s"] - tm["request_s"]
                                     - tm["probs_s"] - tm["stop_s"], 6)
        return rec


class ReuseServer:
    """The naive protocol: one server per (host, strategy), every run of every task sent to it in round order."""

    name = "reuse-server"
    #: No retakes: a second request to the same warmed server is not the same measurement again.
    retakes = False

    def run(self, ctx: Context, engine: Engine, items: list[Planned], emit: Emit, stop: threading.Event) -> None:
        groups: dict[str, list[Planned]] = {}
        for item in items:  # already in round order: the plan is built round by round
            groups.setdefault(item.cell.strategy.id, []).append(item)
        for group in groups.values():
            if stop.is_set():
                return
            self._group(ctx, engine, group, emit, stop)

    def _group(self, ctx: Context, engine: Engine, group: list[Planned], emit: Emit, stop: threading.Event) -> None:
        strategy = group[0].cell.strategy
        server = Server(engine, ctx.manifest, strategy, ctx.paths_by_host[engine.name], ctx.image_for(strategy),
                        ctx.access_on(engine), labels_for(ctx.run_id, strategy, None, None))
        emitted = 0
        seen: set[int] = set()  # the server's tasks (requests) whose draft calls are already in a record
        try:
            with server:
                used = device_use(ctx, server)
                for item in group:
                    if stop.is_set():
                        return
                    t0 = time.monotonic()
                    rec = new_record(ctx, item, self.name)
                    rec.update(quiet=quiet(ctx, engine), container_id=server.container.id,
                               server_command=server.spec.command)
                    try:
                        request_into(rec, ctx, engine, server, item)
                        rec["slots"] = server.slot_facts()
                        rec["timing"] = {"container_start_s": 0.0, "load_s": 0.0,
                                         "request_s": rec["client"]["request_s"]}
                        rec["server_log"] = server_statistics(server, item, seen)
                        if backends.get(ctx.backend).gpu:
                            rec["device"] = used
                    except MeasurementFailed as e:
                        set_failure(rec, e)
                    rec["wall_s"] = round(time.monotonic() - t0, 6)
                    emit(rec)
                    emitted += 1
        except MeasurementFailed as e:  # the server did not start: every measurement of the group fails with it
            for item in group[emitted:]:
                rec = new_record(ctx, item, self.name)
                rec["wall_s"] = 0.0
                set_failure(rec, e)
                emit(rec)


PROTOCOLS: dict[str, type[MeasurementProtocol]] = {p.name: p for p in (FreshContainer, ReuseServer)}
