"""Where containers run. One small interface, two engines: the local Docker engine (Docker SDK) and a remote
one reached over SSH (harness/hosts/remote.py). Every container, image and host command goes through
`Engine`."""

from __future__ import annotations

import http.client
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors
import requests.exceptions

import docker
from harness import LABEL_PREFIX, KitError

if TYPE_CHECKING:  # devices.py builds on this module
    from harness.hosts.devices import Access

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


class Engine:
    """A Docker engine and the host it runs on. Subclasses differ in where that host is.

    Long by design: one short method per engine operation the kit uses, so measurement code sees one interface."""

    #: The host label recorded with every measurement.
    name: str = "local"
    #: Whether the engine's host is another machine (reached over SSH).
    remote: bool = False
    #: Errors that mean "the server is not listening yet" on this engine's way of reaching it.
    transient_errors: tuple[type[BaseException], ...] = ()

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
                     access: Access | None = None, name: str | None = None):
        """Start a server container with its models mounted read-only and, for a GPU backend, its devices
        (harness/hosts/devices.py: the same for every container of a run)."""
        kwargs: dict[str, Any] = access.container_kwargs() if access is not None else {}
        volumes = {**kwargs.pop("volumes", {}),
                   **{str(m.host_path): {"bind": m.container_path, "mode": "ro"} for m in mounts}}
        try:
            return self.client.containers.run(image, command, detach=True, network_mode="host", volumes=volumes,
                                              labels=labels, name=name, **kwargs)
        except docker.errors.ImageNotFound:
            raise KitError(f"image {image} is not on {self.name}; run `invoke build` first") from None
        except docker.errors.APIError as e:
            raise KitError(f"cannot start a container of {image} on {self.name}: {e.explanation or e}") from None

    def status(self, container) -> str:
        try:
            container.reload()
            return container.status
        except docker.errors.NotFound:
            return "removed"

    def exit_code(self, container) -> int | None:
        try:
            return container.attrs.get("State", {}).get("ExitCode")
        except Exception:  # noqa: BLE001 - a vanished container has no exit code
            return None

    def logs(self, container, tail: int | str = 30) -> str:
        try:
            return container.logs(tail=tail, stdout=True, stderr=True).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return ""

    def memory_peak(self, container) -> int | None:
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

    def remove(self, container) -> None:
        """Stop and remove a container; a container already gone is fine."""
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise

    def kit_containers(self, run_id: str | None = None, helpers: bool = False) -> list:
        """Containers the kit labelled, optionally of one run, running or not; with `helpers`, also its
        short-lived ones (version check, probe). A container removed between the listing and its inspection (by
        another run or host on the same engine) is left out, not an error."""
        label = f"{LABEL_PREFIX}.run={run_id}" if run_id else f"{LABEL_PREFIX}.run"
        found = self.client.containers.list(all=True, filters={"label": label}, ignore_removed=True)
        if helpers and run_id is None:
            found += self.client.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}.role"},
                                                 ignore_removed=True)
        return found

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
                self._cpus = int(self.client.info().get("NCPU") or 0) or 1
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
