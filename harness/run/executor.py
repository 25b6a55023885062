"""Executes a plan: hosts in parallel (one measurement at a time per host), records appended as they finish,
progress, Ctrl-C and SIGTERM, leftovers removed, resume (measurements already recorded are skipped), and retakes:
a measurement that other work disturbed (harness/run/interference.py), or that failed while other work ran or
where its cell succeeded, is measured again at the end of its round, chosen by the pairs it restores
(harness/analysis/gaps.py), up to the run's cap, both records kept and the second marked `retake_of` the first."""

from __future__ import annotations

import itertools
import random
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import replace

from harness import KitError
from harness import formatter as fm
from harness.analysis import gaps
from harness.analysis.records import Measurement
from harness.files import now_iso
from harness.formatter import console
from harness.hosts.engine import Engine
from harness.run.plan import Planned
from harness.run.protocol import Context, MeasurementProtocol
from harness.store import result, runmeta
from harness.store.rundir import RunDir


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


class Progress:
    """A tqdm bar, or one log line per measurement; warnings printed once per (host, kind)."""

    def __init__(self, total: int, enabled: bool, log: Callable[[str], None], several_hosts: bool,
                 warned: set[tuple[str, str]] | None = None):
        self.log = log
        self.several_hosts = several_hosts
        self.warned = warned if warned is not None else set()
        self.bar = None
        if enabled and total:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="meas", dynamic_ncols=True, leave=True)

    def say(self, msg: str) -> None:
        """A line for the terminal; failure reasons and warnings quote the server's log: escapes shown."""
        (self.bar.write if self.bar is not None else self.log)(console(msg))

    def more(self, n: int) -> None:
        """n measurements more than planned (retakes)."""
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def warning(self, engine: Engine, w: dict[str, str]) -> None:
        key = (engine.name, w["kind"])
        if key not in self.warned:
            self.warned.add(key)
            self.say(f"warning ({engine.name}): {w['sentence']}")

    def done(self, rec: result.ResultRecord) -> None:
        if rec["status"] == "failed":
            self.say(f"failed: {rec['measurement_id']}: {rec['failure']['reason']}")
        elif self.bar is None:
            tps, server = rec["client"].get("decode_tok_s"), rec["server"].get("predicted_per_second")
            self.log(f"{rec['measurement_id']}: {'-' if tps is None else f'{fm.fixed(tps, 1)}'} tok/s "
                     f"(server {'-' if server is None else f'{fm.fixed(server, 1)}'})")
        if self.bar is not None:
            host = f"{rec['host']} " if self.several_hosts else ""
            self.bar.set_description(f"{host}round {rec['round']} {rec['strategy']}/{rec['task']}")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Retakes:
    """Which measurements are measured again, at the end of their round: those other work disturbed, or that failed
    while it ran or where their cell succeeded (harness/analysis/gaps.py), chosen by the pairs they restore (a
    disturbed baseline first: it holds a pair for every strategy on its task and prompt), at most `cap` in the run
    (every host together, every resume included), each once per execution, run in an order shuffled with the run's
    seed. Built from the run's records, so a resumed run retakes what is still missing, and counts what it already
    retook."""

    def __init__(self, cap: int, seed: int, baselines: Mapping[str, str | None]):
        self.cap = cap
        self.seed = seed
        self.baselines = dict(baselines)
        self.records: list[Measurement] = []
        self.taken: set[str] = set()  # ids retaken (in a record's retake_of), or being retaken now
        self.lock = threading.Lock()

    def note(self, rec: result.ResultRecord) -> None:
        """Learn from one record of the run (an old one read back, or a new one)."""
        with self.lock:
            self.records.append(Measurement.of(rec))
            if rec.get("retake_of"):
                self.taken.add(rec["retake_of"])

    def _open(self, host: str, rounds: set[int]) -> tuple[list[gaps.Gap], frozenset[gaps.Slot]]:
        st = gaps.state(self.records)
        return ([g for g in st.gaps if g.slot[0] == host and g.slot[4] in rounds and g.id not in self.taken],
                st.present)

    @property
    def left(self) -> int:
        return max(0, self.cap - len(self.taken))

    def owed(self, host: str, items: list[Planned]) -> bool:
        """Does any of these items' rounds still owe a retake the cap allows?"""
        with self.lock:
            open_, present = self._open(host, {i.round for i in items})
            return bool(gaps.choose(open_, present, self.baselines, self.left, str(self.seed)))

    def due(self, host: str, round_: int, items: list[Planned]) -> tuple[list[Planned], str | None]:
        """The retakes a finished round owes, as many as the cap still allows, in a shuffled order (they count as
        taken from now), and a line saying what they are (None when there is nothing to say)."""
        with self.lock:
            by_slot = {(i.host, i.cell.strategy.id, i.cell.task.id, i.cell.prompt.id, i.round): i for i in items}
            open_, present = self._open(host, {round_})
            open_ = [g for g in open_ if g.slot in by_slot]
            chosen = gaps.choose(open_, present, self.baselines, self.left,
                                 f"{self.seed}:{host}:{round_}:retakes")
            random.Random(f"{self.seed}:{host}:{round_}:retake-order").shuffle(chosen)
            self.taken.update(g.id for g in chosen)
            if not open_:
                return [], None
            why = [f"{n} {w}" for w, n in (("disturbed by other work", sum(g.why == "disturbed" for g in open_)),
                                           ("failed", sum(g.why == "failed" for g in open_))) if n]
            line = f"{host}: round {round_}: {len(open_)} measurement(s) do not count ({', '.join(why)}); "
            if chosen:
                line += (f"measuring {len(chosen)} again to restore {gaps.restored(chosen, present, self.baselines)} "
                         f"pair(s) (those that restore the most first; {len(self.taken)} of at most {self.cap} "
                         "retakes in this run)")
            else:
                line += (f"none measured again ({len(self.taken)} of at most {self.cap} retakes in this run"
                         + (", the cap is spent" if not self.left else ": none would restore a pair") + ")")
            return [replace(by_slot[g.slot], retake_of=g.id) for g in chosen], line


class Executor:
    """Runs planned measurements with a protocol on a set of engines, into one run folder.

    Long by design: the run's lifecycle (resume filter, hosts, interruption, leftovers) in short methods."""

    def __init__(self, ctx: Context, engines: list[Engine], protocol: MeasurementProtocol, rd: RunDir, *,
                 log: Callable[[str], None] = print, progress: bool = True, retake_cap: int = 0, seed: int = 0,
                 baselines: Mapping[str, str | None] | None = None):
        self.ctx = ctx
        self.engines = {e.name: e for e in engines}
        #: What means an engine or its connection was lost, on any of these engines: the run stops, resumable.
        self.lost_errors = tuple(dict.fromkeys(t for e in engines for t in e.lost_errors))
        self.protocol = protocol
        self.rd = rd
        self.log = log
        self.show_progress = progress
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._order = itertools.count()
        self._warned: set[tuple[str, str]] = set()  # once per run, across the rounds --until adds
        #: Retakes only where the protocol measures each time in a container of its own.
        self.retake_cap = retake_cap if getattr(protocol, "retakes", False) else 0
        self.seed = seed
        #: Each strategy's baseline: what pairs with what, so retakes go where they restore the most pairs.
        self.baselines = dict(baselines or {})
        self._done: set[str] = set()
        self._retakes = Retakes(self.retake_cap, seed, self.baselines)

    def execute(self, items: list[Planned]) -> dict[str, int]:
        """Run every item not yet in the run folder, and the retakes its rounds owe. Returns counts: ok, failed and
        skipped of the items, and the retakes made."""
        known = self.rd.measurements()
        done = self._done = {r["measurement_id"] for r in known}
        self._retakes = Retakes(self.retake_cap, self.seed, self.baselines)
        for rec in sorted(known, key=lambda r: r.get("order", 0)):
            self._retakes.note(rec)
        todo = [p for p in items if p.measurement_id not in done]
        counts = {"ok": 0, "failed": 0, "skipped": len(items) - len(todo), "retakes": 0}
        if counts["skipped"]:
            self.log(f"resume: {counts['skipped']} of {len(items)} measurements already recorded; {len(todo)} to go")
        self._order = itertools.count(len(done))
        self._stop.clear()
        self.remove_leftovers(announce=True)
        by_host: dict[str, list[Planned]] = {}
        for item in items:
            by_host.setdefault(item.host, []).append(item)
        by_host = {h: its for h, its in by_host.items()
                   if any(i.measurement_id not in done for i in its) or self._retakes.owed(h, its)}
        progress = Progress(len(todo), self.show_progress, self.log, len(self.engines) > 1, self._warned)
        self.ctx.on_warning = progress.warning
        status = "complete"
        try:
            with sigterm_as_interrupt():
                if len(by_host) <= 1:
                    for host, host_items in by_host.items():
                        self._run_host(host, host_items, counts, progress)
                else:
                    self._run_hosts_parallel(by_host, counts, progress)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except self.lost_errors as e:
            status = "interrupted"
            raise KitError(f"lost the Docker engine mid-run ({type(e).__name__}: {str(e)[:200]}); finished "
                           f"measurements are saved: resume with `invoke run --resume {self.rd.run_id}`") from None
        except KitError:
            status = "interrupted"
            raise
        finally:
            progress.close()
            self._finish(status)
        return counts

    def _finish(self, status: str) -> None:
        meta = self.rd.read_meta()
        interruptions = list(meta.interruptions)
        if status == "interrupted":
            interruptions.append(runmeta.Interruption(now_iso(), len(self.rd.done_ids())))
        self.rd.update_meta(status=status, interruptions=interruptions)
        self.remove_leftovers(announce=False)

    def remove_leftovers(self, announce: bool) -> None:
        """Containers of this run still on a host (a host that dropped mid-run, an interrupted measurement)."""
        for e in self.engines.values():
            try:
                for c in e.kit_containers(self.rd.run_id):
                    if announce:
                        self.log(f"{e.name}: removing {c.short_id} left by an earlier attempt of run {self.rd.run_id}")
                    e.remove(c)
            except e.lost_errors:
                flag = f" --host {e.name}" if e.name != "local" else ""
                self.log(f"note: {e.name} did not answer; remove its leftovers later with `invoke clean --run-id "
                         f"{self.rd.run_id}{flag}`")

    def _emit(self, rec: result.ResultRecord, counts: dict[str, int], progress: Progress) -> None:
        with self._lock:
            rec["order"] = next(self._order)
            self.rd.append(rec)
            counts["retakes" if "retake_of" in rec else rec["status"]] += 1
            progress.done(rec)
        self._retakes.note(rec)

    def _run_host(self, host: str, items: list[Planned], counts: dict[str, int], progress: Progress) -> None:
        """A host's measurements in plan order; where retakes are on, round by round, each round followed by the
        retakes of its disturbed measurements."""
        engine = self.engines[host]

        def run(these: list[Planned]) -> None:
            self.protocol.run(self.ctx, engine, these, lambda rec: self._emit(rec, counts, progress), self._stop)

        if not self.retake_cap:
            run([i for i in items if i.measurement_id not in self._done])
            return
        for round_ in sorted({i.round for i in items}):
            in_round = [i for i in items if i.round == round_]
            run([i for i in in_round if i.measurement_id not in self._done])
            if self._stop.is_set():
                return
            again, line = self._retakes.due(host, round_, in_round)
            if line:
                progress.say(line)
            if again:
                progress.more(len(again))
                run(again)

    def _run_hosts_parallel(self, by_host: dict[str, list[Planned]], counts: dict[str, int],
                            progress: Progress) -> None:
        """One worker thread per host; Ctrl-C (main thread) stops them after their current measurement."""
        with ThreadPoolExecutor(len(by_host), thread_name_prefix="host") as pool:
            futures = {pool.submit(self._run_host, host, items, counts, progress): host
                       for host, items in by_host.items()}
            try:
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                    if any(f.exception() is not None for f in done):
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
                               f"measurements are saved: resume with `invoke run --resume {self.rd.run_id}`")
