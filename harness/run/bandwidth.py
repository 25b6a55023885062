"""`invoke probe`: measure the memory bandwidth of a host inside the kit's image (STREAM-like triad on the CPU,
a device-to-device copy on CUDA). The physics check uses the measured figure instead of the spec sheet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
from harness import LABEL_PREFIX, KitError
from harness.files import now_iso, safe_name
from harness.hosts.engine import Engine
from harness.image.source import CACHE


def _path(manifest_name: str, host: str) -> Path:
    return CACHE / "probe" / f"{manifest_name}-{safe_name(host)}.json"


def run(engine: Engine, image: str, backend: str, manifest_name: str, size_mib: int | None = None,
        repetitions: int | None = None) -> dict[str, Any]:
    """Run the probe in a container of `image` on the engine's host; save and return its record."""
    if backend == "cuda":
        cmd = ["specbench-probe-cuda", str(size_mib or 1024), str(repetitions or 20)]
        extra = {"device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]}
    else:
        cmd = ["specbench-probe", str(size_mib or 256), str(repetitions or 10)]
        extra = {}
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
    p = _path(manifest_name, engine.name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=2) + "\n")
    return record


def latest(manifest_name: str, host: str) -> dict[str, Any] | None:
    p = _path(manifest_name, host)
    return json.loads(p.read_text()) if p.exists() else None
