"""Checks on a built CUDA image that need no GPU: every library of llama-server and of ggml's CUDA backend
resolves except the driver's libcuda.so.1; `llama-server --version` fails only because that driver is missing
(which the kit reports as "no NVIDIA driver"); and the image's labels, size and CUDA libraries."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast

from harness import LABEL_PREFIX, KitError
from harness import formatter as fm
from harness.hosts.devices import access_from_nodes
from harness.hosts.engine import Engine, EngineRefused, ImageMissing
from harness.image import backends

#: The driver's library: the NVIDIA container runtime mounts the host's copy; no image carries it.
DRIVER_LIBRARY = "libcuda.so.1"
NO_DRIVER = "no NVIDIA driver"
#: What the dynamic loader prints when a binary linked against the driver starts without it.
_LOADER_MISSING = re.compile(r"error while loading shared libraries: (\S+): cannot open shared object file")
_SECTION = re.compile(r"^## (\S+) ?(.*)$")

#: One shell run inside the image: ldd of the binaries and CUDA backend, the CUDA libraries, --version.
_SCRIPT = r"""
echo "## ldd /opt/llama/bin/llama-server"; ldd /opt/llama/bin/llama-server 2>&1
for f in $(find /opt/llama/lib -name 'libggml-cuda.so*' -type f); do echo "## ldd $f"; ldd "$f" 2>&1; done
echo "## libraries"
find / -xdev \( -name 'libcu*.so*' -o -name 'libnv*.so*' \) -type f -exec stat -c '%s %n' {} + 2>/dev/null
echo "## version"; llama-server --version 2>&1; echo "## exit $?"
"""


class LinkageJson(TypedDict):
    path: str
    resolved: dict[str, str]
    unresolved: list[str]


class CudaChecks(TypedDict):
    """The CUDA image's library check at build time (`CudaImageReport`)."""

    image: str
    size_bytes: int
    labels: dict[str, str]
    cuda_libraries: dict[str, int]
    linkage: list[LinkageJson]
    version_output: str
    version_exit: int
    problems: list[str]
    ok: bool
    driver_missing: bool


@dataclass
class Linkage:
    """What ldd says about one binary or library inside the image."""

    path: str
    resolved: dict[str, str]
    unresolved: list[str]


@dataclass
class CudaImageReport:
    """The no-GPU checks of one CUDA image."""

    image: str
    size_bytes: int
    labels: dict[str, str]
    cuda_libraries: dict[str, int]  # path in the image -> bytes
    linkage: list[Linkage]
    version_output: str
    version_exit: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def driver_missing(self) -> bool:
        return missing_driver(self.version_output) is not None

    def as_dict(self) -> CudaChecks:
        return cast(CudaChecks, {**asdict(self), "ok": self.ok, "driver_missing": self.driver_missing})

    def lines(self) -> list[str]:
        """The report as a person reads it: one line per fact."""
        label = self.labels.get
        out = [f"image {self.image}: {fm.num(self.size_bytes / 1e6, 0)} MB, "
               f"backend {label(f'{LABEL_PREFIX}.backend', '?')}, "
               f"base {label(f'{LABEL_PREFIX}.base-image')} / {label(f'{LABEL_PREFIX}.runtime-image')}"]
        for link in self.linkage:
            out.append(f"ldd {link.path}: {len(link.resolved)} resolved, unresolved: "
                       f"{', '.join(link.unresolved) or 'none'}")
        libs = ", ".join(f"{p.rsplit('/', 1)[-1]} ({fm.num(n / 1e6, 0)} MB)"
                         for p, n in sorted(self.cuda_libraries.items()))
        out.append(f"CUDA libraries: {libs or 'none'}")
        out.append(f"llama-server --version: {describe_version(self.version_output, self.version_exit)}")
        out += [f"PROBLEM: {p}" for p in self.problems]
        return out


def missing_driver(output: str) -> str | None:
    """The one line saying the NVIDIA driver is missing, if that is why a CUDA binary could not start."""
    m = _LOADER_MISSING.search(output)
    if m and m.group(1) == DRIVER_LIBRARY:
        return (f"{NO_DRIVER}: {DRIVER_LIBRARY} is not in the container (the NVIDIA container runtime mounts the "
                "host driver's copy when the container gets a GPU); run it with a GPU on a host with the driver")
    return None


def describe_version(output: str, exit_code: int) -> str:
    """`llama-server --version`'s outcome in one line: the version, "no NVIDIA driver: ...", or the failure."""
    no_driver = missing_driver(output)
    if no_driver:
        return no_driver
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    version = next((ln for ln in lines if ln.startswith("version:")), None)
    if exit_code == 0 and version:
        return version
    return f"failed (exit {exit_code}): {lines[-1] if lines else 'no output'}"


def _sections(text: str) -> list[tuple[str, str, list[str]]]:
    out: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            out.append((m.group(1), m.group(2), []))
        elif out:
            out[-1][2].append(line)
    return out


def _linkage(path: str, lines: list[str]) -> Linkage:
    resolved: dict[str, str] = {}
    unresolved: list[str] = []
    for line in lines:
        parts = line.strip().split(" => ")
        if len(parts) != 2:
            continue
        if parts[1].strip() == "not found":
            unresolved.append(parts[0].strip())
        else:
            resolved[parts[0].strip()] = parts[1].split(" (")[0].strip()
    return Linkage(path, resolved, unresolved)


def has_nvidia_runtime(engine: Engine) -> bool:
    """Whether the engine can give a container a GPU (the NVIDIA runtime, or CDI specs for it)."""
    info = engine.info()
    return "nvidia" in (info.get("Runtimes") or {}) or any("nvidia" in str(x) for x in info.get("CDISpecDirs") or [])


def _run(engine: Engine, image: str, command: list[str], gpu: bool) -> tuple[int, str]:
    try:
        done = engine.run_container(image, command, {f"{LABEL_PREFIX}.role": "cuda-check"},
                                    access=access_from_nodes(backends.get("cuda"), []) if gpu else None, entrypoint=[],
                                    timeout=300)
    except ImageMissing:
        raise KitError(f"image {image} is not in the engine; run `invoke build --backend cuda` first") from None
    except EngineRefused as e:
        what = " with a GPU" if gpu else ""
        raise KitError(f"cannot start a container of {image}{what}: {e}") from None
    return done.exit_code, done.text


def server_version(engine: Engine, image: str) -> str:
    """`llama-server --version` of a CUDA image, with the GPU where the engine has one; "no NVIDIA driver: ..."
    in place of the loader's error where it has none (so build records and `invoke doctor` say why)."""
    cmd = ["llama-server", "--version"]
    try:
        _, out = _run(engine, image, cmd, gpu=has_nvidia_runtime(engine))
    except KitError:
        _, out = _run(engine, image, cmd, gpu=False)  # a runtime without a usable GPU: say what is missing
    no_driver = missing_driver(out)
    return no_driver if no_driver else out.strip()


def inspect(engine: Engine, image: str, gpu: bool = False) -> CudaImageReport:
    """Run the no-GPU checks on a CUDA llama-server image (gpu=True also hands it the GPU)."""
    img = engine.image(image)
    if img is None:
        raise KitError(f"image {image} is not in the engine; run `invoke build --backend cuda` first")
    _, text = _run(engine, image, ["/bin/sh", "-c", _SCRIPT], gpu)
    linkage: list[Linkage] = []
    libraries: dict[str, int] = {}
    version_lines: list[str] = []
    version_exit = -1
    for name, arg, lines in _sections(text):
        if name == "ldd":
            linkage.append(_linkage(arg, lines))
        elif name == "libraries":
            for ln in lines:
                size, _, path = ln.partition(" ")
                if size.isdigit():
                    libraries[path] = int(size)
        elif name == "version":
            version_lines = lines
        elif name == "exit":
            version_exit = int(arg) if arg.isdigit() else -1
    report = CudaImageReport(image, img.size, dict(img.labels), libraries, linkage,
                             "\n".join(version_lines), version_exit)
    report.problems = _problems(report, gpu)
    return report


def _problems(r: CudaImageReport, gpu: bool) -> list[str]:
    problems: list[str] = []
    if not any(link.path.endswith("llama-server") for link in r.linkage):
        problems.append("ldd of /opt/llama/bin/llama-server printed nothing")
    if not any("libggml-cuda" in link.path for link in r.linkage):
        problems.append("no libggml-cuda.so under /opt/llama/lib: the image has no CUDA backend")
    allowed = set() if gpu else {DRIVER_LIBRARY}
    for link in r.linkage:
        extra = sorted(set(link.unresolved) - allowed)
        if extra:
            problems.append(f"{link.path} needs {', '.join(extra)}, which the image does not have")
        if "libggml-cuda" in link.path and not gpu and DRIVER_LIBRARY not in link.unresolved + list(link.resolved):
            problems.append(f"{link.path} does not link the driver ({DRIVER_LIBRARY}); expected with the VMM pool")
    names = {p.rsplit("/", 1)[-1] for p in r.cuda_libraries}
    for lib in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        if not any(n.startswith(lib) for n in names):
            problems.append(f"{lib} is not in the image")
    # NVIDIA's forward-compatibility driver (cuda-compat, under .../compat/) is meant to be there; any other is not.
    drivers = [p for p in r.cuda_libraries if p.rsplit("/", 1)[-1].startswith("libcuda.so") and "/compat/" not in p]
    if drivers:
        problems.append(f"the image carries {drivers[0]}: the driver must come from the host, not the image")
    if r.version_exit != 0 and not (not gpu and r.driver_missing):
        problems.append(f"llama-server --version: {describe_version(r.version_output, r.version_exit)}")
    return problems
