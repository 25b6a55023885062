"""Interference measured during each measurement: how much CPU (and GPU) everything outside the measured container
used while the timed request ran, and whether the CPUs were throttled.

    before = sample(engine, container)             # just before the timed request
    ...the timed request...
    after = sample(engine, container, edge="end")  # just after it
    record["interference"] = interference(before, after)

or, the same in one statement: `with around(engine, container) as figure: ...request...`, then
`record["interference"] = figure` (filled when the block ends).

CPU: the host's /proc/stat (all CPUs, read through `Engine.read_host_file`, locally or over SSH) gives the busy
time of the whole host over the window; the container's own cgroup CPU usage (cgroup v2 `cpu.stat` usage_usec or
v1 `cpuacct.usage`) is subtracted, and so is this process's own CPU time when the client runs on the engine's host
(it receives the stream). What remains is other work: CPU-seconds, cores on average, and a fraction of the host's
capacity. Time stolen by a hypervisor (steal) is reported beside it and counts as interference too.

The container's cgroup is read from the host's cgroup filesystem (its path found once per container in
/proc/<pid>/cgroup, checked to name the container), else inside the container with `exec`; `bench/
interference_cost.py` measures both. Reads are ordered so that the sampling work falls outside the window: the
start sample reads the container and the extras first and /proc/stat last; the end sample reads /proc/stat first.

GPU (where `nvidia-smi` answers): compute processes on the GPUs that are not the container's (its host pids, as
`docker top` lists them), and the utilisation at both edges. Kept simple: nvidia-smi has no per-process time over a
window, so any other compute process present at either edge counts.

CPU frequency (`scaling_cur_freq`) and thermal throttle counters are recorded where the host exposes them.

A measurement is **disturbed** when other work used more than DISTURBED_CORES of one core on average over the
window (others + steal), when a throttle counter rose, or when another compute process was on the GPU. The
executor (harness/run/executor.py) measures a disturbed measurement again at the end of its round, up to the run's
cap of retakes, keeping both records; the statistics (harness/analysis/stats.py) leave disturbed measurements out of
every figure and name them in a warning; an adaptive run (`invoke run --until`) then measures more rounds. On a host
where most measurements were disturbed (a shared machine busy throughout) they are kept instead, and the warning
says the figures describe a busy machine. Nothing is down-weighted: a weight would need a model of how much a given
disturbance slows a given server, which the kit does not have.

Fewer are disturbed at all with a quiet wait (`invoke run --quiet-wait 30s`, `wait_quiet`): with the server ready
and idle, the same figure is taken over consecutive short windows until one would not count as disturbed, or the
bound passes; the record keeps how long it waited and whether the host was quiet at the end.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from harness import formatter as fm
from harness.analysis.stats import DISTURBED_CORES
from harness.hosts.engine import Engine
from harness.store import result

T = TypeVar("T")

#: /proc/stat counts in USER_HZ, 100 per second on every architecture Linux runs on today.
USER_HZ = 100
#: The window of one look at the host while waiting for it to be quiet: 50 ticks per CPU, a resolution of 0.02
#: cores, half a second added to every measurement of a run that waits.
QUIET_WINDOW_S = 0.5
_FREQ_CMD = ("cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq 2>/dev/null; echo ---; "
             "cat /sys/devices/system/cpu/cpu*/thermal_throttle/core_throttle_count "
             "/sys/devices/system/cpu/cpu*/thermal_throttle/package_throttle_count 2>/dev/null; true")
_GPU_APPS = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
_GPU_UTIL = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
_EXEC_CGROUP = ["sh", "-c", "cat /sys/fs/cgroup/cpu.stat 2>/dev/null || cat /sys/fs/cgroup/cpuacct/cpuacct.usage "
                "2>/dev/null || cat /sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"]


@dataclass(frozen=True)
class HostCpu:
    """The aggregate `cpu` line of /proc/stat, in USER_HZ ticks."""

    cpus: int
    busy: int  # user + nice + system + irq + softirq (guest time is already inside user)
    steal: int
    total: int  # everything, idle and iowait included


@dataclass(frozen=True)
class Sample:
    """One edge of the window."""

    at: float  # time.monotonic() of this process when /proc/stat was read
    host: HostCpu | None
    container_s: float | None  # the container's cgroup CPU usage, seconds
    container_source: str | None  # "host cgroup v2", "host cgroup v1", "exec cgroup v2", "exec cgroup v1"
    client_s: float | None  # this process's CPU time, when it runs on the engine's host
    freq_mhz: list[float] | None
    throttle_count: int | None
    gpu_other_apps: list[result.GpuApp] | None  # compute processes on the GPUs that are not the container's
    gpu_util_pct: list[float] | None
    cost_s: float = 0.0  # how long taking this sample took
    costs: dict[str, float] = field(default_factory=dict)


def parse_proc_stat(text: str) -> HostCpu:
    """The aggregate line of /proc/stat and the number of CPUs."""
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("cpu "))
    v = [int(x) for x in head.split()[1:]]
    v += [0] * (8 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return HostCpu(cpus, user + nice + system + irq + softirq, steal, sum(v[:8]))


def parse_cgroup_usage(text: str) -> tuple[float, str] | None:
    """Seconds of CPU from a cgroup v2 cpu.stat (usage_usec) or a v1 cpuacct.usage (nanoseconds)."""
    text = text.strip()
    for line in text.splitlines():
        key, _, val = line.partition(" ")
        if key == "usage_usec" and val.strip().isdigit():
            return int(val) / 1e6, "cgroup v2"
    if text.isdigit():
        return int(text) / 1e9, "cgroup v1"
    return None


def cgroup_files(proc_cgroup: str, container_id: str) -> list[str]:
    """Host paths of a process's CPU accounting file, from its /proc/<pid>/cgroup; [] unless the cgroup path
    names the container (a /proc of another pid namespace would show someone else's process)."""
    out = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or container_id[:12] not in parts[2]:
            continue
        _, controllers, path = parts
        if controllers == "":
            out += [f"/sys/fs/cgroup{path}/cpu.stat", f"/sys/fs/cgroup/unified{path}/cpu.stat"]
        elif "cpuacct" in controllers.split(","):
            out += [f"/sys/fs/cgroup/{controllers}{path}/cpuacct.usage",
                    f"/sys/fs/cgroup/cpuacct{path}/cpuacct.usage", f"/sys/fs/cgroup/cpu,cpuacct{path}/cpuacct.usage"]
    return list(dict.fromkeys(out))


def parse_freq_throttle(text: str) -> tuple[list[float] | None, int | None]:
    """MHz per CPU and the summed throttle counters from the output of _FREQ_CMD."""
    freq_part, _, thr_part = text.partition("---")
    freqs = [int(x) / 1000 for x in freq_part.split() if x.isdigit()]
    thr = [int(x) for x in thr_part.split() if x.isdigit()]
    return (freqs or None), (sum(thr) if thr else None)


def parse_gpu_apps(text: str) -> list[result.GpuApp]:
    """nvidia-smi --query-compute-apps=pid,used_memory rows."""
    apps: list[result.GpuApp] = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            apps.append({"pid": int(parts[0]), "used_memory_mib": float(parts[1]) if parts[1].replace(".", "", 1)
                         .isdigit() else None})
    return apps


class _HostCapabilities:
    """What a host exposes, found once per engine (missing files and programs are not looked for again)."""

    def __init__(self) -> None:
        self.freq = True
        self.gpu = True
        self.cgroup_file: dict[str, str | None] = {}  # container id -> host path, or None: read by exec


_caps: weakref.WeakKeyDictionary[Engine, _HostCapabilities] = weakref.WeakKeyDictionary()


def _capabilities(engine: Engine) -> _HostCapabilities:
    caps = _caps.get(engine)
    if caps is None:
        caps = _caps[engine] = _HostCapabilities()
    return caps


def _container_usage(engine: Engine, container, caps: _HostCapabilities) -> tuple[float | None, str | None]:
    cid = container.id
    if cid not in caps.cgroup_file:
        if len(caps.cgroup_file) > 256:
            caps.cgroup_file.clear()
        caps.cgroup_file[cid] = None
        pid = engine.container_pid(container)
        proc = engine.read_host_file(f"/proc/{pid}/cgroup") if pid else None
        for path in cgroup_files(proc or "", cid):
            text = engine.read_host_file(path)
            if text and parse_cgroup_usage(text):
                caps.cgroup_file[cid] = path
                break
    path = caps.cgroup_file[cid]
    if path:
        parsed = parse_cgroup_usage(engine.read_host_file(path) or "")
        if parsed:
            return parsed[0], f"host {parsed[1]}"
    code, out = engine.exec_in(container, _EXEC_CGROUP)  # a container that has gone answers nothing
    parsed = parse_cgroup_usage(out) if code == 0 else None
    return (parsed[0], f"exec {parsed[1]}") if parsed else (None, None)


def _gpu(engine: Engine, container, caps: _HostCapabilities) -> tuple[list[result.GpuApp] | None, list[float] | None]:
    if not caps.gpu:
        return None, None
    code, out = engine.run_host(_GPU_APPS, timeout=10)
    if code != 0:
        caps.gpu = code not in (127, 126)  # no nvidia-smi on this host: do not ask again
        return None, None
    mine = engine.container_pids(container)  # without them every GPU process counts as another's
    others = [a for a in parse_gpu_apps(out) if a["pid"] not in mine]
    code, out = engine.run_host(_GPU_UTIL, timeout=10)
    util = [float(x) for x in out.split() if x.replace(".", "", 1).isdigit()] if code == 0 else None
    return others, util


def _freq(engine: Engine, caps: _HostCapabilities) -> tuple[list[float] | None, int | None]:
    if not caps.freq:
        return None, None
    code, out = engine.run_host(["sh", "-c", _FREQ_CMD], timeout=10)
    freq, thr = parse_freq_throttle(out) if code == 0 else (None, None)
    if freq is None and thr is None:
        caps.freq = False  # neither exposed here (most VMs): do not spawn a shell for it again
    return freq, thr


def _client_on_host(engine: Engine) -> bool:
    return engine.name == "local"


def sample(engine: Engine, container, edge: str = "start", client_on_host: bool | None = None) -> Sample:
    """One edge of the window around a timed request. `edge="start"` reads the container, frequency and GPU first
    and /proc/stat last; `edge="end"` reads /proc/stat first, so the sampling work stays outside the window.
    `client_on_host` (default: the engine is local) subtracts this process's CPU time: the client runs there."""
    caps = _capabilities(engine)
    on_host = _client_on_host(engine) if client_on_host is None else client_on_host
    costs: dict[str, float] = {}
    t_begin = time.monotonic()

    def timed(name: str, fn: Callable[[], T]) -> T:
        t = time.monotonic()
        value = fn()
        costs[name] = round(time.monotonic() - t, 6)
        return value

    def host() -> tuple[float, HostCpu | None, float | None]:
        text = engine.read_host_file("/proc/stat")
        return time.monotonic(), (parse_proc_stat(text) if text else None), (time.process_time() if on_host
                                                                            else None)

    # the host's /proc/stat is read last at the start and first at the end: the other reads stay outside
    first = timed("host", host) if edge != "start" else None
    usage, source = timed("container", lambda: _container_usage(engine, container, caps))
    freq, thr = timed("freq", lambda: _freq(engine, caps))
    apps, util = timed("gpu", lambda: _gpu(engine, container, caps))
    at, hostcpu, client = first if first is not None else timed("host", host)
    return Sample(at, hostcpu, usage, source, client, freq, thr, apps, util, round(time.monotonic() - t_begin, 6),
                  costs)


@dataclass(frozen=True)
class Window:
    """Interference over one window; `as_dict()` goes into the measurement record as `interference`."""

    window_s: float
    cpus: int | None
    host_busy_s: float | None
    container_s: float | None
    client_s: float | None
    others_s: float | None
    others_cores: float | None
    others_fraction: float | None  # of the host's capacity (cpus x window)
    steal_s: float | None
    container_source: str | None
    freq_mhz: dict[str, float] | None
    throttled: bool | None
    gpu_other_apps: list[result.GpuApp] | None
    gpu_util_pct: dict[str, list[float]] | None
    disturbed: bool
    reasons: list[str]
    sample_cost_s: float

    def as_dict(self) -> result.Interference:
        return result.Interference(**asdict(self))


def interference(before: Sample, after: Sample, disturbed_cores: float = DISTURBED_CORES) -> result.Interference:
    """What other work did between two samples, and whether that disturbs the measurement (see the module)."""
    return figure(before, after, disturbed_cores).as_dict()


def figure(before: Sample, after: Sample, disturbed_cores: float = DISTURBED_CORES, what: str = "request") -> Window:
    """`interference` as a typed value; `what` the window is, in its reasons."""
    window = max(after.at - before.at, 1e-9)
    reasons: list[str] = []
    busy = steal = others = cores = frac = None
    cpus = after.host.cpus if after.host else None
    if before.host and after.host:
        ticks = after.host.total - before.host.total
        # The kernel's own count of elapsed ticks over all CPUs is the most faithful window length.
        window = ticks / USER_HZ / after.host.cpus if ticks > 0 else window
        busy = (after.host.busy - before.host.busy) / USER_HZ
        steal = (after.host.steal - before.host.steal) / USER_HZ
    container = (after.container_s - before.container_s
                 if after.container_s is not None and before.container_s is not None else None)
    client = after.client_s - before.client_s if after.client_s is not None and before.client_s is not None else None
    if busy is not None:
        others = busy - (container or 0.0) - (client or 0.0)
        cores = others / window
        frac = others / (window * cpus)
        if cores + (steal or 0.0) / window > disturbed_cores:
            reasons.append(f"other work used {fm.fixed(cores, 2)} cores" + (f" and steal {fm.fixed(steal / window, 2)}"
                                                                   if steal else "") +
                           f" on average over the {fm.fixed(window, 2)} s {what} (limit {fm.plain(disturbed_cores)})")
    throttled = None
    if before.throttle_count is not None and after.throttle_count is not None:
        throttled = after.throttle_count > before.throttle_count
        if throttled:
            reasons.append(f"thermal throttling: counters rose by {after.throttle_count - before.throttle_count}")
    apps = None
    if before.gpu_other_apps is not None or after.gpu_other_apps is not None:
        seen = {a["pid"]: a for a in (before.gpu_other_apps or []) + (after.gpu_other_apps or [])}
        apps = list(seen.values())
        if apps:
            reasons.append(f"{len(apps)} other compute process(es) on the GPU: pids "
                           + ", ".join(str(p) for p in seen))
    freqs = None
    if before.freq_mhz and after.freq_mhz:
        freqs = {"start_min": min(before.freq_mhz), "start_median": statistics.median(before.freq_mhz),
                 "end_min": min(after.freq_mhz), "end_median": statistics.median(after.freq_mhz)}
    util = ({"start": before.gpu_util_pct, "end": after.gpu_util_pct}
            if before.gpu_util_pct is not None or after.gpu_util_pct is not None else None)

    r = fm.rounded
    return Window(r(window, 4), cpus, r(busy, 4), r(container, 4), r(client, 4), r(others, 4), r(cores, 4),
                  r(frac, 4), r(steal, 4), after.container_source or before.container_source, freqs, throttled, apps,
                  util, bool(reasons), reasons, r(before.cost_s + after.cost_s, 6))


@dataclass
class Watched:
    """What `around` yields: the window, once the block has ended."""

    window: Window | None = None


@contextmanager
def around(engine: Engine, container, client_on_host: bool | None = None) -> Iterator[Watched]:
    """Sample just before and just after the block; the yielded `Watched` holds the window once the block has
    ended (also when it raised: a failed request's window is still described)."""
    out = Watched()
    before = sample(engine, container, client_on_host=client_on_host)
    try:
        yield out
    finally:
        out.window = figure(before, sample(engine, container, edge="end", client_on_host=client_on_host))


def wait_quiet(engine: Engine, container, bound_s: float, client_on_host: bool | None = None,
               window_s: float | None = None) -> result.QuietWait:
    """Before a timed request, with the server ready and idle: look at the host over consecutive windows of
    QUIET_WINDOW_S (each end sample starts the next window) until a window would not count as disturbed, or
    `bound_s` has passed since the first look. Returns what the record keeps as `quiet.wait`."""
    window_s = QUIET_WINDOW_S if window_s is None else window_s
    t0 = time.monotonic()
    prev = sample(engine, container, edge="end", client_on_host=client_on_host)
    windows, fig = 0, None
    while True:
        time.sleep(max(0.0, min(window_s, bound_s - (time.monotonic() - t0))))
        cur = sample(engine, container, edge="end", client_on_host=client_on_host)
        fig = figure(prev, cur, what="look before the request")
        windows += 1
        prev = cur
        if not fig.disturbed or time.monotonic() - t0 >= bound_s:
            break
    measured = fig.others_cores is not None
    out = result.QuietWait(bound_s=bound_s, waited_s=round(time.monotonic() - t0, 3), windows=windows,
                    quiet=measured and not fig.disturbed, others_cores=fig.others_cores)
    if fig.disturbed:
        out["reasons"] = fig.reasons
    return out
