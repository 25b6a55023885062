"""`invoke build`: resolve the manifest's llama.cpp source into a build context, render the build plan,
and build the image (or reuse it when source, flags and recipe are unchanged)."""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness import KitError, schema
from harness import formatter as fm
from harness.files import safe_name
from harness.formatter import console
from harness.hosts.engine import Engine, EngineRefused, Image
from harness.image import backends, bases, cuda_base, cuda_image, images, vulkan_image
from harness.image.recipe import DEVICE_DIR, DOCKERFILE, PROBE_DIR, BuildPlan, build_plan
from harness.image.source import CACHE, SourceTree, context_files, resolve_source
from harness.intake.manifest import Manifest
from harness.intake.trust import Trusted
from harness.store.buildrecord import BuildRecord


def write_context(source: SourceTree, out: io.BufferedIOBase) -> int:
    """Write the build context (Dockerfile, probe/, device/, llama.cpp/) as a tar stream; return the number of
    files."""

    def normalise(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        # Fixed owner and time: the same tree gives the same context bytes.
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.mtime = 0
        return ti

    n = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(DOCKERFILE, "Dockerfile", filter=normalise)
        for p in sorted(PROBE_DIR.iterdir()):
            tf.add(p, f"probe/{p.name}", filter=normalise)
        for p in sorted(DEVICE_DIR.iterdir()):
            tf.add(p, f"device/{p.name}", filter=normalise)
        for rel, full in context_files(source.path):
            tf.add(full, f"llama.cpp/{rel}", recursive=False, filter=normalise)
            n += 1
    return n


def _condense(line: str) -> str | None:
    """Keep the build log lines a person wants to see: steps, cmake's progress every ~10%, errors."""
    s = line.rstrip()
    if not s:
        return None
    if s.startswith("Step ") and " : LABEL " in s:
        return None  # the identity labels: `invoke build --plan` shows them
    if s.startswith("Step ") or s.startswith("specbench:") or "error" in s.lower() or "warning: " in s.lower():
        return s
    if s.startswith("[") and "%]" in s[:8]:
        return s if "Built target" in s else None
    if s.startswith("-- The") or s.startswith("-- Build files") or s.startswith("Successfully"):
        return s
    return None


def _docker_build(engine: Engine, p: BuildPlan, source: SourceTree, force: bool, jobs: int | None,
                  log: Callable[[str], None], cpu_shares: int | None = None) -> Image:
    """Send the context and build the image, showing the condensed log; the built image or one error."""
    log(f"build: building {p.tag} (llama.cpp b{source.build_number}, {source.kind}); this takes minutes")
    buildargs = dict(p.build_args)
    if jobs:
        buildargs["BUILD_JOBS"] = str(jobs)
    last_lines: list[str] = []
    image_id = None
    with tempfile.TemporaryFile() as ctx:
        n = write_context(source, ctx)
        log(f"build: context {n} files, {fm.fixed(ctx.tell() / 1e6, 0)} MB")
        ctx.seek(0)
        try:
            stream = engine.build_image(ctx, p.tag, buildargs=buildargs, labels=p.labels, network="none",
                                        nocache=force, cpu_shares=cpu_shares)
            for chunk in stream:
                for line in chunk.get("stream", "").splitlines():
                    last_lines = (last_lines + [line])[-25:]
                    shown = _condense(line)
                    if shown:
                        log(f"  {console(shown)}")
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
                if "error" in chunk or "errorDetail" in chunk:
                    msg = chunk.get("error") or chunk["errorDetail"].get("message", "")
                    tail = "\n".join("    " + x for x in last_lines[-15:])
                    raise KitError(f"build failed: {msg.strip()}\n  last log lines:\n{tail}")
        except EngineRefused as e:
            raise KitError(f"build failed: {e}") from None
    built = engine.image(p.tag)
    if built is None:
        raise KitError(f"build finished without tagging {p.tag} (image {image_id})")
    return built


def build(engine: Engine, trusted: Trusted, *, backend: str | None = None, force: bool = False,
          prefer: str | None = None, log: Callable[[str], None] = print, host: str | None = None,
          jobs: int | None = None, offline_base: bool = False, cpu_shares: int | None = None) -> BuildRecord:
    """Build (or reuse) the image for a trusted manifest on an engine; return the build record (also written
    under .cache/builds).

    An image already on the engine with the same identity (source, flags, backend, bases, recipe, architecture) is
    reused whichever manifest or host asked for it (harness/image/images.py), without fetching the source. The
    manifest comes with the task's trust decision (harness/intake/trust.py: a source other than the official
    llama.cpp one, a custom base image or CMake flags beyond feature switches need the user's word). offline_base:
    for the cuda backend, build on bases made here from PyPI's CUDA wheels instead of nvidia/cuda. cpu_shares: the
    build containers' CPU weight (1024 is normal; lower yields to other work on a shared machine)."""
    manifest = trusted.manifest
    host = host or engine.name
    backend = backend or manifest.build.backend
    arch = bases.engine_arch(engine)
    if not force and images.identity_known(manifest, prefer):
        found = images.find(engine, manifest, backend, prefer=prefer, arch=arch)
        if found is not None:
            log(f"build: {found.tag} is on {host} already (same source, flags, backend, bases and recipe)")
            return images.record_of(engine, found, host)
    made = None
    row = backends.get(backend)
    if row.debian is not None and not manifest.build.base_image:
        made = bases.ensure(engine, log, backend=backend)  # before the source is fetched or anything is sent
    elif not manifest.build.base_image:  # NVIDIA's CUDA bases
        made = cuda_base.ensure(engine, log) if offline_base else cuda_base.ensure_registry(engine, log)
    source = resolve_source(manifest, log, prefer)
    p = build_plan(manifest, source, backend, made, arch)
    log(f"build: base {p.base_image} / runtime {p.runtime_image}: {p.base_reason}")
    existing = engine.image(p.tag)
    reused = existing is not None and not force
    started = time.monotonic()
    if not reused:
        existing = _docker_build(engine, p, source, force, jobs, log, cpu_shares)
    cuda_checks = vulkan_checks = None
    if row.image_check == backends.VULKAN_CHECK:
        version = images.version_of(engine, p.tag)
        if not reused:  # the backend loads and lists a device: on a host without a GPU, the software one
            report = vulkan_image.inspect(engine, p.tag)
            vulkan_checks = report.as_dict()
            for line in report.lines():
                log(f"build: Vulkan check: {line}")
            if not report.ok:
                raise KitError(f"build: the Vulkan image {p.tag} fails its check: {report.problems[0]}")
    elif row.image_check == backends.CUDA_CHECK:
        version = cuda_image.server_version(engine, p.tag)  # "no NVIDIA driver: ..." where the host has none
        if not reused:  # libraries resolve (but the driver's), cuBLAS is there: no GPU needed
            cuda_checks = cuda_image.inspect(engine, p.tag).as_dict()
            for line in cuda_checks["problems"] or ["libraries resolve except the driver's libcuda.so.1"]:
                log(f"build: CUDA check: {line}")
    else:
        version = images.version_of(engine, p.tag)
    record = BuildRecord(
        tag=p.tag, image_id=existing.id, reused=reused, built_at=existing.created,
        build_seconds=None if reused else fm.rounded(time.monotonic() - started, 1), host=host,
        server_version=version, plan=p.as_dict(), vulkan_checks=vulkan_checks,
        cuda_checks=None if cuda_checks is None else
        {k: cuda_checks[k] for k in ("ok", "problems", "size_bytes", "cuda_libraries")})
    schema.check("build", record.to_json(), "build record")
    images.remember(record)
    out = CACHE / "builds"
    out.mkdir(parents=True, exist_ok=True)
    record.write(out / f"{p.tag.split(':')[-1]}-{safe_name(host)}.json")
    record.write(latest_path(manifest, backend, host))
    return record


def latest_path(manifest: Manifest, backend: str | None = None, host: str = "local") -> Path:
    suffix = "" if host == "local" else f"-{safe_name(host)}"
    return CACHE / "builds" / f"{manifest.name}-{backend or manifest.build.backend}{suffix}-latest.json"


def latest_record(manifest: Manifest, backend: str | None = None, host: str = "local") -> BuildRecord | None:
    """The last build record for this manifest, backend and host, if any."""
    path = latest_path(manifest, backend, host)
    return BuildRecord.from_json(json.loads(path.read_text()), str(path)) if path.exists() else None
