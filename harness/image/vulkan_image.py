"""The check on a built Vulkan image: which Vulkan devices it sees on the build host (software ones too), and that
its llama-server loads the Vulkan backend and lists them (`llama-server --list-devices` with every device made
visible: llama.cpp skips software devices unless GGML_VK_VISIBLE_DEVICES names them). No GPU is needed: the image's
Mesa brings lavapipe, a Vulkan device on the CPU."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict

from harness import LABEL_PREFIX, KitError
from harness.hosts import devices
from harness.hosts.engine import Engine, EngineRefused, ImageMissing
from harness.image import backends

#: One device in `llama-server --list-devices`: "  Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (24105 MiB, 24105 MiB
#: free)"
_LISTED = re.compile(r"^\s+(\w+\d+): (.+) \((\d+) MiB, (\d+) MiB free\)\s*$")


class VulkanChecks(TypedDict):
    """The Vulkan image's check at build time: the devices it sees and what llama-server lists."""

    ok: bool
    problems: list[str]
    size_bytes: int
    listed: list[str]
    devices: list[devices.ListedDevice]


@dataclass
class VulkanImageReport:
    """What a Vulkan image sees and lists on one host."""

    image: str
    size_bytes: int
    devices: list[devices.Device]
    listed: list[str]  # llama-server's own device lines
    list_output: str
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> VulkanChecks:
        """The build record's `vulkan_checks` (schemas/build.schema.json)."""
        return {"ok": self.ok, "problems": self.problems, "size_bytes": self.size_bytes, "listed": self.listed,
                "devices": [d.listed() for d in self.devices]}

    def lines(self) -> list[str]:
        """The report as a person reads it: one line per device and per problem."""
        out = [d.line() for d in self.devices] or ["the image's Vulkan loader sees no device"]
        out += [f"llama-server lists {x}" for x in self.listed]
        return out + [f"PROBLEM: {p}" for p in self.problems]


def listed_devices(output: str) -> list[str]:
    """The device lines of `llama-server --list-devices` ("Vulkan0: llvmpipe (...) (N MiB, M MiB free)")."""
    return [f"{m.group(1)}: {m.group(2)} ({m.group(3)} MiB)" for m in map(_LISTED.match, output.splitlines()) if m]


def list_devices(engine: Engine, image: str, acc: devices.Access, indices: list[int]) -> str:
    """`llama-server --list-devices` in the image with these Vulkan devices made visible; its output."""
    try:
        done = engine.run_container(image, ["llama-server", "--list-devices"], {f"{LABEL_PREFIX}.role": "devices"},
                                    access=acc.with_visible(indices), entrypoint=[], timeout=120)
    except ImageMissing:
        raise KitError(f"image {image} is not on {engine.name}; run `invoke build --backend vulkan` first") from None
    except EngineRefused as e:
        raise KitError(f"cannot list the devices of {image} on {engine.name}: {e}") from None
    return done.text


def inspect(engine: Engine, image: str) -> VulkanImageReport:
    """The Vulkan devices the image sees on the engine's host, and what its llama-server lists of them."""
    acc = devices.access(engine, backends.get("vulkan"))
    img = engine.image(image)
    if img is None:
        raise KitError(f"image {image} is not on {engine.name}; run `invoke build --backend vulkan` first")
    size = img.size
    problems: list[str] = []
    try:
        found = devices.vulkan_devices(engine, image, acc)
    except KitError as e:
        found, problems = [], [str(e)]
    output = list_devices(engine, image, acc, [d.index for d in found]) if found else ""
    listed = listed_devices(output)
    if not found and not problems:
        problems.append("the image's Vulkan loader finds no device, not even Mesa's software one (lavapipe): "
                        "is mesa-vulkan-drivers in the runtime base?")
    if found and not any(x.startswith("Vulkan") for x in listed):
        tail = " | ".join(ln.strip() for ln in output.strip().splitlines()[-3:])
        problems.append(f"llama-server lists no Vulkan device although the image sees {len(found)}: its Vulkan "
                        f"backend did not load ({tail or 'no output'})")
    return VulkanImageReport(image, size, found, listed, output, problems)
