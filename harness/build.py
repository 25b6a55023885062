"""`invoke build`: resolve the manifest's llama.cpp source into a build context, render the build plan,
and build the image (or reuse it when source, flags and recipe are unchanged)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker.errors

import docker
from harness import DOCKER, LABEL_PREFIX, KitError, __version__, bases, preflight, schema, trust
from harness.files import atomic_write_text, safe_name
from harness.manifest import Manifest
from harness.schema import FORMAT_VERSIONS
from harness.source import CACHE, SourceTree, context_files, resolve_source

DOCKERFILE = DOCKER / "Dockerfile"
PROBE_DIR = DOCKER / "probe"
CUDA_BASE = "nvidia/cuda:13.0.1-devel-ubuntu24.04"
CUDA_RUNTIME = "nvidia/cuda:13.0.1-runtime-ubuntu24.04"

#: Flags that keep CMake from reaching the network and make a portable binary.
COMMON_CMAKE = (
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
)
#: Top-level folders of the llama.cpp tree the build does not need (vocab test files alone are 75 MB).
CONTEXT_EXCLUDES = {"models", "media", ".git", ".github", "docs", "build"}


@dataclass
class BuildPlan:
    backend: str
    base_image: str
    runtime_image: str
    base_reason: str
    cmake_args: list[str]
    build_args: dict[str, str]
    labels: dict[str, str]
    tag: str
    source: dict[str, Any]
    dockerfile_sha256: str
    registry_free: bool = False
    notes: list[str] = field(default_factory=list)
    arch: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- plan


def cmake_args(manifest: Manifest, backend: str, source: SourceTree) -> list[str]:
    args = list(COMMON_CMAKE)
    if backend == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={manifest.build.cuda_architectures}",
                 # libcuda.so comes from the driver at run time; link against the toolkit's stub.
                 "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"]
    args += [f"-DLLAMA_BUILD_NUMBER={source.build_number}", f"-DLLAMA_BUILD_COMMIT={source.commit}"]
    args += list(manifest.build.cmake_args)
    return args


def _recipe_sha256() -> str:
    h = hashlib.sha256(DOCKERFILE.read_bytes())
    for p in sorted(PROBE_DIR.iterdir()):
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()


def plan(manifest: Manifest, source: SourceTree, backend: str | None = None,
         made: bases.BaseImages | None = None, arch: str | None = None) -> BuildPlan:
    """Render what would be built: base images, build args, CMake flags, labels and the derived tag.

    arch: the target engine's architecture (default: this machine's); it is part of the identity."""
    backend = backend or manifest.build.backend
    arch = arch or bases.local_arch()
    notes: list[str] = []
    registry_free = False
    if manifest.build.base_image:
        base_image = manifest.build.base_image
        runtime_image = manifest.build.runtime_image or base_image
        reason = "from the manifest's build.base_image/runtime_image"
    elif backend == "cuda" and made is not None:
        # harness/cuda_base.py: nvidia/cuda devel with CMake added, or (`--base offline`) the toolkit from PyPI wheels.
        registry_free = made.registry_free
        base_image, runtime_image, reason = made.builder, made.runtime, made.reason
    elif backend == "cuda":
        base_image, runtime_image = CUDA_BASE, CUDA_RUNTIME
        reason = "NVIDIA CUDA devel/runtime images (the toolkit cannot be made without a registry)"
    else:
        made = made or bases.planned(arch)
        base_image, runtime_image, reason = made.builder, made.runtime, made.reason
        registry_free = "-registry-" not in base_image
    flags = cmake_args(manifest, backend, source)
    recipe = _recipe_sha256()
    key = json.dumps({"source": source.key, "backend": backend, "cmake": flags, "base": base_image,
                      "runtime": runtime_image, "recipe": recipe, "arch": manifest.build.cuda_architectures,
                      "platform": arch},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    tag = f"{LABEL_PREFIX}/llama-server:{backend}-b{source.build_number}-{digest}"
    build_args = {
        "BASE_IMAGE": base_image,
        "RUNTIME_IMAGE": runtime_image,
        "BACKEND": backend,
        "CUDA_ARCHITECTURES": manifest.build.cuda_architectures,
        "CMAKE_ARGS": " ".join(flags),
    }
    labels = {
        f"{LABEL_PREFIX}.kit-version": __version__,
        f"{LABEL_PREFIX}.backend": backend,
        f"{LABEL_PREFIX}.source": source.key,
        f"{LABEL_PREFIX}.llama-build-number": str(source.build_number),
        f"{LABEL_PREFIX}.llama-commit": source.commit,
        f"{LABEL_PREFIX}.cmake-args": " ".join(flags),
        f"{LABEL_PREFIX}.cuda-architectures": manifest.build.cuda_architectures if backend == "cuda" else "",
        f"{LABEL_PREFIX}.base-image": base_image,
        f"{LABEL_PREFIX}.runtime-image": runtime_image,
        f"{LABEL_PREFIX}.recipe-sha256": recipe,
        f"{LABEL_PREFIX}.plan-key": digest,
        f"{LABEL_PREFIX}.arch": arch,
    }
    if (source.path / "src").is_dir():  # read from the source itself: what its loader knows (the pre-flight checks it)
        labels[f"{LABEL_PREFIX}.spec-flavours"] = preflight.flavour_label(preflight.supported_flavours(source.path))
    if backend == "cuda" and manifest.build.cuda_architectures == "121":
        notes.append("CUDA arch 121 is the GB10 (DGX Spark); it needs CUDA 12.9 or newer")
    p = BuildPlan(backend, base_image, runtime_image, reason, flags, build_args, labels, tag,
                  {"kind": source.kind, **source.identity, "build_number": source.build_number,
                   "commit": source.commit}, recipe, registry_free, notes, arch)
    # The whole plan rides on the image, so any engine's copy says what it is (harness/images.py reads it).
    p.labels[f"{LABEL_PREFIX}.plan"] = json.dumps({k: v for k, v in p.as_dict().items() if k != "labels"},
                                                  sort_keys=True)
    return p


# ---------------------------------------------------------------- context and build


def write_context(source: SourceTree, out: io.BufferedIOBase) -> int:
    """Write the build context (Dockerfile, probe/, llama.cpp/) as a tar stream; return the number of files."""

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
        for rel, full in context_files(source.path):
            tf.add(full, f"llama.cpp/{rel}", recursive=False, filter=normalise)
            n += 1
    return n


def image_for(client: docker.DockerClient, tag: str):
    try:
        return client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None


def version_of(client: docker.DockerClient, image: str) -> str:
    """What `llama-server --version` prints inside the image (it prints to stderr)."""
    ctr = client.containers.create(image, ["llama-server", "--version"], network_mode="none",
                                   labels={f"{LABEL_PREFIX}.role": "version"})
    try:
        ctr.start()
        ctr.wait(timeout=120)
        return ctr.logs(stdout=True, stderr=True).decode("utf-8", "replace").strip()
    finally:
        ctr.remove(force=True)


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


def _docker_build(client: docker.DockerClient, p: BuildPlan, source: SourceTree, force: bool, jobs: int | None,
                  log: Callable[[str], None], cpu_shares: int | None = None):
    """Send the context and build the image, showing the condensed log; the built image or one error."""
    log(f"build: building {p.tag} (llama.cpp b{source.build_number}, {source.kind}); this takes minutes")
    buildargs = dict(p.build_args)
    if jobs:
        buildargs["BUILD_JOBS"] = str(jobs)
    last_lines: list[str] = []
    image_id = None
    with tempfile.TemporaryFile() as ctx:
        n = write_context(source, ctx)
        log(f"build: context {n} files, {ctx.tell() / 1e6:.0f} MB")
        ctx.seek(0)
        try:
            stream = client.api.build(fileobj=ctx, custom_context=True, tag=p.tag, buildargs=buildargs,
                                      labels=p.labels, rm=True, forcerm=True, pull=False, decode=True,
                                      network_mode="none", nocache=force,
                                      container_limits={"cpushares": cpu_shares} if cpu_shares else None)
            for chunk in stream:
                for line in chunk.get("stream", "").splitlines():
                    last_lines = (last_lines + [line])[-25:]
                    shown = _condense(line)
                    if shown:
                        log(f"  {shown}")
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
                if "error" in chunk or "errorDetail" in chunk:
                    msg = chunk.get("error") or chunk["errorDetail"].get("message", "")
                    tail = "\n".join("    " + x for x in last_lines[-15:])
                    raise KitError(f"build failed: {msg.strip()}\n  last log lines:\n{tail}")
        except docker.errors.APIError as e:
            raise KitError(f"build failed: {e.explanation or e}") from None
    built = image_for(client, p.tag)
    if built is None:
        raise KitError(f"build finished without tagging {p.tag} (image {image_id})")
    return built


def build(target, manifest: Manifest, *, backend: str | None = None, force: bool = False,
          prefer: str | None = None, log: Callable[[str], None] = print, host: str | None = None,
          jobs: int | None = None, trust_source: bool = False, offline_base: bool = False,
          cpu_shares: int | None = None) -> dict[str, Any]:
    """Build (or reuse) the image for the manifest on an engine (or a Docker client, taken as the local engine);
    return the build record (also written under .cache/builds).

    An image already on the engine with the same identity (source, flags, backend, bases, recipe, architecture) is
    reused whichever manifest or host asked for it (harness/images.py), without fetching the source. A source other
    than the official llama.cpp one, a custom base image or CMake flags beyond feature switches are refused unless
    `trust_source` (harness/trust.py). offline_base: for the cuda backend, build on bases made here from PyPI's CUDA
    wheels instead of nvidia/cuda. cpu_shares: the build containers' CPU weight (1024 is normal; lower yields to
    other work on a shared machine)."""
    from harness import images
    from harness.engine import Engine, LocalEngine

    trust.require_trusted(manifest, trust_source)
    engine = target if isinstance(target, Engine) else LocalEngine(target)
    host = host or engine.name
    client = engine.client
    backend = backend or manifest.build.backend
    arch = bases.engine_arch(client)
    if not force and images.identity_known(manifest, prefer):
        found = images.find(client, manifest, backend, prefer=prefer, arch=arch)
        if found is not None:
            log(f"build: {found.tag} is on {host} already (same source, flags, backend, bases and recipe)")
            return images.record_of(client, found, host)
    made = None
    if backend == "cpu" and not manifest.build.base_image:
        made = bases.ensure(engine, log)  # before the source is fetched or anything is sent
    elif backend == "cuda" and not manifest.build.base_image:
        from harness import cuda_base

        made = cuda_base.ensure(engine, log) if offline_base else cuda_base.ensure_registry(client, log)
    source = resolve_source(manifest, log, prefer)
    p = plan(manifest, source, backend, made, arch)
    log(f"build: base {p.base_image} / runtime {p.runtime_image}: {p.base_reason}")
    existing = image_for(client, p.tag)
    reused = existing is not None and not force
    started = time.monotonic()
    if not reused:
        existing = _docker_build(client, p, source, force, jobs, log, cpu_shares)
    cuda_checks = None
    if backend == "cuda":
        from harness import cuda_image

        version = cuda_image.server_version(client, p.tag)  # "no NVIDIA driver: ..." where the host has none
        if not reused:  # libraries resolve (but the driver's), cuBLAS is there: no GPU needed
            cuda_checks = cuda_image.inspect(client, p.tag).as_dict()
            for line in cuda_checks["problems"] or ["libraries resolve except the driver's libcuda.so.1"]:
                log(f"build: CUDA check: {line}")
    else:
        version = version_of(client, p.tag)
    record = {
        "format_version": FORMAT_VERSIONS["build"],
        "tag": p.tag,
        "image_id": existing.id,
        "reused": reused,
        "built_at": existing.attrs.get("Created"),
        "build_seconds": None if reused else round(time.monotonic() - started, 1),
        "host": host,
        "server_version": version,
        "plan": p.as_dict(),
    }
    if cuda_checks is not None:
        record["cuda_checks"] = {k: cuda_checks[k] for k in ("ok", "problems", "size_bytes", "cuda_libraries")}
    schema.check("build", record, "build record")
    images.remember(record)
    out = CACHE / "builds"
    out.mkdir(parents=True, exist_ok=True)
    write_record(out / f"{p.tag.split(':')[-1]}-{safe_name(host)}.json", record)
    write_record(latest_path(manifest, backend, host), record)
    return record


def write_record(path: Path, record: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def latest_path(manifest: Manifest, backend: str | None = None, host: str = "local") -> Path:
    suffix = "" if host == "local" else f"-{safe_name(host)}"
    return CACHE / "builds" / f"{manifest.name}-{backend or manifest.build.backend}{suffix}-latest.json"


def latest_record(manifest: Manifest, backend: str | None = None, host: str = "local") -> dict[str, Any] | None:
    """The last build record for this manifest, backend and host, if any."""
    path = latest_path(manifest, backend, host)
    return json.loads(path.read_text()) if path.exists() else None
