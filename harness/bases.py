"""Registry-free base images for the CPU backend: Debian root filesystems made with debootstrap, imported
into the Docker engine. Used where no registry answers (air-gapped hosts, CI)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker.errors

import docker
from harness import DOCKER, LABEL_PREFIX, KitError

SCRIPT = DOCKER / "base" / "make-rootfs.sh"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class BaseImages:
    builder: str
    runtime: str
    reason: str
    registry_free: bool = True


def host_mirror() -> str:
    """The Debian mirror this host's apt uses (so debootstrap reaches what apt reaches)."""
    candidates = [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+)", text, re.M) or re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    return DEFAULT_MIRROR


def tag_for(role: str) -> str:
    """Image tag of a base, derived from the script that makes it, so a changed recipe makes a new image."""
    digest = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:12]
    return f"{LABEL_PREFIX}/base-{role}:{SUITE}-{digest}"


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure(client: docker.DockerClient, log: Callable[[str], None] = print, mirror: str | None = None) -> BaseImages:
    """Make (or reuse) the builder and runtime base images; return their tags."""
    tags = {role: tag_for(role) for role in ("builder", "runtime")}
    missing = [role for role, tag in tags.items() if not image_exists(client, tag)]
    if not missing:
        return BaseImages(tags["builder"], tags["runtime"],
                          "registry-free Debian bases (debootstrap), already imported")
    mirror = mirror or host_mirror()
    for role in missing:
        log(f"base: making {tags[role]} with debootstrap from {mirror} (about a minute)")
        with tempfile.TemporaryDirectory(prefix="specbench-base-") as tmp:
            tar = Path(tmp) / f"{role}.tar"
            proc = subprocess.run(["sh", str(SCRIPT), role, str(tar), mirror, SUITE],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                raise KitError(f"base image {role}: debootstrap failed (exit {proc.returncode}): {tail}")
            repo, tag = tags[role].rsplit(":", 1)
            client.api.import_image(src=str(tar), repository=repo, tag=tag, changes=[f"ENV {ENV_PATH}",
                                    f"LABEL {LABEL_PREFIX}.base={role}"])
        log(f"base: imported {tags[role]}")
    return BaseImages(tags["builder"], tags["runtime"],
                      f"registry-free Debian bases made with debootstrap ({', '.join(missing)} made now)")
