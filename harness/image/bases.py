"""Debian base images for the backends whose row names them (harness/image/backends.py: CPU, Vulkan), made for the
target engine's architecture.

Each base's suite and packages are in its backend's row (the CPU bases are Debian bookworm, the Vulkan ones trixie).
Two ways to make them, tried in this order
(`decide` is the pure decision, `ensure` carries it out):
- registry: the engine pulls `debian:<suite>` (its own architecture) and adds the packages with apt
  (docker/base/registry.Dockerfile);
- debootstrap: a Debian root filesystem made with docker/base/make-rootfs.sh and imported into the engine, made on
  the engine's host itself over SSH when it has debootstrap, or on this machine when the architectures match.
The architecture and the way are part of the base tags, so they are part of every llama.cpp image's identity."""

from __future__ import annotations

import hashlib
import io
import os
import platform
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import DOCKER, LABEL_PREFIX, KitError
from harness import formatter as fm
from harness.hosts.engine import Engine, EngineRefused
from harness.image import backends

SCRIPT = DOCKER / "base" / "make-rootfs.sh"
REGISTRY_DOCKERFILE = DOCKER / "base" / "registry.Dockerfile"
SUITE = "bookworm"
DEBIAN_IMAGE = f"debian:{SUITE}"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
METHODS = ("registry", "debootstrap")
#: Docker's and uname's architecture names -> the names image tags use.
ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "arm",
          "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}
#: How long the engine may take to start answering a pull before the registry counts as unreachable (a pull that
#: fails for want of DNS answers in ~10 ms on a machine without a registry; a filtered network would hang).
PULL_ANSWER_S = 30.0
#: A whole debootstrap (builder: ~45 s here, plus download time elsewhere).
DEBOOTSTRAP_TIMEOUT_S = 3600


@dataclass(frozen=True)
class BaseImages:
    builder: str
    runtime: str
    reason: str
    registry_free: bool = True


def roles(backend: str) -> tuple[str, str]:
    """The builder and runtime roles of a backend's Debian bases; a KitError for a backend whose bases are not."""
    pair = backends.get(backend).debian
    if pair is None:
        raise KitError(f"the {backend} backend's bases are not made from Debian (harness/image/backends.py)")
    return pair[0].role, pair[1].role


def _suite(role: str) -> str:
    return backends.base(role).suite


def _packages(role: str) -> tuple[str, ...]:
    return backends.base(role).packages


def normalise_arch(raw: str) -> str:
    return ARCHES.get(str(raw).lower(), str(raw).lower() or "unknown")


def local_arch() -> str:
    """This machine's architecture, as image tags name it."""
    return normalise_arch(platform.machine())


def engine_arch(engine: Engine) -> str:
    """The Docker engine's architecture (its own `info()`), as image tags name it."""
    return normalise_arch(engine.architecture())


def debian_image(backend: str = "cpu") -> str:
    """The registry image a backend's bases start from where the engine can pull one (debian:<suite>)."""
    return f"debian:{_suite(roles(backend)[0])}"


def _recipe_digest(role: str, method: str) -> str:
    recipe = SCRIPT if method == "debootstrap" else REGISTRY_DOCKERFILE
    h = hashlib.sha256(recipe.read_bytes())
    h.update(("\0".join((_suite(role), method, *_packages(role)))).encode())
    return h.hexdigest()[:12]


def tag_for(role: str, arch: str | None = None, method: str = "debootstrap") -> str:
    """Image tag of a base: suite, architecture, way of making it and a digest of its recipe and packages."""
    return (f"{LABEL_PREFIX}/base-{role}:{_suite(role)}-{arch or local_arch()}-{method}-"
            f"{_recipe_digest(role, method)}")


def images_for(arch: str, method: str, backend: str = "cpu") -> BaseImages:
    builder, runtime = roles(backend)
    how = (f"{debian_image(backend)} from a registry plus apt packages" if method == "registry"
           else f"Debian {_suite(builder)} made with debootstrap (no registry needed)")
    return BaseImages(tag_for(builder, arch, method), tag_for(runtime, arch, method), f"{how}, for {arch}")


def candidates(arch: str, backend: str = "cpu") -> list[BaseImages]:
    """Every pair of bases an image of this backend for an engine of this architecture may be built on."""
    return [images_for(arch, m, backend) for m in METHODS]


def planned(arch: str | None = None, backend: str = "cpu") -> BaseImages:
    """The bases a plan names before any engine is asked (for `invoke build --plan`)."""
    arch = arch or local_arch()
    b = images_for(arch, "debootstrap", backend)
    suite = _suite(roles(backend)[0])
    return BaseImages(b.builder, b.runtime, f"Debian {suite} bases for the engine's architecture (here {arch}): "
                      f"{debian_image(backend)} + apt where the engine can pull it, else debootstrap (tags shown)")


# ---------------------------------------------------------------- the decision


@dataclass(frozen=True)
class Decision:
    """How to make missing bases: method registry|debootstrap, where engine|host|here; or one line why not."""

    method: str | None
    where: str | None
    problem: str | None = None


def decide(engine_arch: str, local_arch: str, registry: bool, debootstrap_host: bool, debootstrap_here: bool,
           remote: bool, host: str = "the host", debian: str = DEBIAN_IMAGE) -> Decision:
    """Choose how to make the bases for an engine. A pure function of what was found out about it.

    registry: the engine can pull debian:bookworm; debootstrap_host: the engine's host has debootstrap and may run
    it (root or passwordless sudo) and a docker CLI; debootstrap_here: the same on this machine. For the local
    engine the host is this machine."""
    if registry:
        return Decision("registry", "engine")
    if remote and debootstrap_host:
        return Decision("debootstrap", "host")
    if debootstrap_here and local_arch == engine_arch:
        return Decision("debootstrap", "here")
    install = "`sudo apt-get install debootstrap`"
    if not remote:
        return Decision(None, None, f"no registry answers for {debian} and this machine cannot run debootstrap "
                        f"(install it: {install}; it needs root or passwordless sudo), or let the Docker engine "
                        "reach a registry")
    if debootstrap_here:
        return Decision(None, None, f"{host}'s Docker engine is {engine_arch} and this machine is {local_arch}: a "
                        f"{local_arch} base made here would not run there; install debootstrap on {host} ({install}; "
                        f"root or passwordless sudo) or let {host} pull {debian} from a registry")
    return Decision(None, None, f"no registry answers for {debian} on {host}, and neither {host} nor this "
                    f"machine can run debootstrap: install it on {host} ({install}; root or passwordless sudo) or "
                    f"let {host} reach a registry")


# ---------------------------------------------------------------- what the engine and the hosts can do


def registry_answers(engine: Engine, image: str = DEBIAN_IMAGE, log: Callable[[str], None] = print,
                     answer_s: float = PULL_ANSWER_S) -> bool:
    """Can the engine pull `image`? Pulls it (for the engine's own architecture) when the registry answers within
    `answer_s`; True when the image is there afterwards (or was already)."""
    if engine.image(image) is not None:
        return True
    first = threading.Event()
    errors: list[str] = []  # what the engine said when the pull failed

    def pull() -> None:
        try:
            for chunk in engine.pull(image):
                if "error" in chunk or "errorDetail" in chunk:
                    errors.append(str(chunk.get("error") or chunk["errorDetail"].get("message", "")))
                    break
                first.set()
        except EngineRefused as e:
            errors.append(str(e))
        finally:
            first.set()

    log(f"base: asking the engine to pull {image} (waiting at most {fm.plain(answer_s)} s for the registry)")
    worker = threading.Thread(target=pull, name="specbench-pull", daemon=True)
    worker.start()
    if not first.wait(answer_s):
        log(f"base: no registry answered within {fm.plain(answer_s)} s")
        return False  # the thread is left to the engine's own timeout
    worker.join()
    if errors:
        log(f"base: {image} cannot be pulled ({(errors[0].strip().splitlines() or [''])[0][:160]})")
        return False
    return engine.image(image) is not None


_CAN_DEBOOTSTRAP = ('PATH="$PATH:/usr/sbin:/sbin"; command -v debootstrap >/dev/null && command -v docker >/dev/null '
                    '&& { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }')


def debootstrap_here() -> bool:
    """Can this machine run debootstrap (installed, and root or passwordless sudo)?"""
    found = shutil.which("debootstrap") or next((p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap")
                                                 if os.access(p, os.X_OK)), None)
    if not found:
        return False
    if os.geteuid() == 0:
        return True
    if shutil.which("sudo") is None:
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def debootstrap_on_host(engine: Engine) -> bool:
    """Can the engine's host run debootstrap and import the result with its docker CLI?"""
    code, _ = engine.run_host(["sh", "-c", _CAN_DEBOOTSTRAP], timeout=30)
    return code == 0


def mirror_from(text: str | None) -> str | None:
    """The Debian mirror named by an apt sources file (deb822 or one-line format)."""
    if not text:
        return None
    m = re.search(r"^URIs:\s*(\S+)", text, re.M) or re.search(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M)
    return m.group(1) if m and "security" not in m.group(1) else None


_SOURCES = ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list")


def host_mirror(read: Callable[[str], str | None] | None = None) -> str:
    """The Debian mirror a host's apt uses (so debootstrap reaches what apt reaches); this machine's by default."""

    def read_here(path: str) -> str | None:
        try:
            return Path(path).read_text()
        except OSError:
            return None

    for path in _SOURCES:
        found = mirror_from((read or read_here)(path))
        if found:
            return found
    return DEFAULT_MIRROR


# ---------------------------------------------------------------- making them


def _import_changes(role: str) -> list[str]:
    return [f"ENV {ENV_PATH}", f"LABEL {LABEL_PREFIX}.base={role}"]


def make_here(engine: Engine, role: str, tag: str, mirror: str, log: Callable[[str], None]) -> None:
    """debootstrap on this machine, then import the root filesystem into the engine through its API."""
    log(f"base: making {tag} with debootstrap here from {mirror} (about a minute)")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    with tempfile.TemporaryDirectory(prefix="specbench-base-") as tmp:
        tar = Path(tmp) / f"{role}.tar"
        try:
            proc = subprocess.run([*sudo, "sh", str(SCRIPT), str(tar), mirror, _suite(role),
                                   ",".join(_packages(role))],
                                  capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise KitError(f"base image {role}: debootstrap took over {DEBOOTSTRAP_TIMEOUT_S} s; is {mirror} "
                           "reachable?") from None
        if proc.returncode != 0:
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise KitError(f"base image {role}: debootstrap failed (exit {proc.returncode}): {tail}")
        engine.import_image(tar, tag, _import_changes(role))


def make_on_host(engine: Engine, role: str, tag: str, log: Callable[[str], None]) -> None:
    """debootstrap on the engine's own host over SSH (its architecture, its apt mirror) and `docker import` there:
    nothing but the short script crosses the connection."""
    mirror = host_mirror(engine.read_host_file)
    log(f"base: making {tag} with debootstrap on {engine.name} from {mirror} (a minute or more)")
    code, out = engine.run_host(["mktemp", "-d", "/tmp/specbench-base.XXXXXX"])
    folder = out.strip()
    if code != 0 or not folder.startswith("/tmp/specbench-base."):
        raise KitError(f"{engine.name}: cannot make a temporary folder under /tmp (mktemp exit {code})")
    engine.send_bytes(SCRIPT.read_bytes(), f"{folder}/make-rootfs.sh")
    q = shlex.quote
    sudo = 'if [ "$(id -u)" = 0 ]; then S=""; else S="sudo -n"; fi; '
    changes = " ".join(f"--change {q(c)}" for c in _import_changes(role))
    script = (f'{sudo}PATH="$PATH:/usr/sbin:/sbin"; $S sh {q(folder)}/make-rootfs.sh {q(folder)}/rootfs.tar '
              f'{q(mirror)} {_suite(role)} {q(",".join(_packages(role)))} >{q(folder)}/log 2>&1 '
              f'&& docker import {changes} {q(folder)}/rootfs.tar {q(tag)} >/dev/null 2>>{q(folder)}/log; rc=$?; '
              f'[ $rc = 0 ] || tail -3 {q(folder)}/log; $S rm -rf {q(folder)}; exit $rc')
    code, out = engine.run_host(["sh", "-c", script], timeout=DEBOOTSTRAP_TIMEOUT_S)
    if code != 0:
        tail = " | ".join(out.strip().splitlines()[-3:]) or f"exit {code}"
        raise KitError(f"base image {role} on {engine.name}: debootstrap or docker import failed: {tail}")


def make_from_registry(engine: Engine, role: str, tag: str, log: Callable[[str], None],
                       debian: str | None = None) -> None:
    """debian:<the role's suite> plus the role's packages, built by the engine with network (apt)."""
    debian = debian or f"debian:{_suite(role)}"
    log(f"base: making {tag} from {debian} with apt (network)")
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as tf:
        data = REGISTRY_DOCKERFILE.read_bytes()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    ctx.seek(0)
    last: list[str] = []
    try:
        for chunk in engine.build_image(ctx, tag, buildargs={"DEBIAN": debian, "PACKAGES": " ".join(_packages(role))},
                                        labels={f"{LABEL_PREFIX}.base": role}, network="host"):
            last = (last + chunk.get("stream", "").splitlines())[-5:]
            if "error" in chunk or "errorDetail" in chunk:
                msg = chunk.get("error") or chunk["errorDetail"].get("message", "")
                raise KitError(f"base image {role} from {debian} failed: {msg.strip()} ({' | '.join(last[-3:])})")
    except EngineRefused as e:
        raise KitError(f"base image {role} from {debian} failed: {e}") from None


def existing(engine: Engine, arch: str, backend: str = "cpu") -> BaseImages | None:
    """A backend's bases of this architecture already on the engine (either way of making them), registry ones
    first."""
    for b in candidates(arch, backend):
        if engine.image(b.builder) is not None and engine.image(b.runtime) is not None:
            return BaseImages(b.builder, b.runtime, f"{b.reason}, already on the engine")
    return None


def ensure(engine: Engine, log: Callable[[str], None] = print, mirror: str | None = None,
           backend: str = "cpu") -> BaseImages:
    """A backend's bases for the engine's architecture: reused when there, else made the way `decide` picks, or
    one line saying what is missing before anything is sent."""
    arch = engine_arch(engine)
    have = existing(engine, arch, backend)
    if have is not None:
        return have
    remote = engine.remote
    debian = debian_image(backend)
    registry = registry_answers(engine, debian, log=log)
    decision = decide(arch, local_arch(), registry,
                      debootstrap_host=remote and not registry and debootstrap_on_host(engine),
                      debootstrap_here=not registry and debootstrap_here(), remote=remote, host=engine.name,
                      debian=debian)
    if decision.problem:
        raise KitError(f"base images for {engine.name}: {decision.problem}")
    want = images_for(arch, decision.method or "debootstrap", backend)
    made = []
    for role, tag in zip(roles(backend), (want.builder, want.runtime), strict=True):
        if engine.image(tag) is not None:
            continue
        if decision.method == "registry":
            make_from_registry(engine, role, tag, log)
        elif decision.where == "host":
            make_on_host(engine, role, tag, log)
        else:
            make_here(engine, role, tag, mirror or host_mirror(), log)
        if engine.image(tag) is None:
            raise KitError(f"base image {role}: {tag} is not on {engine.name} after making it")
        log(f"base: {tag} ready")
        made.append(role)
    places = {"engine": "by the engine", "host": f"on {engine.name}", "here": "on this machine"}
    where = places[decision.where or "here"]
    return BaseImages(want.builder, want.runtime, f"{want.reason} ({', '.join(made) or 'none'} made now {where})")
