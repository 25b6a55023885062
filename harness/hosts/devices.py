"""The accelerator side of a container, one code path for every GPU backend.

- `Access`: what a container of a backend is given on a host, by the backend's row (harness/image/backends.py,
  seen here as a `DeviceRule`). CUDA: a device request the NVIDIA runtime answers. Vulkan: the host's render nodes
  (`/dev/dri/renderD*`, and `/dev/kfd` where present) with their groups, when the host has them (a software device
  needs none), and `GGML_VK_VISIBLE_DEVICES` when llama.cpp is to use a device it skips by default (a software one),
  and the image's Mesa shader cache (a named volume per image: compiled shaders persist between fresh containers as
  they do on a host's disk; without it every container compiles them again, on lavapipe for a minute or more).
  Every container of a run (server, probe, device list) gets the same.
- `Device`: one device as the image sees it (name, driver, memory, unified or not, software or not), from the
  image's Vulkan device list or the host's nvidia-smi, one line each for `invoke doctor` and the run records.
- `choose`: which device llama.cpp is told to use, or one line saying why none fits.

What llama-server then did with the device (which one ran the measurement, layers offloaded, device memory) is read
from its log (harness/run/serverlog.py), the same for every backend."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict, cast

from harness import LABEL_PREFIX, KitError
from harness import formatter as fm
from harness.hosts.access import Access, AccessJson, DeviceRule
from harness.hosts.engine import Engine, EngineRefused, ImageMissing
from harness.hosts.environment import nvidia_smi

#: Host device nodes a Vulkan container gets where the host has them: the DRM render nodes (compute and
#: rendering, no display: never card* or the whole /dev/dri), and AMD's compute node.
RENDER_NODE = re.compile(r"/dev/dri/renderD[0-9]{1,4}")
KFD_NODE = "/dev/kfd"
DEVICE_LIST = "specbench-vulkan-devices"
#: The engine's named volumes for Mesa's on-disk shader cache (lavapipe, RADV, ANV), one per image (by its id:
#: shaders one build compiled are loaded by no other build), and where containers see it.
SHADER_CACHE_VOLUME = "specbench-mesa-shader-cache"
SHADER_CACHE_DIR = "/var/cache/specbench-mesa-shaders"
#: The ways a backend's devices are listed (its row's `device_list`): the image's Vulkan device list, nvidia-smi.
VULKAN_LIST, NVIDIA_SMI = "vulkan", "nvidia-smi"
#: How a person names the devices of each list.
API_LABELS = {"vulkan": "Vulkan", "cuda": "CUDA"}
#: Vulkan driver ids (VkDriverId) of software devices, with the names people know them by.
SOFTWARE_DRIVERS = {13: "Mesa lavapipe", 10: "SwiftShader"}


def host_nodes(engine: Engine) -> list[tuple[str, int]]:
    """The render nodes on the engine's host, (path, group id): /dev/dri/renderD* and /dev/kfd where they exist."""
    code, out = engine.run_host(["sh", "-c", "for f in /dev/dri/renderD* /dev/kfd; do [ -c \"$f\" ] && "
                                 "stat -c '%n %g' \"$f\"; done; true"])
    if code != 0:
        return []
    found = []
    for line in out.splitlines():
        path, _, gid = line.strip().rpartition(" ")
        if path.startswith("/dev/") and gid.isdigit():
            found.append((path, int(gid)))
    return found


def shader_cache_volume(image_id: str) -> str:
    """The shader-cache volume of one image: named by the image's id (its content), so an image built from
    another source or with other flags (`--trust-source`) never leaves shaders that this one loads."""
    digest = image_id.split(":")[-1]
    if not re.fullmatch(r"[0-9a-f]{12,64}", digest):
        raise KitError(f"image id {image_id[:80]!r}: expected sha256:<hex>")
    return f"{SHADER_CACHE_VOLUME}-{digest[:16]}"


def access_from_nodes(backend: DeviceRule, nodes: list[tuple[str, int]], image_id: str | None = None) -> Access:
    """A backend's access given the host's render nodes (a pure function: `access` asks the host): only
    /dev/dri/renderD* and /dev/kfd are passed, with their groups; with the image's id, its own shader-cache
    volume (without one, none: a container that only lists devices compiles no shader)."""
    if backend.gpu_request:
        return Access(backend.name, gpu_request=True, visible_env=backend.visible_env)
    if not backend.render_nodes:
        return Access(backend.name, visible_env=backend.visible_env)
    kept = [(n, g) for n, g in nodes if RENDER_NODE.fullmatch(n) or n == KFD_NODE]
    # the nodes' groups (render, video): needed where the engine maps the container's root to another user
    groups = tuple(sorted({g for _, g in kept if g != 0}))
    cache = ((shader_cache_volume(image_id), SHADER_CACHE_DIR),) if backend.shader_cache and image_id else ()
    return Access(backend.name, nodes=tuple(sorted(dict.fromkeys(n for n, _ in kept))), groups=groups,
                  environment=(("MESA_SHADER_CACHE_DIR", SHADER_CACHE_DIR),) if cache else (), volumes=cache,
                  render_nodes=True, visible_env=backend.visible_env)


def access(engine: Engine, backend: DeviceRule, image: str | None = None) -> Access:
    """What a container of `backend` gets on the engine's host; with an image (tag) present there, its
    shader-cache volume too."""
    if not backend.render_nodes:
        return access_from_nodes(backend, [])
    img = engine.image(image) if image and backend.shader_cache else None
    return access_from_nodes(backend, host_nodes(engine), img.id if img is not None else None)


# ---------------------------------------------------------------- devices as the image sees them


class DeviceJson(TypedDict):
    """A device as run.json and build.json keep it (`Device`)."""

    index: int
    name: str
    driver: str
    kind: str
    memory_bytes: int | None
    unified: bool | None
    software: str | None
    api: str
    extra: dict[str, str]


class ListedDevice(DeviceJson):
    line: str


class SetupFacts(TypedDict):
    """What run.json records of a host's devices for a GPU backend (environment.<host>.devices)."""

    backend: str
    access: AccessJson
    chosen: int | None
    devices: list[ListedDevice]


@dataclass(frozen=True)
class Device:
    """One device: the backend's index, what it is, and whether it shares memory with the CPU."""

    index: int
    name: str
    driver: str
    kind: str  # discrete-gpu | integrated-gpu | virtual-gpu | cpu | other | gpu (nvidia-smi)
    memory_bytes: int | None
    unified: bool | None
    software: str | None = None  # the software device's name (Mesa lavapipe), None for hardware
    api: str = "vulkan"  # the list it comes from: vulkan | cuda (API_LABELS)
    extra: dict[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """One line for a person: index, name, driver, memory, unified or not, software or not."""
        mem = f"{fm.num(self.memory_bytes / 2**30, 1)} GiB" if self.memory_bytes else "memory unknown"
        shared = {True: "unified memory", False: "own memory", None: "memory sharing unknown"}[self.unified]
        what = (f"SOFTWARE device ({self.software}: Vulkan on the CPU, not a GPU)" if self.software
                else self.kind.replace("-", " "))
        label = API_LABELS.get(self.api, self.api)
        return f"{label} {self.index}: {self.name}, driver {self.driver}, {mem}, {shared}, {what}"

    def as_dict(self) -> DeviceJson:
        return cast(DeviceJson, asdict(self))

    def listed(self) -> ListedDevice:
        """The device as a record lists it: its fields and its line."""
        return cast(ListedDevice, {**asdict(self), "line": self.line()})


def parse_vulkan_devices(text: str) -> list[Device]:
    """The devices in `specbench-vulkan-devices`' JSON line; a KitError when the output is not that."""
    line = next((ln for ln in reversed(text.strip().splitlines()) if ln.startswith("{")), "")
    try:
        raw = json.loads(line)
        devices = raw["devices"]
    except (ValueError, KeyError, TypeError):
        raise KitError(f"{DEVICE_LIST}: expected one JSON line with 'devices', got: {text.strip()[-200:]!r}") from None
    out = []
    for d in devices:
        kind = str(d.get("type", "other"))
        driver = " ".join(x for x in (d.get("driver_name"), f"({d['driver_info']})" if d.get("driver_info") else None)
                          if x) or "unknown"
        software = SOFTWARE_DRIVERS.get(d.get("driver_id")) if kind == "cpu" else None
        if kind == "cpu" and software is None:
            software = "a CPU-type Vulkan device"
        out.append(Device(int(d["index"]), str(d["name"]), driver, kind, d.get("device_local_bytes") or None,
                          True if kind in ("integrated-gpu", "cpu") else False if kind == "discrete-gpu" else None,
                          software, "vulkan",
                          {"api_version": d.get("api_version"), "vendor_id": d.get("vendor_id"),
                           "device_id": d.get("device_id"), "driver_id": d.get("driver_id"),
                           "host_visible_device_local": d.get("host_visible_device_local")}))
    return out


def vulkan_devices(engine: Engine, image: str, acc: Access) -> list[Device]:
    """Every Vulkan device the image sees on the engine's host, given the backend's access (software ones too)."""
    try:
        done = engine.run_container(image, [DEVICE_LIST], {f"{LABEL_PREFIX}.role": "devices"},
                                    access=acc.with_visible(None), entrypoint=[], timeout=120)
    except ImageMissing:
        raise KitError(f"image {image} is not on {engine.name}; run `invoke build --backend vulkan` first") from None
    except EngineRefused as e:
        raise KitError(f"cannot list the Vulkan devices of {image} on {engine.name} with {acc.describe()}: "
                       f"{e}") from None
    if done.exit_code != 0:
        raise KitError(f"{DEVICE_LIST} in {image} exited {done.exit_code} on {engine.name}: "
                       f"{done.text.strip()[-200:]}")
    return parse_vulkan_devices(done.stdout)


def from_nvidia_smi(gpus: list[dict[str, Any]]) -> list[Device]:
    """nvidia-smi's GPUs (harness/hosts/environment.py) as devices; memory "[N/A]" (the GB10) means unified."""
    return [Device(i, g["name"], f"NVIDIA {g['driver']}", "gpu",
                   int(g["memory_mib"] * 2**20) if g.get("memory_mib") else None,
                   None if g.get("memory_mib") else True, None, "cuda") for i, g in enumerate(gpus)]


def choose(devices: list[Device], software: bool) -> tuple[int | None, str | None]:
    """Which Vulkan device llama.cpp is told to use: (index for GGML_VK_VISIBLE_DEVICES or None for its own choice
    of GPUs, problem or None). software: the manifest measures on a software device on purpose."""
    if software:
        soft = next((d for d in devices if d.software), None)
        if soft is None:
            return None, ("hardware.software_device is set but the image sees no software Vulkan device "
                          f"(seen: {', '.join(d.name for d in devices) or 'none'})")
        return soft.index, None
    if not any(d.software is None for d in devices):
        seen = ", ".join(f"{d.name} ({d.software})" for d in devices) or "no Vulkan device at all"
        return None, (f"the image sees no Vulkan GPU on this host ({seen}); llama.cpp would run on the CPU. Give "
                      "the host's GPU to Docker (/dev/dri; your user in the render group), or set "
                      "hardware.software_device: true to measure on the software device on purpose")
    return None, None


# ---------------------------------------------------------------- one host's set-up for a run


@dataclass(frozen=True)
class Setup:
    """A host's devices for one backend and image: what containers get, what the image sees, what llama.cpp uses."""

    access: Access
    devices: tuple[Device, ...]
    chosen: int | None  # the Vulkan index handed to llama.cpp; None: llama.cpp's own choice (the GPUs)
    problem: str | None  # why no device fits, or None

    def facts(self) -> SetupFacts:
        """What run.json records of it (environment.<host>.devices), each device with its one line."""
        return {"backend": self.access.backend, "access": self.access.as_dict(), "chosen": self.chosen,
                "devices": [d.listed() for d in self.devices]}


def setup(engine: Engine, backend: DeviceRule, image: str, software: bool = False) -> Setup:
    """A host's devices for a backend, listed the backend's way: as the image sees them with the host's render nodes
    (Vulkan), or from nvidia-smi on the host (CUDA); a backend that lists none (the CPU) has none."""
    acc = access(engine, backend, image)
    if backend.device_list == VULKAN_LIST:
        found = vulkan_devices(engine, image, acc)
        index, problem = choose(found, software)
        return Setup(acc.with_visible(index), tuple(found), index, problem)
    if backend.device_list == NVIDIA_SMI:
        return Setup(acc, tuple(from_nvidia_smi(nvidia_smi(engine))), None, None)
    return Setup(acc, (), None, None)
