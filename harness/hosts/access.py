"""What a container of one backend is given on one host (device request, render nodes and their groups, the
environment that picks a device, named volumes): handed to the engine, which knows no backend, and made by
harness/hosts/devices.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, TypedDict


class DeviceRule(Protocol):
    """What this room needs to know of a backend (a row of harness/image/backends.py): how its containers reach
    the devices, the variable that picks one, and how the devices are listed."""

    @property
    def name(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def gpu_request(self) -> bool: ...
    @property
    def render_nodes(self) -> bool: ...
    @property
    def shader_cache(self) -> bool: ...
    @property
    def visible_env(self) -> str | None: ...
    @property
    def device_list(self) -> str | None: ...


class AccessJson(TypedDict):
    """What a container was given, as run.json keeps it."""

    backend: str
    gpu_request: bool
    nodes: list[str]
    groups: list[int]
    environment: dict[str, str]
    volumes: dict[str, str]


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
    #: the host's render nodes are this backend's way to its devices (there may be none)
    render_nodes: bool = False
    #: the variable that tells llama.cpp which devices to use, by index
    visible_env: str | None = None

    def with_visible(self, index: int | list[int] | None) -> Access:
        """The same access, telling llama.cpp's backend to use the device of this index, or these (None: its own
        choice, the GPUs)."""
        env = tuple((k, v) for k, v in self.environment if k != self.visible_env)
        if index is not None:
            if self.visible_env is None:
                raise ValueError(f"the {self.backend} backend has no variable that picks a device")
            env += ((self.visible_env, ",".join(map(str, index)) if isinstance(index, list) else str(index)),)
        return replace(self, environment=env)

    def as_dict(self) -> AccessJson:
        return {"backend": self.backend, "gpu_request": self.gpu_request, "nodes": list(self.nodes),
                "groups": list(self.groups), "environment": dict(self.environment),
                "volumes": {v: path for v, path in self.volumes}}

    def describe(self) -> str:
        """One line: what the container is given."""
        if self.gpu_request:
            return "all GPUs through the NVIDIA runtime (device request)"
        if not self.render_nodes:
            return f"no devices ({self.backend.upper()} backend)"
        parts = [f"{', '.join(self.nodes)} (groups {', '.join(map(str, self.groups)) or 'none'})" if self.nodes
                 else "no device nodes (the host has no /dev/dri)"]
        env = dict(self.environment)
        if self.visible_env in env:
            parts.append(f"{self.visible_env}={env[self.visible_env]}")
        return "; ".join(parts)
