"""Registry-free CUDA base images: NVIDIA's CUDA 13.0.1 toolkit wheels from PyPI (sha256-pinned below) laid out
like the nvidia/cuda devel and runtime images, on top of the debootstrap Debian bases (harness/image/bases.py).

Used where `nvidia/cuda:13.0.1-*` cannot be pulled (no registry, CI): `invoke build --backend cuda --base offline`.
The devel base has /usr/local/cuda with nvcc, ptxas, nvlink, fatbinary, cudafe++, nvvm/cicc, the headers (CCCL
under include/cccl as in CUDA 13), the libraries with their unversioned links and a libcuda.so link stub under
lib64/stubs; the runtime base only cudart, cuBLAS and cuBLASLt. Neither has a driver: libcuda.so.1 comes from the
host through the NVIDIA container runtime."""

from __future__ import annotations

import hashlib
import io
import json
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from harness import DOCKER, LABEL_PREFIX, ROOT, KitError
from harness import formatter as fm
from harness.files import file_sha256
from harness.hosts.engine import Engine, EngineRefused
from harness.image import bases
from harness.image.recipe import CUDA_BASE, CUDA_RUNTIME

#: The release of the nvidia/cuda:13.0.1 images harness/image/recipe.py names; PyPI's cuda-toolkit==13.0.1 meta-package
#: pins exactly these component versions.
CUDA_RELEASE = "13.0.1"
PREFIX = "/usr/local/cuda-13.0"
CACHE = ROOT / ".cache" / "cuda-wheels"
BASE_DIR = DOCKER / "base"
RECIPE = ("cuda-devel.Dockerfile", "cuda-devel.sh", "cuda-runtime.Dockerfile")
REGISTRY_RECIPE = "cuda-registry-devel.Dockerfile"
#: Bump when the wheel-to-toolkit layout below changes (it is code, not a recipe file).
LAYOUT_VERSION = 1
#: Docker engine architecture -> the names images and wheels use.
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: what PyPI serves under this exact file name and sha256."""

    package: str
    version: str
    filename: str
    sha256: str
    size: int

    def platforms(self) -> list[str]:
        """The platform tags in the file name (pip download --platform needs each one it should accept)."""
        return self.filename.removesuffix(".whl").split("-")[-1].split(".")


def _w(package: str, version: str, platform: str, sha256: str, size: int) -> Wheel:
    return Wheel(package, version, f"{package.replace('-', '_')}-{version}-py3-none-{platform}.whl", sha256, size)


_M2014_X86 = "manylinux2014_x86_64.manylinux_2_17_x86_64"
_M2014_ARM = "manylinux2014_aarch64.manylinux_2_17_aarch64"

#: The CUDA 13.0.1 components, per architecture (versions from cuda-toolkit==13.0.1; sha256 as PyPI lists them).
WHEELS: dict[str, tuple[Wheel, ...]] = {
    "amd64": (
        _w("nvidia-cuda-nvcc", "13.0.88", _M2014_X86,
           "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03", 37384532),
        _w("nvidia-cuda-crt", "13.0.88", _M2014_X86,
           "2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4", 134086),
        _w("nvidia-nvvm", "13.0.88", "manylinux2010_x86_64.manylinux_2_12_x86_64",
           "c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0", 61601415),
        _w("nvidia-cuda-runtime", "13.0.88", _M2014_X86,
           "422a38f7c739ecbdd3a4b6ec7ed0a1d74db43d8e9bc26685f3d845638922b178", 2243181),
        _w("nvidia-cuda-cccl", "13.0.85", _M2014_X86,
           "e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649", 3120526),
        _w("nvidia-cublas", "13.0.2.14", "manylinux_2_27_x86_64",
           "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c", 420882912),
    ),
    "arm64": (
        _w("nvidia-cuda-nvcc", "13.0.88", _M2014_ARM,
           "c7ff28f86a24effdc6c034fa15230c549a273e4771b10a7fec14996f8cf3307f", 32455430),
        _w("nvidia-cuda-crt", "13.0.88", _M2014_ARM,
           "ee2ea2a97073e02ee62bb27841f437332be2c248e3eac013df07997ada39c003", 134086),
        _w("nvidia-nvvm", "13.0.88", _M2014_ARM,
           "c4376a291d72d22a315d9d2f69bdae8f8cd83a627f75bad395cee49a0fe65dc1", 59234185),
        _w("nvidia-cuda-runtime", "13.0.88", _M2014_ARM,
           "8ba16a33998ee3ee2bf11c8f13e36e3ff86a1d6ad165ffeee863d6eabd0b5f67", 2259852),
        _w("nvidia-cuda-cccl", "13.0.85", _M2014_ARM,
           "6f0203e29fed809ee2b7fe9b1344df66ecab990c37d6a2e0e189b26d6c97ed7c", 3120528),
        _w("nvidia-cublas", "13.0.2.14", "manylinux_2_27_aarch64",
           "17165c296de689662b96e0ef4f21dfbff3092ff00d0e3e59470f5acb08c0f87d", 540253486),
    ),
}


def arch_of(engine: Engine) -> str:
    """The engine's architecture as image and wheel names say it: amd64 or arm64."""
    raw = engine.architecture()
    if raw not in ARCHES:
        raise KitError(f"cuda base: the Docker engine reports architecture {raw!r}; CUDA wheels exist for "
                       f"{sorted(set(ARCHES))}")
    return ARCHES[raw]


def _wheels(arch: str) -> tuple[Wheel, ...]:
    if arch not in WHEELS:
        raise KitError(f"cuda base: architecture {arch!r} is not one of {sorted(WHEELS)}")
    return WHEELS[arch]


def recipe_sha256(arch: str, debian: bases.BaseImages | None = None) -> str:
    """Hash of everything that decides the bases: recipe files, layout version, wheel pins, Debian base tags."""
    debian = debian or bases.planned(arch)
    h = hashlib.sha256(f"layout {LAYOUT_VERSION} prefix {PREFIX} release {CUDA_RELEASE}\n".encode())
    for name in RECIPE:
        h.update(name.encode() + b"\0" + (BASE_DIR / name).read_bytes())
    for w in _wheels(arch):
        h.update(f"{w.filename} {w.sha256}\n".encode())
    h.update(f"{debian.builder} {debian.runtime}\n".encode())
    return h.hexdigest()


def tags(arch: str, debian: bases.BaseImages | None = None) -> bases.BaseImages:
    """The devel and runtime base tags for this architecture (what `ensure` makes), without making anything."""
    digest = recipe_sha256(arch, debian)[:12]
    return bases.BaseImages(f"{LABEL_PREFIX}/base-cuda-devel:{CUDA_RELEASE}-{arch}-{digest}",
                           f"{LABEL_PREFIX}/base-cuda-runtime:{CUDA_RELEASE}-{arch}-{digest}",
                           f"registry-free CUDA {CUDA_RELEASE} bases from PyPI wheels on Debian ({arch})")


def planned(offline: bool, machine: str | None = None) -> bases.BaseImages:
    """The bases `ensure` (offline) or `ensure_registry` would make on an engine of this machine's architecture,
    made nowhere (for `invoke build --plan`)."""
    raw = machine or platform.machine()
    if raw not in ARCHES:
        raise KitError(f"cuda base: this machine's architecture {raw!r} has no CUDA wheels ({sorted(set(ARCHES))})")
    return tags(ARCHES[raw]) if offline else registry_tags()


# ---------------------------------------------------------------- wheels


def download(arch: str, log: Callable[[str], None] = print, cache: Path = CACHE) -> list[Path]:
    """The pinned wheels for `arch` in the kit's cache, fetched with pip where missing; every file sha256-checked."""
    wheels = _wheels(arch)
    folder = cache / arch
    folder.mkdir(parents=True, exist_ok=True)
    missing = [w for w in wheels if not (folder / w.filename).is_file()]
    if missing:
        total = sum(w.size for w in missing) / 1e6
        log(f"cuda base: downloading {len(missing)} CUDA {CUDA_RELEASE} wheel(s) for {arch} ({fm.num(total, 0)} MB)")
        with tempfile.TemporaryDirectory(prefix="cuda-wheels-", dir=folder) as tmp:
            req = Path(tmp) / "requirements.txt"
            # --hash makes pip itself refuse a file with another sha256 (hash-checking mode).
            req.write_text("".join(f"{w.package}=={w.version} --hash=sha256:{w.sha256}\n" for w in missing))
            platforms = sorted({p for w in missing for p in w.platforms()})
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "--dest", tmp, "-r", str(req)]
            for p in platforms:
                cmd += ["--platform", p]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])
                raise KitError(f"cuda base: pip download of the CUDA wheels failed (exit {proc.returncode}): {tail}")
            for w in missing:
                got = Path(tmp) / w.filename
                if not got.is_file():
                    raise KitError(f"cuda base: pip did not deliver {w.filename}")
                got.rename(folder / w.filename)
    paths = []
    for w in wheels:
        p = folder / w.filename
        actual = file_sha256(p)
        if actual != w.sha256:
            p.unlink()
            raise KitError(f"cuda base: {p} has sha256 {actual}, the kit pins {w.sha256}; removed it, "
                           "run again to download it anew")
        paths.append(p)
    return paths


def toolkit_path(package: str, member: str) -> str | None:
    """Where a wheel member goes under the toolkit prefix (None: not part of the toolkit).

    The wheels share one tree, nvidia/cu13/{bin,include,lib,nvvm}; nvidia/cuda's images have lib64/ and keep
    libnvvm and nvvm.h under nvvm/."""
    top = "nvidia/cu13/"
    if not member.startswith(top) or member.endswith("/"):
        return None
    rel = member[len(top):]
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] == ".metadata":
        return None
    if package == "nvidia-nvvm" and parts[0] == "lib":
        return "nvvm/lib64/" + "/".join(parts[1:])
    if package == "nvidia-nvvm" and rel == "include/nvvm.h":
        return "nvvm/include/nvvm.h"
    if parts[0] == "lib":
        return "lib64/" + "/".join(parts[1:])
    if parts[0] in ("bin", "include", "nvvm"):
        return rel
    return None


def _toolkit_members(wheels: list[Path]) -> Iterator[tuple[str, zipfile.ZipFile, zipfile.ZipInfo, int]]:
    by_name = {w.filename: w for ws in WHEELS.values() for w in ws}
    seen: set[str] = set()
    for path in wheels:
        pin = by_name[path.name]
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                dest = toolkit_path(pin.package, info.filename)
                if dest is None or info.is_dir():
                    continue
                if dest in seen:
                    raise KitError(f"cuda base: {dest} comes from two wheels ({path.name})")
                seen.add(dest)
                # Keep only whether the file is executable: wheels carry odd modes (0744, 0664).
                mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
                yield dest, zf, info, mode


def _normalised(ti: tarfile.TarInfo, mode: int) -> tarfile.TarInfo:
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 0
    ti.mode = mode
    return ti


def write_devel_context(wheels: list[Path], out: io.BufferedIOBase, versions: dict) -> int:
    """The devel base's build context as a tar stream: its Dockerfile and script, and the toolkit tree under
    cuda/ straight from the wheels (nothing unpacked on disk). Returns the number of toolkit files."""
    n = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, arc in (("cuda-devel.Dockerfile", "Dockerfile"), ("cuda-devel.sh", "cuda-devel.sh")):
            _add_bytes(tf, arc, (BASE_DIR / name).read_bytes(), 0o644)
        _add_bytes(tf, "cuda/version.json", (json.dumps(versions, indent=2) + "\n").encode(), 0o644)
        for dest, zf, info, mode in _toolkit_members(wheels):
            ti = _normalised(tarfile.TarInfo(f"cuda/{dest}"), mode)
            ti.size = info.file_size
            with zf.open(info) as src:
                tf.addfile(ti, src)
            n += 1
    return n


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    ti = _normalised(tarfile.TarInfo(name), mode)
    ti.size = len(data)
    tf.addfile(ti, io.BytesIO(data))


def version_json(arch: str) -> dict:
    """/usr/local/cuda/version.json in the shape of NVIDIA's, naming the wheels each component came from."""
    out: dict = {"cuda": {"name": "CUDA SDK", "version": CUDA_RELEASE}}
    for w in _wheels(arch):
        out[w.package.removeprefix("nvidia-").replace("-", "_")] = {
            "name": w.package, "version": w.version, "wheel": w.filename, "sha256": w.sha256}
    return out


# ---------------------------------------------------------------- images


def _build(engine: Engine, ctx: io.BufferedIOBase, tag: str, buildargs: dict[str, str],
           labels: dict[str, str], log: Callable[[str], None], network_mode: str = "none",
           nocache: bool = False) -> None:
    last: list[str] = []
    try:
        for chunk in engine.build_image(ctx, tag, buildargs=buildargs, labels=labels, network=network_mode,
                                        nocache=nocache):
            for line in chunk.get("stream", "").splitlines():
                last = (last + [line])[-12:]
                if line.startswith(("cuda-devel.sh:", "cmake version", "g++", "Build cuda_")):
                    log(f"  {line}")
            if "error" in chunk or "errorDetail" in chunk:
                msg = (chunk.get("error") or chunk["errorDetail"].get("message", "")).strip()
                raise KitError(f"cuda base {tag}: build failed: {msg} | " + " | ".join(last[-4:]))
    except EngineRefused as e:
        raise KitError(f"cuda base {tag}: build failed: {e}") from None
    if engine.image(tag) is None:
        raise KitError(f"cuda base: the build finished without tagging {tag}")


def registry_tags(devel: str | None = None) -> bases.BaseImages:
    """The registry path's bases: nvidia/cuda devel with CMake added (made by `ensure_registry`), and the
    nvidia/cuda runtime image as it is (it carries cudart, cuBLAS and cuBLASLt). No architecture in the tag:
    nvidia/cuda is multi-platform, so `--plan` on a laptop names what a Spark builds."""

    devel = devel or CUDA_BASE
    h = hashlib.sha256((BASE_DIR / REGISTRY_RECIPE).read_bytes() + f"\0{devel}".encode())
    return bases.BaseImages(f"{LABEL_PREFIX}/base-cuda-registry-devel:{CUDA_RELEASE}-{h.hexdigest()[:12]}",
                           CUDA_RUNTIME, f"NVIDIA CUDA devel/runtime images ({devel} with CMake added)",
                           registry_free=False)


def ensure_registry(engine: Engine, log: Callable[[str], None] = print,
                    devel: str | None = None) -> bases.BaseImages:
    """Make (or reuse) nvidia/cuda's devel image with CMake and build tools, pulling it and the packages with the
    network (the llama.cpp build that follows has none). `devel` replaces the nvidia/cuda image (tests)."""

    want = registry_tags(devel)
    if engine.image(want.builder) is not None:
        return replace(want, reason=want.reason + ", already made")
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tf:
        _add_bytes(tf, "Dockerfile", (BASE_DIR / REGISTRY_RECIPE).read_bytes(), 0o644)
    ctx.seek(0)
    log(f"cuda base: making {want.builder} from {devel or CUDA_BASE} (pulls it; installs CMake with apt)")
    _build(engine, ctx, want.builder, {"CUDA_DEVEL": devel or CUDA_BASE},
           {f"{LABEL_PREFIX}.base": "cuda-registry-devel", f"{LABEL_PREFIX}.cuda-release": CUDA_RELEASE}, log,
           network_mode="host")
    return replace(want, reason=want.reason + " (made now)")


def ensure(engine: Engine, log: Callable[[str], None] = print, arch: str | None = None,
           cache: Path = CACHE, force: bool = False) -> bases.BaseImages:
    """Make (or reuse) the offline CUDA devel and runtime bases for the engine's architecture; return their tags.

    Makes the Debian bases first (harness/image/bases.py), downloads the pinned wheels into the kit's cache, and builds
    both images with network_mode none: nothing inside `docker build` reaches the network. force: make both
    anew, without the engine's build cache."""

    arch = arch or arch_of(engine)
    debian = bases.ensure(engine, log)
    builder = engine.image(debian.builder)
    debian_arch = ARCHES.get(str(builder.architecture if builder else None), "?")
    if debian_arch != arch:
        # debootstrap makes the Debian bases for the machine that runs the kit, not for a remote engine.
        raise KitError(f"cuda base: the Debian base {debian.builder} is {debian_arch} but the engine is {arch}; "
                       "make the offline bases on a machine of the engine's architecture (run the kit there)")
    want = tags(arch, debian)
    have = {t: not force and engine.image(t) is not None for t in (want.builder, want.runtime)}
    if all(have.values()):
        return bases.BaseImages(want.builder, want.runtime, want.reason + ", already made")
    recipe = recipe_sha256(arch, debian)
    labels = {f"{LABEL_PREFIX}.cuda-release": CUDA_RELEASE, f"{LABEL_PREFIX}.cuda-platform": f"linux/{arch}",
              f"{LABEL_PREFIX}.cuda-recipe-sha256": recipe,
              f"{LABEL_PREFIX}.cuda-wheels": " ".join(f"{w.package}=={w.version}" for w in _wheels(arch))}
    if not have[want.builder]:
        wheels = download(arch, log, cache)
        started = time.monotonic()
        with tempfile.TemporaryFile() as ctx:
            n = write_devel_context(wheels, ctx, version_json(arch))
            log(f"cuda base: making {want.builder} ({n} toolkit files, context {fm.num(ctx.tell() / 1e6, 0)} MB)")
            ctx.seek(0)
            _build(engine, ctx, want.builder, {"DEBIAN_BUILDER": debian.builder}, {**labels,
                   f"{LABEL_PREFIX}.base": "cuda-devel"}, log, nocache=force)
        log(f"cuda base: made {want.builder} in {fm.fixed(time.monotonic() - started, 0)} s")
    if not have[want.runtime]:
        ctx = io.BytesIO()
        with tarfile.open(fileobj=ctx, mode="w") as tf:
            _add_bytes(tf, "Dockerfile", (BASE_DIR / "cuda-runtime.Dockerfile").read_bytes(), 0o644)
        ctx.seek(0)
        log(f"cuda base: making {want.runtime}")
        _build(engine, ctx, want.runtime, {"CUDA_DEVEL": want.builder, "DEBIAN_RUNTIME": debian.runtime},
               {**labels, f"{LABEL_PREFIX}.base": "cuda-runtime"}, log, nocache=force)
    return bases.BaseImages(want.builder, want.runtime, want.reason + " (made now)")
