"""`invoke probe`: measure the memory bandwidth of a host inside the kit's image (STREAM-like triad on the CPU,
a device-to-device copy on CUDA). The physics check uses the measured figure instead of the spec sheet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import LABEL_PREFIX, KitError
from harness.files import now_iso, safe_name
from harness.hosts.engine import Engine
from harness.image.source import CACHE


def _path(manifest_name: str, host: str) -> Path:
    return CACHE / "probe" / f"{manifest_name}-{safe_name(host)}.json"


def measure(engine: Engine, image: str, backend: str, manifest_name: str, size_mib: int | None = None,
        repetitions: int | None = None) -> dict[str, Any]:
    """Run the probe in a container of `image` on the engine's host; save and return its record."""
    if backend == "cuda":
        cmd = ["specbench-probe-cuda", str(size_mib or 1024), str(repetitions or 20)]
    else:
        cmd = ["specbench-probe", str(size_mib or 256), str(repetitions or 10)]
    done = engine.run_container(image, cmd, {f"{LABEL_PREFIX}.role": "probe"}, gpu=backend == "cuda")
    if done.exit_code != 0:
        raise KitError(f"probe failed on {engine.name}: {done.stderr.strip()[-300:]}")
    line = done.stdout.strip().splitlines()[-1]
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
