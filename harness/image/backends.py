"""Every llama.cpp backend the kit builds and runs, one row each: GPU or not, where its base images come from, its
CMake flags, how its containers reach the devices (and the variable that picks one), how the devices are listed,
the bandwidth probe, the build's image check and the doctor's checks. Every rule that depends on the backend reads
its row: the build plan (recipe.py), the bases (bases.py), the build (build.py), the devices of a run
(harness/hosts/devices.py, given the row), the probe, the doctor and the run.

A new backend: one row here and its name in the `build.backend` enums of schemas/manifest.schema.json and
schemas/build.schema.json (and, for a GPU backend, of `devices.backend` in schemas/run.schema.json); a test holds
them together. What a row names must exist: its packages in Debian, its CMake switch in llama.cpp, its probe
program in docker/Dockerfile."""

from __future__ import annotations

from dataclasses import dataclass

from harness import KitError
from harness.hosts.devices import NVIDIA_SMI, VULKAN_LIST

#: The build's check of a new image (harness/image/build.py): the Vulkan devices it sees and lists
#: (vulkan_image.py), or its libraries without a GPU (cuda_image.py).
VULKAN_CHECK, CUDA_CHECK = "vulkan", "cuda"
#: The doctor's checks (harness/run/doctor.py): the GPUs nvidia-smi lists, Docker's NVIDIA runtime, the render
#: nodes and the Vulkan devices the image sees.
GPUS, NVIDIA_RUNTIME, VULKAN_DEVICES = "gpus", "nvidia-runtime", "vulkan-devices"


@dataclass(frozen=True)
class Base:
    """One base image made from Debian (harness/image/bases.py): its role (in its tag), suite and packages besides
    Debian's minimal system."""

    role: str
    suite: str
    packages: tuple[str, ...]


@dataclass(frozen=True)
class Probe:
    """The bandwidth probe in the image (`invoke probe`): its program and default size and repetitions."""

    program: str
    size_mib: int
    repetitions: int


@dataclass(frozen=True)
class Backend:
    """One backend and what the kit does differently for it."""

    name: str
    #: How a person names its devices: "Vulkan 0: ...".
    label: str
    #: Its servers run on a device: they log at trace level (the device lines), and run.json and every record
    #: keep the devices and what each measurement used.
    gpu: bool
    #: Its build and runtime bases, made from Debian here; None: NVIDIA's CUDA images (harness/image/cuda_base.py).
    debian: tuple[Base, Base] | None
    #: CMake flags of the backend ("{cuda_architectures}" filled from the manifest's build).
    cmake: tuple[str, ...]
    probe: Probe
    #: The GPU architectures the build compiles for are the manifest's build.cuda_architectures (shown as
    #: "<label> arch"), with a note per architecture where one is due.
    architectures: bool = False
    architecture_notes: tuple[tuple[str, str], ...] = ()
    #: Containers get every GPU through a device request (the NVIDIA runtime answers it).
    gpu_request: bool = False
    #: Containers get the host's render nodes (/dev/dri, /dev/kfd) with their groups.
    render_nodes: bool = False
    #: Containers share the engine's Mesa shader cache (a named volume), warmed once per strategy before a run.
    shader_cache: bool = False
    #: The variable that tells llama.cpp which devices to use, by index; None where the kit sets none.
    visible_env: str | None = None
    #: How the devices are listed (harness/hosts/devices.py: VULKAN_LIST, NVIDIA_SMI); None: no devices.
    device_list: str | None = None
    #: The build's check of a new image (VULKAN_CHECK, CUDA_CHECK); None: its version line only.
    image_check: str | None = None
    #: The doctor's checks (GPUS, NVIDIA_RUNTIME, VULKAN_DEVICES).
    doctor: tuple[str, ...] = ()

    def cmake_flags(self, cuda_architectures: str) -> list[str]:
        return [f.format(cuda_architectures=cuda_architectures) for f in self.cmake]

    def describe(self, cuda_architectures: str) -> str:
        """The backend as `invoke validate` prints it: "cuda, CUDA arch 121"."""
        return self.name + (f", {self.label} arch {cuda_architectures}" if self.architectures else "")

    def notes(self, cuda_architectures: str) -> list[str]:
        return [note for arch, note in self.architecture_notes if arch == cuda_architectures]


_BUILD_TOOLS = ("build-essential", "cmake", "ca-certificates", "pkg-config")

#: In the order of the schemas' enums.
BACKENDS: tuple[Backend, ...] = (
    Backend("cpu", "CPU", gpu=False,
            debian=(Base("builder", "bookworm", _BUILD_TOOLS),
                    # libgomp1: llama.cpp's CPU backend links OpenMP.
                    Base("runtime", "bookworm", ("libgomp1", "ca-certificates"))),
            cmake=(), probe=Probe("specbench-probe", 256, 10), doctor=(GPUS,)),
    Backend("cuda", "CUDA", gpu=True, debian=None,
            cmake=("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES={cuda_architectures}",
                   # libcuda.so comes from the driver at run time; link against the toolkit's stub.
                   "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"),
            probe=Probe("specbench-probe-cuda", 1024, 20), architectures=True,
            architecture_notes=(("121", "CUDA arch 121 is the GB10 (DGX Spark); it needs CUDA 12.9 or newer"),),
            gpu_request=True, device_list=NVIDIA_SMI, image_check=CUDA_CHECK, doctor=(GPUS, NVIDIA_RUNTIME)),
    # Vulkan's bases are trixie: its Mesa 25.0 drives current AMD/Intel GPUs (bookworm's 22.3 predates RDNA 3.5, the
    # Strix Halo GPU), and its glslc 2025.2 compiles the cooperative-matrix and integer-dot shaders b11434 uses on
    # them (bookworm's glslc 2023.2 supports neither, measured: the backend would build without them).
    Backend("vulkan", "Vulkan", gpu=True,
            # glslc compiles ggml's shaders; ggml-vulkan's CMake asks for the Vulkan headers and SPIRV-Headers' config.
            # The runtime: the Vulkan loader and Mesa's drivers: lavapipe (a software device on the CPU), RADV
            # (AMD), ANV (Intel).
            debian=(Base("vulkan-builder", "trixie", (*_BUILD_TOOLS, "glslc", "libvulkan-dev", "spirv-headers")),
                    Base("vulkan-runtime", "trixie", ("libgomp1", "ca-certificates", "libvulkan1",
                                                      "mesa-vulkan-drivers"))),
            cmake=("-DGGML_VULKAN=ON",), probe=Probe("specbench-probe-ggml", 256, 10),
            # ggml-vulkan skips CPU-type devices (a software one) unless this names them
            render_nodes=True, shader_cache=True, visible_env="GGML_VK_VISIBLE_DEVICES", device_list=VULKAN_LIST,
            image_check=VULKAN_CHECK, doctor=(VULKAN_DEVICES,)),
)


def names() -> list[str]:
    return [b.name for b in BACKENDS]


def get(name: str) -> Backend:
    """The row of a backend; a KitError naming the known ones for any other name."""
    row = next((b for b in BACKENDS if b.name == name), None)
    if row is None:
        raise KitError(f"backend {name!r} is not one of {names()}")
    return row


def base(role: str) -> Base:
    """The Debian base of this role, whichever backend it belongs to."""
    found = next((b for row in BACKENDS for b in row.debian or () if b.role == role), None)
    if found is None:
        raise KitError(f"base role {role!r} is not one of {[b.role for r in BACKENDS for b in r.debian or ()]}")
    return found
