"""`invoke probe`: measure the memory bandwidth of a host inside the kit's image (STREAM-like triad on the CPU,
a device-to-device copy on CUDA, a tensor copy through llama.cpp's own backend (ggml) on a Vulkan device). The
physics check uses the measured figure instead of the spec sheet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
from harness import LABEL_PREFIX, KitError
from harness.files import now_iso, safe_name
from harness.hosts import devices
from harness.hosts.devices import Access, access_from_nodes
from harness.hosts.engine import Engine
from harness.image.source import CACHE


def _path(manifest_name: str, host: str) -> Path:
    return CACHE / "probe" / f"{manifest_name}-{safe_name(host)}.json"


def run(engine: Engine, image: str, backend: str, manifest_name: str, size_mib: int | None = None,
        repetitions: int | None = None, access: Access | None = None) -> dict[str, Any]:
    """Run the probe in a container of `image` on the engine's host, with the devices a run's containers get
    (harness/hosts/devices.py); save and return its record."""
    extra = (access or access_from_nodes(backend, [])).container_kwargs()
    if backend == "cuda":
        cmd = ["specbench-probe-cuda", str(size_mib or 1024), str(repetitions or 20)]
    elif backend == "vulkan":
        cmd = ["specbench-probe-ggml", str(size_mib or 256), str(repetitions or 10)]
    else:
        cmd = ["specbench-probe", str(size_mib or 256), str(repetitions or 10)]
    try:
        out = engine.client.containers.run(image, cmd, network_mode="none", remove=True, stdout=True, stderr=True,
                                           labels={f"{LABEL_PREFIX}.role": "probe"}, **extra)
    except docker.errors.ContainerError as e:
        raise KitError(f"probe failed on {engine.name}: {e.stderr.decode(errors='replace').strip()[-300:]}") from None
    except docker.errors.ImageNotFound:
        raise KitError(f"image {image} is not on {engine.name}; run `invoke build` first") from None
    line = out.decode(errors="replace").strip().splitlines()[-1]
    raw = json.loads(line)
    gbs = raw["triad_gbs"] if raw["kind"] == "cpu-stream" else raw["copy_gbs"]
    record = {"host": engine.name, "gbs": gbs, "kind": raw["kind"], "measured_at": now_iso(), "image": image,
              "raw": raw}
    if raw.get("description"):  # the device llama.cpp's backend measured
        record["device"] = f"{raw['device']} ({raw['description']})"
    p = _path(manifest_name, engine.name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=2) + "\n")
    return record


def probe_host(engine: Engine, manifest: Any, record: dict[str, Any], size_mib: int | None = None) -> dict[str, Any]:
    """`invoke probe` on one host: the image of the build record, with the device a run would use (a GPU backend's
    devices set up as for a run: harness/hosts/devices.py)."""
    backend = record["plan"]["backend"]
    acc = None
    if backend in devices.GPU_BACKENDS:
        s = devices.setup(engine, backend, record["tag"], manifest.hardware.software_device)
        if s.problem:
            raise KitError(f"{engine.name}: {s.problem}")
        acc = s.access
    return run(engine, record["tag"], backend, manifest.name, size_mib, access=acc)


def latest(manifest_name: str, host: str) -> dict[str, Any] | None:
    p = _path(manifest_name, host)
    return json.loads(p.read_text()) if p.exists() else None
