"""Facts about the machine a run measured on, recorded beside every result, and the quiet-machine check."""

from __future__ import annotations

from typing import Any

from harness import formatter as fm
from harness.hosts.engine import Engine

BUSY_LOAD_PER_CORE = 0.5
BUSY_GPU_PCT = 10.0


def _cpu_model(cpuinfo: str | None) -> str | None:
    for line in (cpuinfo or "").splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("model name", "hardware", "cpu model"):
            return line.split(":", 1)[1].strip()
    return None


def nvidia_smi(engine: Engine) -> list[dict[str, Any]]:
    """GPUs as nvidia-smi reports them on the engine's host; [] where there is none."""
    code, out = engine.run_host(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,utilization.gpu",
                                 "--format=csv,noheader,nounits"])
    if code != 0:
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append({"name": parts[0], "driver": parts[1], "memory_mib": _num(parts[2]),
                         "utilization_pct": _num(parts[3])})
    return gpus


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None  # "[N/A]" on unified-memory parts such as the GB10


def facts(engine: Engine, image: str | None = None) -> dict[str, Any]:
    """Host, CPU, memory, GPU, driver, Docker engine and image facts."""
    info = engine.info()
    version = engine.version()
    meminfo = engine.read_host_file("/proc/meminfo") or ""
    mem_kb = next((int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal:")), None)
    out: dict[str, Any] = {
        "host": engine.name,
        "hostname": engine.hostname(),
        "kernel": info.get("KernelVersion"),
        "os": info.get("OperatingSystem"),
        "architecture": info.get("Architecture"),
        "cpu_model": _cpu_model(engine.read_host_file("/proc/cpuinfo")),
        "cpus": info.get("NCPU"),
        "memory_bytes": mem_kb * 1024 if mem_kb else info.get("MemTotal"),
        "docker_version": version.get("Version"),
        "docker_api_version": version.get("ApiVersion"),
        "cgroup_version": info.get("CgroupVersion"),
        "runtimes": sorted((info.get("Runtimes") or {}).keys()),
        "gpus": nvidia_smi(engine),
    }
    if image:
        try:
            img = engine.image(image)
        except Exception:  # noqa: BLE001 - the record notes the image as missing rather than failing
            img = None
        out["image"] = {"tag": image, "id": img.id, "labels": img.labels} if img else {"tag": image, "id": None}
    return out


def quiet_check(engine: Engine, run_id: str) -> dict[str, Any]:
    """Is the machine quiet enough to measure? Other kit containers, load average (against the engine host's own
    CPU count), GPU utilisation. Warnings are (kind, sentence) records."""
    warnings: list[dict[str, str]] = []
    others = [c for c in engine.kit_containers() if c.labels.get("specbench.run") != run_id]
    running_here = [c for c in engine.kit_containers(run_id) if c.status == "running"]
    if others:
        warnings.append({"kind": "other-runs", "sentence": f"{len(others)} container(s) of other kit runs exist "
                         "(`invoke clean` removes them)"})
    if running_here:
        warnings.append({"kind": "own-leftovers",
                         "sentence": f"{len(running_here)} server container(s) of this run still running"})
    load = engine.load_average()
    cpus = engine.cpu_count()
    if load and load[0] > BUSY_LOAD_PER_CORE * cpus:
        warnings.append({"kind": "busy", "sentence": f"load average {fm.fixed(load[0], 2)} on {cpus} CPUs: the machine "
                         "is busy"})
    gpus = nvidia_smi(engine)
    util = max((g["utilization_pct"] or 0.0 for g in gpus), default=None) if gpus else None
    if util is not None and util > BUSY_GPU_PCT:
        warnings.append({"kind": "gpu-busy",
                         "sentence": f"GPU utilisation {fm.fixed(util, 0)}% before the measurement"})
    return {"load_average_1m": load[0] if load else None, "kit_containers": len(others) + len(running_here),
            "gpu_utilization_pct": util, "busy": bool(warnings), "warnings": warnings}
