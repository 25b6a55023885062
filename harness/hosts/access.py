"""What a container of one backend is given on one host (device request, render nodes and their groups, the
environment that picks a device, named volumes): handed to the engine, which knows no backend, and made by
harness/hosts/devices.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The environment variable ggml-vulkan reads to pick devices by index (it skips CPU-type devices without it).
VISIBLE_ENV = "GGML_VK_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Access:
    """What a container of one backend gets on one host."""

    backend: str
    gpu_request: bool = False
    nodes: tuple[str, ...] = ()
    groups: tuple[int, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    #: named volumes: (volume, path in the container), mounted read-write
    volumes: tuple[tuple[str, str], ...] = ()

    def with_visible(self, index: int | list[int] | None) -> Access:
        """The same access, telling llama.cpp's Vulkan backend to use the device of this index, or these (None: its
        own choice, the GPUs)."""
        env = tuple((k, v) for k, v in self.environment if k != VISIBLE_ENV)
        if index is not None:
            env += ((VISIBLE_ENV, ",".join(map(str, index)) if isinstance(index, list) else str(index)),)
        return Access(self.backend, self.gpu_request, self.nodes, self.groups, env, self.volumes)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "gpu_request": self.gpu_request, "nodes": list(self.nodes),
                "groups": list(self.groups), "environment": dict(self.environment),
                "volumes": {v: path for v, path in self.volumes}}

    def describe(self) -> str:
        """One line: what the container is given."""
        if self.backend == "cuda":
            return "all GPUs through the NVIDIA runtime (device request)"
        if self.backend != "vulkan":
            return "no devices (CPU backend)"
        parts = [f"{', '.join(self.nodes)} (groups {', '.join(map(str, self.groups)) or 'none'})" if self.nodes
                 else "no device nodes (the host has no /dev/dri)"]
        env = dict(self.environment)
        if VISIBLE_ENV in env:
            parts.append(f"{VISIBLE_ENV}={env[VISIBLE_ENV]}")
        return "; ".join(parts)
