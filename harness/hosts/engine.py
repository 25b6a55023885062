"""Where containers run. One small interface, two engines: the local Docker engine (Docker SDK) and a remote
one reached over SSH (harness/hosts/remote.py). Every container, image and host command of the kit goes through
`Engine`: no module outside harness/hosts/ imports the Docker SDK, and what comes back is the kit's own values
(`Image`, `Finished`) or an opaque container handle (`Container`: its id, labels and status)."""

from __future__ import annotations

import http.client
import os
import platform
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

import docker.errors
import requests.exceptions

import docker
from harness import LABEL_PREFIX, KitError
from harness.hosts.access import Access

DOCKER_HINT = ("start one: `dockerd --bridge=none --iptables=false &` (as root), or `sudo systemctl start docker`; "
               "or point DOCKER_HOST at a running engine")


def connect(base_url: str | None = None, timeout: int = 600, **kwargs: Any) -> docker.DockerClient:
    """A Docker client that answers, or one line saying how to get one."""
    try:
        client = docker.DockerClient(base_url=base_url, timeout=timeout, **kwargs) if base_url else \
            docker.from_env(timeout=timeout)
        client.ping()
        return client
    except docker.errors.DockerException as e:
        where = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        if "Permission denied" in str(e) or "PermissionError" in str(e):
            raise KitError(f"permission denied on the Docker socket {where}: add your user to the docker group "
                           "(`sudo usermod -aG docker $USER`, then log in again) or run as a user who may use "
                           "Docker") from None
        reason = str(e).split("(")[0].strip().rstrip(":")
        if where.startswith("unix://") and not os.path.exists(where[len("unix://"):]):
            reason = "no socket file there"
        elif "Connection refused" in str(e) or "ConnectionRefused" in str(e):
            reason = "connection refused"
        raise KitError(f"no Docker engine answers at {where} ({reason}); {DOCKER_HINT}") from None


class Endpoint:
    """How this process reaches a llama-server bound to 127.0.0.1:port on the engine's host."""

    via = "loopback"

    def __init__(self, port: int):
        self.port = port

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)


@dataclass
class Mount:
    host_path: Path
    container_path: str


class ImageMissing(KitError):
    """The engine does not hold the image an operation names."""

    def __init__(self, image: str, host: str):
        super().__init__(f"image {image} is not on {host}; run `invoke build` first")
        self.image = image


class EngineRefused(KitError):
    """The engine answered an operation with an error; the message is the engine's own explanation."""


class Container(Protocol):
    """A container as the kit sees it: what it reads of one; every operation on it goes through `Engine`."""

    @property
    def id(self) -> str: ...
    @property
    def short_id(self) -> str: ...
    @property
    def labels(self) -> dict[str, str]: ...
    @property
    def status(self) -> str: ...


@dataclass(frozen=True)
class Image:
    """An image on an engine: its id, tags, labels and the facts the kit reads of it."""

    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    created: str | None
    size: int
    architecture: str | None

    @property
    def short_id(self) -> str:
        """The id cut to 12 hex digits, with its `sha256:` prefix (as `docker images` shows it)."""
        return self.id[:19] if self.id.startswith("sha256:") else self.id[:12]


@dataclass(frozen=True)
class Finished:
    """What a one-off container printed, and how it ended."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def _image(img: Any) -> Image:
    attrs = img.attrs or {}
    return Image(img.id, tuple(img.tags or ()), dict(img.labels or {}), attrs.get("Created"),
                 int(attrs.get("Size") or 0), attrs.get("Architecture"))


def container_options(access: Access | None) -> dict[str, Any]:
    """The Docker SDK's keyword arguments for what a container is given of its host (harness/hosts/devices.py
    decides that per backend and host): a GPU device request, device nodes with their groups, environment, named
    volumes (read-write). Nothing for None or a CPU backend's access."""
    kw: dict[str, Any] = {}
    if access is None:
        return kw
    if access.volumes:
        kw["volumes"] = {v: {"bind": path, "mode": "rw"} for v, path in access.volumes}
    if access.gpu_request:
        kw["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if access.nodes:
        kw["devices"] = [f"{n}:{n}:rwm" for n in access.nodes]
    if access.groups:
        kw["group_add"] = [str(g) for g in access.groups]
    if access.environment:
        kw["environment"] = dict(access.environment)
    return kw


def _read_only(mounts: list[Mount] | tuple[Mount, ...]) -> dict[str, dict[str, str]]:
    return {str(m.host_path): {"bind": m.container_path, "mode": "ro"} for m in mounts}


class Engine:
    """A Docker engine and the host it runs on. Subclasses differ in where that host is.

    Long by design: one short method per engine operation the kit uses, so the rest of the kit sees one
    interface and never the Docker SDK."""

    #: The host label recorded with every measurement.
    name: str = "local"
    #: Whether the engine's host is another machine (reached over SSH).
    remote: bool = False
    #: Errors that mean "the server is not listening yet" on this engine's way of reaching it.
    transient_errors: tuple[type[BaseException], ...] = ()
    #: Errors that mean the engine (or the connection to it) was lost: a run stops and can be resumed.
    lost_errors: tuple[type[BaseException], ...] = (docker.errors.DockerException,
                                                    requests.exceptions.RequestException, ConnectionError, EOFError)

    def __init__(self, client: docker.DockerClient):
        self.client = client

    # -- ports and addresses
    def free_port(self) -> int:
        """A TCP port free on the engine's host, for llama-server to bind on 127.0.0.1."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def endpoint(self, port: int) -> Endpoint:
        """How to reach a server bound to 127.0.0.1:port on the engine's host."""
        return Endpoint(port)

    # -- containers
    def start_server(self, image: str, command: list[str], mounts: list[Mount], labels: dict[str, str],
                     access: Access | None = None, name: str | None = None) -> Container:
        """Start a server container with its models mounted read-only and, for a GPU backend, its devices
        (harness/hosts/devices.py: the same for every container of a run)."""
        kwargs = container_options(access)
        kwargs["volumes"] = {**kwargs.get("volumes", {}), **_read_only(mounts)}
        try:
            return self.client.containers.run(image, command, detach=True, network_mode="host", labels=labels,
                                              name=name, **kwargs)
        except docker.errors.ImageNotFound:
            raise KitError(f"image {image} is not on {self.name}; run `invoke build` first") from None
        except docker.errors.APIError as e:
            raise KitError(f"cannot start a container of {image} on {self.name}: {e.explanation or e}") from None

    def run_container(self, image: str, command: list[str], labels: dict[str, str], *, access: Access | None = None,
                      entrypoint: list[str] | None = None, mounts: tuple[Mount, ...] = (),
                      timeout: float | None = None, cpu_shares: int | None = None) -> Finished:
        """Run a one-off container without network to its end and return what it printed; it is removed
        whatever happens. `access`: the devices it gets (as a run's servers do); `timeout` bounds the wait for its
        end (the engine's client timeout when None); `cpu_shares` is its CPU weight (1024 is normal)."""
        kwargs = container_options(access)
        if cpu_shares:
            kwargs["cpu_shares"] = cpu_shares
        if entrypoint is not None:
            kwargs["entrypoint"] = entrypoint
        if mounts:
            kwargs["volumes"] = {**kwargs.get("volumes", {}), **_read_only(mounts)}
        try:
            ctr = self.client.containers.create(image, command, network_mode="none", labels=labels, **kwargs)
        except docker.errors.ImageNotFound:
            raise ImageMissing(image, self.name) from None
        except docker.errors.APIError as e:
            raise EngineRefused(str(e.explanation or e)) from None
        try:
            ctr.start()
            code = ctr.wait(timeout=timeout)["StatusCode"]
            return Finished(code, ctr.logs(stdout=True, stderr=False).decode("utf-8", "replace"),
                            ctr.logs(stdout=False, stderr=True).decode("utf-8", "replace"))
        except docker.errors.APIError as e:
            raise EngineRefused(str(e.explanation or e)) from None
        finally:
            ctr.remove(force=True)

    def status(self, container: Container) -> str:
        try:
            container.reload()
            return container.status
        except docker.errors.NotFound:
            return "removed"

    def exit_code(self, container: Container) -> int | None:
        try:
            return container.attrs.get("State", {}).get("ExitCode")
        except Exception:  # noqa: BLE001 - a vanished container has no exit code
            return None

    def logs(self, container: Container, tail: int | str = 30) -> str:
        try:
            return container.logs(tail=tail, stdout=True, stderr=True).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return ""

    def container_pid(self, container: Container) -> int | None:
        """The host pid of the container's first process (None when it has none, or has gone)."""
        pid = (container.attrs.get("State") or {}).get("Pid")
        if not pid:  # attrs taken before the start (containers.run) have no pid yet
            try:
                container.reload()
                pid = (container.attrs.get("State") or {}).get("Pid")
            except Exception:  # noqa: BLE001 - a container that has gone has no pid
                pid = None
        return pid or None

    def container_pids(self, container: Container) -> set[int]:
        """Host pids of every process in the container (`docker top`); empty when they cannot be read."""
        try:
            top = container.top()
            col = top["Titles"].index("PID")
            return {int(p[col]) for p in top["Processes"]}
        except Exception:  # noqa: BLE001 - a container that has gone has no processes
            return set()

    def exec_in(self, container: Container, argv: list[str]) -> tuple[int, str]:
        """Run a command inside a running container; (exit code, output). A container that has gone, or an
        engine that refuses, answers (-1, "")."""
        try:
            code, out = container.exec_run(argv)
        except Exception:  # noqa: BLE001 - a container that has gone has nothing to say
            return -1, ""
        return code, out.decode("utf-8", "replace")

    def memory_peak(self, container: Container) -> int | None:
        """Peak memory of the container in bytes (cgroup v1 max_usage or v2 memory.peak), read inside it: the
        engine's stats endpoint waits for its next 1 s sample, which would dominate a short measurement."""
        try:
            code, out = container.exec_run(["sh", "-c", "cat /sys/fs/cgroup/memory.peak 2>/dev/null || "
                                            "cat /sys/fs/cgroup/memory/memory.max_usage_in_bytes"])
            if code == 0 and out.strip().isdigit():
                return int(out.strip())
        except (docker.errors.APIError, requests.exceptions.RequestException, ValueError):
            pass
        return None

    def remove(self, container: Container) -> None:
        """Stop and remove a container; a container already gone is fine."""
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise

    def kit_containers(self, run_id: str | None = None, helpers: bool = False) -> list[Container]:
        """Containers the kit labelled, optionally of one run, running or not; with `helpers`, also its
        short-lived ones (version check, probe). A container removed between the listing and its inspection (by
        another run or host on the same engine) is left out, not an error."""
        label = f"{LABEL_PREFIX}.run={run_id}" if run_id else f"{LABEL_PREFIX}.run"
        found = self.client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
        if helpers and run_id is None:
            found += self.client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.role"},
                                                 ignore_removed=True)
        return found

    # -- images
    def image(self, ref: str) -> Image | None:
        """The image of this tag or id on the engine, or None."""
        try:
            return _image(self.client.images.get(ref))
        except docker.errors.ImageNotFound:
            return None

    def images(self, labels: list[str] | None = None, name: str | None = None) -> list[Image]:
        """Images on the engine carrying every label filter given (`key` or `key=value`), or of a repository."""
        return [_image(i) for i in self.client.images.list(name=name, filters={"label": labels} if labels else None)]

    def build_image(self, context: IO[bytes], tag: str, *, buildargs: dict[str, str], labels: dict[str, str],
                    network: str = "none", nocache: bool = False, cpu_shares: int | None = None
                    ) -> Iterator[dict[str, Any]]:
        """Build an image from a tar context (a Dockerfile at its root), pulling nothing; yields the engine's
        build stream (`stream` lines, `aux` with the image id, `error`). A refusal is an `EngineRefused`."""
        try:
            yield from self.client.api.build(fileobj=context, custom_context=True, tag=tag, buildargs=buildargs,
                                             labels=labels, rm=True, forcerm=True, pull=False, decode=True,
                                             network_mode=network, nocache=nocache,
                                             container_limits={"cpushares": cpu_shares} if cpu_shares else None)
        except docker.errors.APIError as e:
            raise EngineRefused(str(e.explanation or e)) from None

    def pull(self, image: str) -> Iterator[dict[str, Any]]:
        """Pull `repo:tag` from a registry for the engine's own architecture; yields the engine's progress.
        Any failure to reach or use the registry is an `EngineRefused`."""
        repo, tag = image.rsplit(":", 1)
        try:
            yield from self.client.api.pull(repo, tag=tag, stream=True, decode=True)
        except docker.errors.APIError as e:
            raise EngineRefused(str(e.explanation or e)) from None
        except docker.errors.DockerException as e:
            raise EngineRefused(str(e)) from None

    def import_image(self, tar: Path, tag: str, changes: list[str]) -> None:
        """Import a root filesystem tarball from this machine as image `tag` (Dockerfile `changes` applied)."""
        repo, name = tag.rsplit(":", 1)
        self.client.api.import_image(src=str(tar), repository=repo, tag=name, changes=changes)

    # -- engine facts
    def info(self) -> dict[str, Any]:
        """The engine's own description (`docker info`): CPUs, memory, OS, kernel, runtimes, architecture."""
        return self.client.info()

    def version(self) -> dict[str, Any]:
        """The engine's version and API version (`docker version`)."""
        return self.client.version()

    def architecture(self) -> str:
        """The engine's architecture as it names it (x86_64, aarch64, ...)."""
        return str(self.info().get("Architecture", ""))

    # -- host facts
    def run_host(self, argv: list[str], timeout: float = 20) -> tuple[int, str]:
        """Run a command on the engine's host; (exit code, stdout). 127 when the program is missing."""
        if shutil.which(argv[0]) is None:
            return 127, ""
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, ""
        return proc.returncode, proc.stdout

    def read_host_file(self, path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    def hostname(self) -> str:
        return platform.node()

    def cpu_count(self) -> int:
        """CPUs of the engine's host (the engine's own count, cached): a remote host's, not this machine's."""
        if getattr(self, "_cpus", None) is None:
            try:
                self._cpus = int(self.info().get("NCPU") or 0) or 1
            except Exception:  # noqa: BLE001 - a count is only needed for a warning threshold
                self._cpus = 1
        return self._cpus

    def load_average(self) -> tuple[float, float, float] | None:
        text = self.read_host_file("/proc/loadavg")
        if not text:
            return None
        a, b, c = (float(x) for x in text.split()[:3])
        return a, b, c

    def read_head(self, path: Path, n: int) -> bytes:
        """The first n bytes of a file on the engine's host (a GGUF header, for the pre-flight)."""
        with open(path, "rb") as f:
            return f.read(n)

    def place_models(self, local: dict[str, Path], log: Any = print) -> dict[str, Path]:
        """Model files as the engine's host sees them (the local engine sees this machine's)."""
        return local

    def models_dir(self) -> str | None:
        return None

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass


class LocalEngine(Engine):
    name = "local"

    def __init__(self, client: docker.DockerClient | None = None):
        super().__init__(client or connect())
