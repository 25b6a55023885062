"""`invoke run`: the plan (strategies x tasks x runs) executed in rounds, one fresh container per measurement.

Each round runs every cell once, in an order shuffled with a recorded seed, so slow drift of the machine
does not land on one strategy. `reuse_server` runs the naive protocol on purpose (one server per strategy)."""

from __future__ import annotations

import itertools
import json
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
import paramiko
import requests.exceptions

from harness import KitError, __version__, environment
from harness.engine import Engine
from harness.manifest import Manifest, Strategy, Task, display_path, file_sha256
from harness.measure import MeasurementFailed, Server, labels_for, measure, now_iso, run_request
from harness.results import FORMAT_VERSION, RunDir, new_run_id

ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, ConnectionError, EOFError,
                 paramiko.SSHException)


@dataclass(frozen=True)
class Cell:
    strategy: Strategy
    task: Task

    @property
    def id(self) -> str:
        return f"{self.strategy.id}/{self.task.id}"


@dataclass(frozen=True)
class Planned:
    cell: Cell
    run_index: int
    round: int
    host: str

    @property
    def measurement_id(self) -> str:
        return f"{self.host}/{self.cell.strategy.id}/{self.cell.task.id}/{self.run_index}"


@dataclass
class Plan:
    strategies: list[Strategy]
    tasks: list[Task]
    runs: int
    shuffle_seed: int
    hosts: list[str]
    items: list[Planned] = field(default_factory=list)

    @property
    def cells(self) -> list[Cell]:
        return [Cell(s, t) for s in self.strategies for t in self.tasks]


def select(manifest: Manifest, strategies: list[str] | None, tasks: list[str] | None) -> tuple[list[Strategy],
                                                                                                   list[Task]]:
    """The manifest's strategies and tasks, or the named subset (in manifest order); unknown names are errors."""
    def pick(kind: str, names: list[str] | None, items: tuple) -> list:
        if not names:
            return list(items)
        known = {i.id for i in items}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise KitError(f"--{kind}: {', '.join(unknown)} not in the manifest (known: {', '.join(sorted(known))})")
        return [i for i in items if i.id in names]
    return pick("strategies", strategies, manifest.strategies), pick("tasks", tasks, manifest.tasks)


def make_plan(manifest: Manifest, hosts: list[str], *, strategies: list[str] | None = None,
              tasks: list[str] | None = None, runs: int | None = None, shuffle_seed: int | None = None) -> Plan:
    strats, tks = select(manifest, strategies, tasks)
    runs = runs or manifest.runs
    if runs < 1:
        raise KitError(f"--runs: expected at least 1, got {runs}")
    seed = shuffle_seed if shuffle_seed is not None else random.SystemRandom().randrange(2**31)
    plan = Plan(strats, tks, runs, seed, hosts)
    for host in hosts:
        for r in range(1, runs + 1):
            cells = plan.cells
            random.Random(f"{seed}:{host}:{r}").shuffle(cells)
            plan.items += [Planned(c, r, r, host) for c in cells]
    return plan


def describe(manifest: Manifest, plan: Plan) -> str:
    n = len(plan.items)
    hosts = f" x {len(plan.hosts)} hosts" if len(plan.hosts) > 1 else ""
    return (f"{len(plan.strategies)} strategies x {len(plan.tasks)} tasks x {plan.runs} runs{hosts} = "
            f"{n} measurements")


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops a run the way Ctrl-C does: current container removed, finished records kept."""
    def handler(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def model_facts(model_paths: dict[str, Path], manifest: Manifest) -> dict[str, Any]:
    out = {}
    for key, p in model_paths.items():
        m = manifest.models[key]
        out[key] = {"file": p.name, "sha256": m.sha256 or file_sha256(p), "size_bytes": p.stat().st_size,
                    "quantization": m.quantization,
                    "source": ({"hf": {"repo": m.hf.repo, "file": m.hf.file, "revision": m.hf.revision}} if m.hf
                               else {"generate": {"kind": m.generate.kind, "seed": m.generate.seed,
                                                  "alpha": m.generate.alpha}} if m.generate else {"path": str(p)})}
    return out


class Runner:
    """Executes a plan on one or more engines and writes the run folder."""

    def __init__(self, manifest: Manifest, engines: list[Engine], model_paths: dict[str, Path],
                 build_record: dict[str, Any], *, log: Callable[[str], None] = print, progress: bool = True,
                 reuse_server: bool = False, backend: str | None = None):
        self.manifest = manifest
        self.engines = engines
        self.model_paths = model_paths
        self.build = build_record
        self.image = build_record["tag"]
        self.backend = backend or build_record["plan"]["backend"]
        self.log = log
        self.progress = progress
        self.reuse_server = reuse_server
        self.protocol = "reuse-server" if reuse_server else "fresh-container"
        self.warned: set[str] = set()
        self.paths_by_host = {e.name: e.place_models(model_paths, log) for e in engines}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._order = itertools.count()

    # -- run folder
    def start(self, results_dir: Path, plan: Plan, run_id: str | None = None) -> RunDir:
        run_id = run_id or new_run_id(self.manifest.name)
        rd = RunDir.create(results_dir, run_id)
        meta = {
            "format_version": FORMAT_VERSION,
            "run_id": run_id,
            "created_at": now_iso(),
            "status": "running",
            "protocol": self.protocol,
            "kit_version": __version__,
            "manifest": {"name": self.manifest.name, "path": display_path(self.manifest.path),
                         "sha256": self.manifest.sha256, "text": self.manifest.text,
                         "prompts": {t.id: file_sha256(t.prompt_file) for t in self.manifest.tasks}},
            "build": self.build,
            "models": model_facts(self.model_paths, self.manifest),
            "environment": {e.name: environment.facts(e, self.image) for e in self.engines},
            "plan": {"strategies": [s.id for s in plan.strategies], "tasks": [t.id for t in plan.tasks],
                     "runs": plan.runs, "shuffle_seed": plan.shuffle_seed, "hosts": plan.hosts,
                     "measurements": len(plan.items)},
            "interruptions": [],
        }
        from harness import probe

        measured = [p for p in (probe.latest(self.manifest.name, e.name) for e in self.engines) if p]
        if measured:
            meta["bandwidth"] = {"gbs": measured[0]["gbs"], "kind": measured[0]["kind"], "host": measured[0]["host"],
                                 "measured_at": measured[0]["measured_at"]}
        rd.write_meta(meta)
        # The build record beside the results as well (run.json carries the same under "build").
        (rd.path / "build.json").write_text(json.dumps(self.build, indent=2) + "\n")
        return rd

    def check_image(self) -> None:
        for e in self.engines:
            try:
                img = e.client.images.get(self.image)
            except docker.errors.ImageNotFound:
                raise KitError(f"image {self.image} is not on {e.name}; run `invoke build` first") from None
            if img.id != self.build["image_id"]:
                self.log(f"note: {e.name} has {self.image} as {img.id[:19]}, the build record says "
                         f"{self.build['image_id'][:19]}; recording the engine's")

    # -- execution
    def execute(self, rd: RunDir, plan: Plan) -> dict[str, int]:
        """Run every planned measurement not yet in the run folder: hosts in parallel, one measurement at a time
        per host. Returns counts (ok, failed, skipped)."""
        rd_done = rd.done_ids()
        todo = [p for p in plan.items if p.measurement_id not in rd_done]
        counts = {"ok": 0, "failed": 0, "skipped": len(plan.items) - len(todo)}
        if counts["skipped"]:
            self.log(f"resume: {counts['skipped']} of {len(plan.items)} measurements already recorded; "
                     f"{len(todo)} to go")
        self._order = itertools.count(len(rd_done))
        self._stop.clear()
        # A host that dropped mid-run may have left this run's container behind: remove it now it is back.
        for e in self.engines:
            for c in e.kit_containers(rd.run_id):
                self.log(f"{e.name}: removing {c.short_id} left by an earlier attempt of run {rd.run_id}")
                e.remove(c)
        by_host: dict[str, list[Planned]] = {}
        for item in todo:
            by_host.setdefault(item.host, []).append(item)
        bar = self._bar(len(todo))
        status = "complete"
        try:
            with sigterm_as_interrupt():
                if len(by_host) <= 1:
                    for host, items in by_host.items():
                        self._run_host(rd, host, items, counts, bar)
                else:
                    self._run_hosts_parallel(rd, by_host, counts, bar)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except ENGINE_ERRORS as e:
            status = "interrupted"
            raise KitError(f"lost the Docker engine mid-run ({type(e).__name__}: {str(e)[:200]}); finished "
                           f"measurements are saved: resume with `invoke run --resume {rd.run_id}`") from None
        except KitError:
            status = "interrupted"
            raise
        finally:
            if bar is not None:
                bar.close()
            meta = rd.read_meta()
            if status == "interrupted":
                meta.setdefault("interruptions", []).append({"at": now_iso(), "done": len(rd.done_ids())})
            rd.update_meta(status=status, interruptions=meta.get("interruptions", []))
            for e in self.engines:
                try:
                    for c in e.kit_containers(rd.run_id):
                        e.remove(c)
                except ENGINE_ERRORS:
                    self.log(f"note: {e.name} did not answer; remove its leftovers later with `invoke clean "
                             f"--run-id {rd.run_id}`" + (f" --host {e.name}" if e.name != "local" else ""))
        return counts

    def _run_hosts_parallel(self, rd: RunDir, by_host: dict[str, list[Planned]], counts: dict[str, int],
                            bar) -> None:
        """One worker thread per host; Ctrl-C (main thread) stops them after their current measurement."""
        with ThreadPoolExecutor(len(by_host), thread_name_prefix="host") as pool:
            futures = {pool.submit(self._run_host, rd, host, items, counts, bar): host
                       for host, items in by_host.items()}
            try:
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                    for f in done:
                        if f.exception() is not None:
                            self._stop.set()
            except KeyboardInterrupt:
                self._stop.set()
                wait(futures)
                raise
            errors = [(futures[f], f.exception()) for f in futures if f.exception() is not None]
            if errors:
                host, exc = errors[0]
                if isinstance(exc, KitError):
                    raise exc
                raise KitError(f"host {host}: lost mid-run ({type(exc).__name__}: {str(exc)[:200]}); finished "
                               f"measurements are saved: resume with `invoke run --resume {rd.run_id}`")

    def _run_host(self, rd: RunDir, host: str, items: list[Planned], counts: dict[str, int], bar) -> None:
        if self.reuse_server:
            self._execute_reusing(rd, items, counts, bar)
            return
        engine = self._engine(host)
        for item in items:
            if self._stop.is_set():
                return
            self._describe_bar(bar, item, None)
            rec = self._one(engine, rd.run_id, item)
            self._record(rd, rec, counts, bar)

    def _record(self, rd: RunDir, rec: dict[str, Any], counts: dict[str, int], bar) -> None:
        with self._lock:
            rec["order"] = next(self._order)
            rd.append(rec)
            counts[rec["status"]] += 1
            self._after(rec, bar)

    def _engine(self, host: str) -> Engine:
        return next(e for e in self.engines if e.name == host)

    def _record_base(self, item: Planned) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "measurement_id": item.measurement_id,
                "strategy": item.cell.strategy.id, "spec_type": item.cell.strategy.spec_type,
                "task": item.cell.task.id, "run_index": item.run_index, "round": item.round, "order": 0,
                "host": item.host, "protocol": self.protocol}

    def _quiet(self, engine: Engine, run_id: str) -> dict[str, Any]:
        q = environment.quiet_check(engine, run_id)
        for w in q["warnings"]:
            key = " ".join(w.split(" ")[:2])  # one warning per kind, not per figure
            if key not in self.warned:
                self.warned.add(key)
                self.log(f"warning ({engine.name}): {w}")
        return q

    def _one(self, engine: Engine, run_id: str, item: Planned) -> dict[str, Any]:
        s, t = item.cell.strategy, item.cell.task
        quiet = self._quiet(engine, run_id)
        rec = {"run_id": run_id, **self._record_base(item), "quiet": quiet}
        rec.update(measure(engine, self.manifest, s, t, self.paths_by_host[engine.name], self.image, self.backend,
                           labels_for(run_id, s, t, item.run_index), with_probs=not s.speculative and s.parallel == 1))
        return rec

    def _execute_reusing(self, rd: RunDir, items: list[Planned], counts: dict[str, int], bar) -> None:
        """The naive protocol: one server per (host, strategy), every run of every task sent to it."""
        groups: dict[str, list[Planned]] = {}
        for item in items:  # already in round order: the plan is built round by round
            groups.setdefault(item.cell.strategy.id, []).append(item)
        for group in groups.values():
            if self._stop.is_set():
                return
            engine = self._engine(group[0].host)
            strategy = group[0].cell.strategy
            server = Server(engine, self.manifest, strategy, self.paths_by_host[engine.name], self.image,
                            self.backend, labels_for(rd.run_id, strategy, None, None))
            try:
                with server:
                    for item in group:
                        self._describe_bar(bar, item, None)
                        quiet = self._quiet(engine, rd.run_id)
                        rec = {"run_id": rd.run_id, **self._record_base(item), "quiet": quiet,
                               "started_at": now_iso(), "status": "ok", "container_id": server.container.id,
                               "server_command": server.spec.command}
                        t0 = time.monotonic()
                        try:
                            rec.update(run_request(self.manifest, item.cell.task, server.url,
                                                   not strategy.speculative, strategy.parallel))
                            rec["timing"] = {"container_start_s": 0.0, "load_s": 0.0,
                                             "request_s": rec["client"]["request_s"]}
                        except MeasurementFailed as e:
                            f = server.check_alive(e.reason)
                            rec.update(status="failed", failure={"phase": "request", "reason": f.reason,
                                                                 "log_tail": f.log_tail[-4000:]})
                        rec["wall_s"] = round(time.monotonic() - t0, 6)
                        self._record(rd, rec, counts, bar)
            except MeasurementFailed as e:
                done = rd.done_ids()
                for item in group:
                    if item.measurement_id in done:
                        continue
                    rec = {"run_id": rd.run_id, **self._record_base(item), "started_at": now_iso(),
                           "status": "failed", "wall_s": 0.0,
                           "failure": {"phase": e.phase, "reason": e.reason, "log_tail": e.log_tail[-4000:]}}
                    self._record(rd, rec, counts, bar)

    # -- progress
    def _bar(self, total: int):
        if not self.progress or total == 0:
            return None
        from tqdm import tqdm

        return tqdm(total=total, unit="meas", dynamic_ncols=True, leave=True)

    def _describe_bar(self, bar, item: Planned, plan: Plan | None) -> None:
        if bar is not None:
            host = f"{item.host} " if len(self.engines) > 1 else ""
            bar.set_description(f"{host}round {item.round} {item.cell.id}")

    def _after(self, rec: dict[str, Any], bar) -> None:
        if rec["status"] == "failed":
            msg = f"failed: {rec['measurement_id']}: {rec['failure']['reason']}"
            if bar is not None:
                bar.write(msg)
            else:
                self.log(msg)
        elif bar is None:
            tps = rec["client"].get("decode_tok_s")
            self.log(f"{rec['measurement_id']}: {tps if tps is not None else '-'} tok/s "
                     f"(server {rec['server'].get('predicted_per_second')})")
        if bar is not None:
            bar.update(1)
