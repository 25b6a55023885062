"""`invoke probe`: measure the memory bandwidth of a host inside the kit's image (STREAM-like triad on the CPU,
a device-to-device copy on CUDA, a tensor copy through llama.cpp's own backend (ggml) on a Vulkan device). The
physics check uses the measured figure instead of the spec sheet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from harness import LABEL_PREFIX, KitError
from harness.files import now_iso, safe_name
from harness.hosts import devices
from harness.hosts.devices import Access, access_from_nodes
from harness.hosts.engine import Engine
from harness.image import backends
from harness.image.source import CACHE
from harness.intake.manifest import Manifest
from harness.store.buildrecord import BuildRecord


class _ProbeRecordRequired(TypedDict):
    host: str
    gbs: float
    kind: str  # cpu-stream, cuda-copy, ggml-copy
    measured_at: str
    image: str
    raw: dict[str, float | int | str]  # the probe program's own line


class ProbeRecord(_ProbeRecordRequired, total=False):
    """What `invoke probe` saves and a run reads back (run.json keeps it as `bandwidth`, runmeta.MeasuredBandwidth)."""

    device: str  # the device llama.cpp's backend measured, where it says


def _path(manifest_name: str, host: str) -> Path:
    return CACHE / "probe" / f"{manifest_name}-{safe_name(host)}.json"


def measure(engine: Engine, image: str, backend: str, manifest_name: str, size_mib: int | None = None,
            repetitions: int | None = None, access: Access | None = None) -> ProbeRecord:
    """Run the probe in a container of `image` on the engine's host, with the devices a run's containers get
    (harness/hosts/devices.py); save and return its record."""
    row = backends.get(backend)
    cmd = [row.probe.program, str(size_mib or row.probe.size_mib), str(repetitions or row.probe.repetitions)]
    done = engine.run_container(image, cmd, {f"{LABEL_PREFIX}.role": "probe"},
                                access=access or access_from_nodes(row, []))
    if done.exit_code != 0:
        raise KitError(f"probe failed on {engine.name}: {done.stderr.strip()[-300:]}")
    line = done.stdout.strip().splitlines()[-1]
    raw = json.loads(line)
    gbs = raw["triad_gbs"] if raw["kind"] == "cpu-stream" else raw["copy_gbs"]
    record = ProbeRecord(host=engine.name, gbs=gbs, kind=raw["kind"], measured_at=now_iso(), image=image, raw=raw)
    if raw.get("description"):  # the device llama.cpp's backend measured
        record["device"] = f"{raw['device']} ({raw['description']})"
    p = _path(manifest_name, engine.name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=2) + "\n")
    return record


def probe_host(engine: Engine, manifest: Manifest, record: BuildRecord, size_mib: int | None = None) -> ProbeRecord:
    """`invoke probe` on one host: the image of the build record, with the device a run would use (a GPU backend's
    devices set up as for a run: harness/hosts/devices.py)."""
    backend = record.backend
    acc = None
    if backends.get(backend).gpu:
        s = devices.setup(engine, backends.get(backend), record.tag, manifest.hardware.software_device)
        if s.problem:
            raise KitError(f"{engine.name}: {s.problem}")
        acc = s.access
    return measure(engine, record.tag, backend, manifest.name, size_mib, access=acc)


def latest(manifest_name: str, host: str) -> ProbeRecord | None:
    p = _path(manifest_name, host)
    return json.loads(p.read_text()) if p.exists() else None
