"""`invoke run`: the plan (strategies x tasks x runs) executed in rounds, one fresh container per measurement.

Each round runs every cell once, in an order shuffled with a recorded seed, so slow drift of the machine
does not land on one strategy. `reuse_server` runs the naive protocol on purpose (one server per strategy)."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions

from harness import KitError, __version__, environment
from harness.engine import Engine
from harness.manifest import Manifest, Strategy, Task, display_path, file_sha256
from harness.measure import MeasurementFailed, Server, labels_for, measure, now_iso, run_request
from harness.results import FORMAT_VERSION, RunDir, new_run_id

ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, ConnectionError)


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
        rd.write_meta(meta)
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
        """Run every planned measurement not yet in the run folder. Returns counts (ok, failed, skipped)."""
        rd_done = rd.done_ids()
        todo = [p for p in plan.items if p.measurement_id not in rd_done]
        counts = {"ok": 0, "failed": 0, "skipped": len(plan.items) - len(todo)}
        if counts["skipped"]:
            self.log(f"resume: {counts['skipped']} of {len(plan.items)} measurements already recorded; "
                     f"{len(todo)} to go")
        order_base = len(rd_done)
        bar = self._bar(len(todo))
        status = "complete"
        try:
            with sigterm_as_interrupt():
                if self.reuse_server:
                    self._execute_reusing(rd, todo, order_base, counts, bar)
                else:
                    for i, item in enumerate(todo):
                        engine = self._engine(item.host)
                        self._describe_bar(bar, item, plan)
                        rec = self._one(engine, rd.run_id, item, order_base + i)
                        rd.append(rec)
                        counts[rec["status"]] += 1
                        self._after(rec, bar)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except ENGINE_ERRORS as e:
            status = "interrupted"
            raise KitError(f"lost the Docker engine mid-run ({type(e).__name__}: {str(e)[:200]}); "
                           f"finished measurements are saved: resume with `invoke run --resume {rd.run_id}`") from None
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
                    pass
        return counts

    def _engine(self, host: str) -> Engine:
        return next(e for e in self.engines if e.name == host)

    def _record_base(self, item: Planned, order: int) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "measurement_id": item.measurement_id,
                "strategy": item.cell.strategy.id, "spec_type": item.cell.strategy.spec_type,
                "task": item.cell.task.id, "run_index": item.run_index, "round": item.round, "order": order,
                "host": item.host, "protocol": self.protocol}

    def _quiet(self, engine: Engine, run_id: str) -> dict[str, Any]:
        q = environment.quiet_check(engine, run_id)
        for w in q["warnings"]:
            key = w.split(" ")[0:3].__str__()
            if key not in self.warned:
                self.warned.add(key)
                self.log(f"warning ({engine.name}): {w}")
        return q

    def _one(self, engine: Engine, run_id: str, item: Planned, order: int) -> dict[str, Any]:
        s, t = item.cell.strategy, item.cell.task
        quiet = self._quiet(engine, run_id)
        rec = {"run_id": run_id, **self._record_base(item, order), "quiet": quiet}
        rec.update(measure(engine, self.manifest, s, t, self.model_paths, self.image, self.backend,
                           labels_for(run_id, s, t, item.run_index), with_probs=not s.speculative))
        return rec

    def _execute_reusing(self, rd: RunDir, todo: list[Planned], order_base: int, counts: dict[str, int],
                         bar) -> None:
        """The naive protocol: one server per (host, strategy), every run of every task sent to it."""
        groups: dict[tuple[str, str], list[Planned]] = {}
        for item in sorted(todo, key=lambda p: (p.round, todo.index(p))):
            groups.setdefault((item.host, item.cell.strategy.id), []).append(item)
        order = order_base
        for (host, _), items in groups.items():
            engine = self._engine(host)
            strategy = items[0].cell.strategy
            server = Server(engine, self.manifest, strategy, self.model_paths, self.image, self.backend,
                            labels_for(rd.run_id, strategy, None, None))
            try:
                with server:
                    for item in items:
                        self._describe_bar(bar, item, None)
                        quiet = self._quiet(engine, rd.run_id)
                        rec = {"run_id": rd.run_id, **self._record_base(item, order), "quiet": quiet,
                               "started_at": now_iso(), "status": "ok", "container_id": server.container.id,
                               "server_command": server.spec.command}
                        t0 = time.monotonic()
                        try:
                            rec.update(run_request(self.manifest, item.cell.task, server.url,
                                                   not strategy.speculative))
                            rec["timing"] = {"container_start_s": 0.0, "load_s": 0.0,
                                             "request_s": rec["client"]["request_s"]}
                        except MeasurementFailed as e:
                            f = server.check_alive(e.reason)
                            rec.update(status="failed", failure={"phase": "request", "reason": f.reason,
                                                                 "log_tail": f.log_tail[-4000:]})
                        rec["wall_s"] = round(time.monotonic() - t0, 6)
                        rd.append(rec)
                        counts[rec["status"]] += 1
                        order += 1
                        self._after(rec, bar)
            except MeasurementFailed as e:
                for item in items:
                    if item.measurement_id in rd.done_ids():
                        continue
                    rec = {"run_id": rd.run_id, **self._record_base(item, order), "started_at": now_iso(),
                           "status": "failed", "wall_s": 0.0,
                           "failure": {"phase": e.phase, "reason": e.reason, "log_tail": e.log_tail[-4000:]}}
                    rd.append(rec)
                    counts["failed"] += 1
                    order += 1
                    self._after(rec, bar)

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
