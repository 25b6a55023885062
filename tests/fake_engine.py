"""An in-memory `Engine` for the tests of scheduling: the executor, resume, Ctrl-C and SIGTERM, `--until`, retakes and
several hosts, without Docker. A test double, not product code: what it stands in for is tested against a real engine
elsewhere (tests/test_run.py, tests/test_remote.py, tests/test_drill.py).

Each server container is a FakeLlamaServer (tests/fakeserver.py) on loopback that plays a recorded measurement of the
committed demo run (results/demo-cpu/measurements.jsonl): its output text and tokens, the server's timings and its
client-side decode rate, `pace` times faster than recorded so that a run of dozens of measurements takes seconds.
The host is scripted as well: every read of /proc/stat advances the clock by one second of two CPUs, busy as
`disturbed` says of the running containers, or as `busy` says of the engine (a busy period: the first so many reads
or server starts), so the kit's own interference code marks a measurement disturbed or not, and its quiet wait sees
the host busy or quiet; nothing of this machine is read but the model files. `on_start` is called before each
server container starts: a test raises KeyboardInterrupt or ConnectionError there, or sends SIGTERM, to stop the run
or lose the engine at that point."""

from __future__ import annotations

import functools
import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness import LABEL_PREFIX, ROOT, KitError
from harness.hosts.devices import Access
from harness.hosts.engine import Endpoint, Engine, EngineRefused, Finished, Image, Mount
from harness.image import bases, recipe
from harness.image.source import describe_source
from harness.intake.builds import across
from harness.intake.manifest import Manifest
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted
from tests.fakeserver import FakeLlamaServer

RECORDED = ROOT / "results" / "demo-cpu" / "measurements.jsonl"
#: /proc/stat ticks per read: one second of two CPUs; busy ticks of a quiet and of a disturbed second.
TICKS, QUIET_BUSY, BUSY = 200, 10, 180
VERSION = "version: 11434 (b11434)\nbuilt with cc for x86_64-linux-gnu"

Disturbed = Callable[[dict[str, str], int], bool]
OnStart = Callable[["FakeEngine", dict[str, str], int], None]


@functools.cache
def recording(path: Path = RECORDED) -> dict[tuple[str, str, int], dict[str, Any]]:
    """The recorded measurements by (strategy, task, run index) (read once; never changed by a fake engine)."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {(r["strategy"], r["task"], r["run_index"]): r for r in recs if r["status"] == "ok"}


def demo_image(manifest: Manifest, image_id: str = "sha256:" + "f" * 64, arch: str = "amd64") -> Image:
    """The image a real `invoke build` of the manifest would leave: its tag and identity labels."""
    plan = recipe.build_plan(manifest, describe_source(manifest), "cpu", bases.images_for(arch, "debootstrap"), arch)
    return Image(image_id, (plan.tag,), dict(plan.labels), "2026-12-03T00:00:00Z", 136_000_000, arch)


def base_images(arch: str = "amd64") -> list[Image]:
    """The Debian bases a CPU build of this architecture starts from."""
    made = bases.images_for(arch, "debootstrap")
    return [Image(f"sha256:{i}" * 8, (tag,), {}, None, 1, arch) for i, tag in enumerate((made.builder, made.runtime))]


@dataclass
class FakeContainer:
    """A container of the fake engine: its labels and state, and the fake server that answers for it."""

    id: str
    labels: dict[str, str]
    command: list[str]
    status: str = "running"
    log: str = ""
    server: FakeLlamaServer | None = None
    record: dict[str, Any] = field(default_factory=dict)
    #: how many containers of the same (strategy, task, run index) this engine started before this one
    attempt: int = 0
    started_at: float = field(default_factory=time.monotonic)
    removed_at: float | None = None
    #: the image (tag) it was started from
    image: str = ""

    @property
    def short_id(self) -> str:
        return self.id[:12]


class FakeEngine(Engine):
    """An engine in memory (see the module): containers answered by fake servers, a scripted host."""

    lost_errors = (ConnectionError, EOFError)

    def __init__(self, name: str = "local", *, images: list[Image] | None = None,
                 recorded: dict[tuple[str, str, int], dict[str, Any]] | None = None, pace: float = 40.0,
                 speed: Callable[[dict[str, str]], float] | None = None, disturbed: Disturbed | None = None,
                 on_start: OnStart | None = None, exits: Callable[[dict[str, str]], bool] | None = None,
                 mode: str = "ok", busy: Callable[[FakeEngine], bool] | None = None,
                 request_fails: Disturbed | None = None):
        super().__init__(None)
        self.name = name
        self.held = {i.id: i for i in images or []}
        self.recorded = recorded if recorded is not None else recording()
        self.pace = pace
        self.speed = speed
        self.disturbed = disturbed
        self.busy = busy
        #: (labels, attempt) -> the server of that container answers the timed request with an HTTP error
        self.request_fails = request_fails
        #: /proc/stat reads so far: the scripted host's clock, in seconds
        self.reads = 0
        self.on_start = on_start
        self.exits = exits
        self.mode = mode
        self.containers: list[FakeContainer] = []
        #: every server container started, in order (removed ones included), and the most running at once.
        self.started: list[FakeContainer] = []
        self.most_running = 0
        self.attempts: Counter[tuple[str, str, str]] = Counter()
        self.built: list[dict[str, Any]] = []
        self._ports = itertools.count(41000)
        self._ids = itertools.count(1)
        self._endpoints: dict[int, int] = {}
        self._lock = threading.Lock()
        self._ticks = self._busy = 0

    # -- containers
    def free_port(self) -> int:
        return next(self._ports)

    def endpoint(self, port: int) -> Endpoint:
        return Endpoint(self._endpoints.get(port, 9))  # a container without a server: a closed port

    def answer(self, labels: dict[str, str]) -> dict[str, Any]:
        """The recorded measurement a server of these labels plays: its own cell and run where the recording
        has them, else the recorded baseline's (an A/A twin, a strategy of another manifest), run by run."""
        strategy, task = labels.get(f"{LABEL_PREFIX}.strategy", ""), labels.get(f"{LABEL_PREFIX}.task")
        index = int(labels.get(f"{LABEL_PREFIX}.run-index", "1"))
        runs = 1 + (index - 1) % 3
        plain = across(strategy, labels.get(f"{LABEL_PREFIX}.build"))  # an entry on one build of several
        for s in (strategy, plain, strategy.removesuffix("-aa"), "baseline"):
            for t in (task, *sorted({t for _, t, _ in self.recorded})):
                if (s, t, runs) in self.recorded:
                    return self.recorded[(s, t, runs)]
        raise KeyError(f"nothing recorded for {labels}")

    def start_server(self, image: str, command: list[str], mounts: list[Mount], labels: dict[str, str],
                     access: Access | None = None, name: str | None = None) -> FakeContainer:
        if not any(image in i.tags or image == i.id for i in self.held.values()):
            raise KitError(f"image {image} is not on {self.name}; run `invoke build` first")
        key = (labels.get(f"{LABEL_PREFIX}.strategy", ""), labels.get(f"{LABEL_PREFIX}.task", ""),
               labels.get(f"{LABEL_PREFIX}.run-index", ""))
        n = len(self.started)
        if self.on_start is not None:
            self.on_start(self, labels, n)
        rec = self.answer(labels)
        ctr = FakeContainer(f"{next(self._ids):012x}" + "0" * 52, dict(labels), list(command), record=rec,
                            attempt=self.attempts[key], image=image)
        self.attempts[key] += 1
        if self.exits is not None and self.exits(labels):
            ctr.status = "exited"
            ctr.log = "main: loading model\nllama_model_load: error loading model: tensor 'blk.0' is corrupt\n"
        else:
            ctr.server = self._serve(rec, labels, ctr)
            self._endpoints[int(command[command.index("--port") + 1])] = ctr.server.port
        with self._lock:
            self.containers.append(ctr)
            self.started.append(ctr)
            self.most_running = max(self.most_running, sum(c.status == "running" for c in self.containers))
        return ctr

    def _serve(self, rec: dict[str, Any], labels: dict[str, str], ctr: FakeContainer) -> FakeLlamaServer:
        out = rec["output"]
        tok_s = self.speed(labels) if self.speed is not None else rec["client"]["decode_tok_s"] * self.pace
        fails = self.request_fails is not None and self.request_fails(labels, ctr.attempt)
        server = FakeLlamaServer(list(out["tokens"]), mode="http-error" if fails else self.mode, text=out["text"],
                                 decode_s=(len(out["tokens"]) - 1) / tok_s,
                                 timings={**{k: v for k, v in rec["server"].items() if v is not None},
                                          "predicted_n": len(out["tokens"])},
                                 counters=replayed_counters(rec) if "--metrics" in ctr.command else None)
        server.__enter__()
        return server

    def status(self, container: FakeContainer) -> str:
        return container.status

    def exit_code(self, container: FakeContainer) -> int | None:
        return 1 if container.status == "exited" else None

    def logs(self, container: FakeContainer, tail: int = 30) -> str:
        return "\n".join(container.log.splitlines()[-tail:])

    def memory_peak(self, container: FakeContainer) -> int | None:
        return container.record.get("memory_peak_bytes")

    def container_pid(self, container: FakeContainer) -> int | None:
        return None

    def container_pids(self, container: FakeContainer) -> set[int]:
        return set()

    def exec_in(self, container: FakeContainer, argv: list[str]) -> tuple[int, str]:
        return 1, ""

    def kill(self, container: FakeContainer) -> None:
        """The server dies under the run (its process killed): it stops answering and reads as exited."""
        if container.server is not None:
            container.server.__exit__()
            container.server = None
        container.status = "exited"
        container.log += "Segmentation fault (core dumped)\n"

    def remove(self, container: FakeContainer) -> None:
        if container.server is not None:
            container.server.__exit__()
            container.server = None
        container.status = "removed"
        container.removed_at = time.monotonic()
        with self._lock:
            if container in self.containers:
                self.containers.remove(container)

    def kit_containers(self, run_id: str | None = None, helpers: bool = False) -> list[FakeContainer]:
        with self._lock:
            return [c for c in self.containers
                    if (run_id is None and f"{LABEL_PREFIX}.run" in c.labels)
                    or c.labels.get(f"{LABEL_PREFIX}.run") == run_id
                    or (helpers and run_id is None and f"{LABEL_PREFIX}.role" in c.labels)]

    def leave(self, labels: dict[str, str]) -> FakeContainer:
        """A container left behind by another attempt (or another run), as a crash would leave it."""
        ctr = FakeContainer(f"{next(self._ids):012x}" + "0" * 52, dict(labels), ["llama-server"])
        with self._lock:
            self.containers.append(ctr)
        return ctr

    def run_container(self, image: str, command: list[str], labels: dict[str, str], *, access: Access | None = None,
                      entrypoint: list[str] | None = None, mounts: tuple[Mount, ...] = (),
                      timeout: float | None = None, cpu_shares: int | None = None) -> Finished:
        return Finished(0, "", VERSION)

    # -- images
    def image(self, ref: str) -> Image | None:
        return next((i for i in self.held.values() if ref == i.id or ref in i.tags), None)

    def images(self, labels: list[str] | None = None, name: str | None = None) -> list[Image]:
        def has(img: Image, want: str) -> bool:
            key, eq, value = want.partition("=")
            return key in img.labels and (not eq or img.labels[key] == value)

        return [i for i in self.held.values() if all(has(i, w) for w in labels or [])
                and (name is None or any(t.split(":")[0] == name for t in i.tags))]

    def build_image(self, context: IO[bytes], tag: str, *, buildargs: dict[str, str], labels: dict[str, str],
                    network: str = "none", nocache: bool = False, cpu_shares: int | None = None
                    ) -> Iterator[dict[str, Any]]:
        self.built.append({"tag": tag, "buildargs": buildargs, "labels": labels, "network": network})
        yield {"stream": "Step 1/2 : FROM base\n"}
        if self.mode == "build-fails":
            yield {"stream": "CMake Error at CMakeLists.txt:1: parse error\n"}
            yield {"error": "The command '/bin/sh -c cmake' returned a non-zero code: 1"}
            return
        image_id = f"sha256:{len(self.built):064x}"
        self.held[image_id] = Image(image_id, (tag,), dict(labels), "2026-12-03T00:00:00Z", 1, "amd64")
        yield {"aux": {"ID": image_id}}
        yield {"stream": f"Successfully tagged {tag}\n"}

    def pull(self, image: str) -> Iterator[dict[str, Any]]:
        raise EngineRefused(f"pull access denied for {image.split(':')[0]}: no registry here")
        yield {}  # a generator, as the real engine's pull is

    def import_image(self, tar: Path, tag: str, changes: list[str]) -> None:
        raise EngineRefused("the fake engine imports nothing")

    # -- engine and host facts
    def info(self) -> dict[str, Any]:
        return {"NCPU": 2, "Architecture": "x86_64", "OperatingSystem": "Fake Linux", "KernelVersion": "6.1.0-fake",
                "MemTotal": 24 << 30, "Runtimes": {"runc": {}}, "CgroupVersion": "2"}

    def version(self) -> dict[str, Any]:
        return {"Version": "20.10.fake", "ApiVersion": "1.41"}

    def run_host(self, argv: list[str], timeout: float = 20) -> tuple[int, str]:
        if argv[0] == "df":
            return 0, "Filesystem 1024-blocks Used Available Capacity Mounted on\nfake 100000000 1 99999999 1% /\n"
        return 127, ""

    def read_host_file(self, path: str) -> str | None:
        if path == "/proc/stat":
            with self._lock:
                running = [c for c in self.containers if c.status == "running" and c.server is not None]
                busy = self.disturbed is not None and any(self.disturbed(c.labels, c.attempt) for c in running)
                busy = busy or (self.busy is not None and self.busy(self))
                self.reads += 1
                self._ticks += TICKS
                self._busy += BUSY if busy else QUIET_BUSY
                idle = self._ticks - self._busy
                return f"cpu  {self._busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n"
        return {"/proc/loadavg": "0.10 0.10 0.10 1/100 1\n", "/proc/meminfo": "MemTotal: 25165824 kB\n",
                "/proc/cpuinfo": "model name\t: Fake CPU @ 2.0GHz\n"}.get(path)

    def hostname(self) -> str:
        return f"fake-{self.name}"

    def close(self) -> None:
        for c in list(self.containers):
            if c.server is not None:
                c.server.__exit__()
                c.server = None


def replayed_counters(rec: dict[str, Any]) -> dict[str, Any]:
    """The speculative counters a replayed measurement's server serves at /metrics: the recorded ones, else made up
    consistent with its timings (drafted, accepted) and its mean accepted length (the draft calls), each call
    accepting the average, rounded down or up."""
    got = rec.get("spec_counters")
    if isinstance(got, dict) and "drafts" in got:
        return got
    drafted, accepted = int(rec["server"].get("draft_n") or 0), int(rec["server"].get("draft_n_accepted") or 0)
    mean_len = ((rec.get("server_log") or {}).get("draft_acceptance") or {}).get("mean_len")
    drafts = round(accepted / (mean_len - 1)) if mean_len and mean_len > 1 and accepted else (1 if drafted else 0)
    q, r = divmod(accepted, drafts) if drafts else (0, 0)
    per_pos = [drafts] * q + ([r] if r else [])
    return {"drafts": drafts, "draft_tokens": drafted, "accepted": accepted, "accepted_per_pos": per_pos}


def disturb(*cells: tuple[str, str, int], every_attempt: bool = False) -> Disturbed:
    """A `disturbed` script: these (strategy, task, run index) are measured while other work runs, on their first
    attempt only (a retake finds the machine quiet), or on every attempt."""
    want = {(s, t, str(i)) for s, t, i in cells}

    def disturbed(labels: dict[str, str], attempt: int) -> bool:
        key = tuple(labels.get(f"{LABEL_PREFIX}.{k}", "") for k in ("strategy", "task", "run-index"))
        return key in want and (every_attempt or attempt == 0)

    return disturbed


# ---------------------------------------------------------------- runs of the demo through fake engines

#: The cells these runs measure: a baseline, a strategy without a drafter, one with a drafter, on two tasks.
STRATEGIES = ["baseline", "ngram-mod", "draft-simple"]
TASKS = ["json-out", "code-gen"]
CELLS = len(STRATEGIES) * len(TASKS)


def fake(name: str = "local", **kwargs: Any) -> FakeEngine:
    """A fake engine holding the demo's image (or the `images` given)."""
    kwargs.setdefault("images", [demo_image(trusted(DEMO).manifest)])
    return FakeEngine(name, **kwargs)


def run_demo(world: Path, models_dir: Path, engines: list[FakeEngine], lines: list[str] | None = None,
             run_id: str = "fake", **kwargs: Any) -> str:
    """`invoke run` of the demo's CELLS, 2 runs each, on these engines, into world/r/<run_id> (a resume keeps the
    run's runs unless told)."""
    kwargs = {"strategies": STRATEGIES, "tasks": TASKS, **({} if kwargs.get("resume") else {"runs": 2}), "seed": 1,
              **kwargs}
    return runner.run(trusted(DEMO), results_dir=world / "r", models_dir=models_dir, run_id=run_id,
                      progress=False, log=(lines if lines is not None else []).append, engines=engines, **kwargs)


def records(world: Path, run_id: str = "fake") -> list[dict[str, Any]]:
    return RunDir.open(world / "r" / run_id).measurements()


def planned_ids(world: Path, run_id: str = "fake") -> set[str]:
    meta = RunDir.open(world / "r" / run_id).read_meta()
    return {f"{h}/{s}/{t}/{i}" for h in meta.plan.hosts for s in meta.plan.strategies for t in meta.plan.tasks
            for i in range(1, meta.plan.runs + 1)}
