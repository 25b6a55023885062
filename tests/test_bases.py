"""Bases follow the target engine, for real on this machine: the registry question answered within its bound, the
decision it leads to, a base made with debootstrap on the engine's host over SSH, and the registry recipe built
on a Debian image (the debootstrap runtime base stands in for debian:bookworm, which no registry serves here)."""

from __future__ import annotations

import time
import uuid

import pytest

from harness.hosts.engine import LocalEngine
from harness.hosts.remote import RemoteEngine
from harness.image import bases


def test_this_machine_decides_from_what_it_finds(docker_client):
    started = time.monotonic()
    lines: list[str] = []
    registry = bases.registry_answers(LocalEngine(docker_client), log=lines.append)
    took = time.monotonic() - started
    assert took < bases.PULL_ANSWER_S + 5, took
    arch = bases.engine_arch(LocalEngine(docker_client))
    assert arch == bases.local_arch() and arch in ("amd64", "arm64")
    here = bases.debootstrap_here()
    d = bases.decide(arch, bases.local_arch(), registry, here, here, remote=False)
    if registry:
        assert (d.method, d.where) == ("registry", "engine")
    else:
        assert any("cannot be pulled" in ln or "no registry answered" in ln for ln in lines), lines
        assert (d.method, d.where) == (("debootstrap", "here") if here else (None, None))
    print(f"registry answers: {registry} ({took:.3f} s); debootstrap here: {here}; decision: {d}")


def test_ensure_gives_bases_of_the_engine_architecture(docker_client, demo_image):
    made = bases.ensure(LocalEngine(docker_client), log=lambda s: None)
    arch = bases.engine_arch(LocalEngine(docker_client))
    assert f"-{arch}-" in made.builder and f"-{arch}-" in made.runtime
    assert demo_image.plan["base_image"] == made.builder and demo_image.plan["arch"] == arch


def _remove(client, tag: str) -> None:
    try:
        client.images.remove(tag, force=True)
    except Exception:  # noqa: BLE001 - nothing to remove when making it failed
        pass


def test_debootstrap_on_the_host_over_ssh(sshd, docker_client, tmp_path):
    eng = RemoteEngine.connect(sshd["spec"], key_filename=sshd["client_key"], known_hosts=sshd["known_hosts"])
    tag = f"specbench/base-runtime:test-host-{uuid.uuid4().hex[:8]}"
    try:
        assert bases.debootstrap_on_host(eng)
        lines: list[str] = []
        bases.make_on_host(eng, "runtime", tag, lines.append)
        assert any(f"on {sshd['spec']}" in ln for ln in lines)
        img = docker_client.images.get(tag)
        assert img.labels.get("specbench.base") == "runtime"
        out = docker_client.containers.run(tag, ["sh", "-c", "ls /usr/lib/*/libgomp.so.1 && dpkg --print-architecture"],
                                           remove=True, network_mode="none").decode()
        assert "libgomp.so.1" in out and out.split()[-1] == bases.engine_arch(LocalEngine(docker_client))
        code, left = eng.run_host(["sh", "-c", "ls -d /tmp/specbench-base.* 2>/dev/null"])
        assert left.strip() == ""  # the host's temporary folder is gone
    finally:
        eng.close()
        _remove(docker_client, tag)


@pytest.mark.image
def test_registry_recipe_on_a_debian_image(docker_client, demo_image):
    debian = demo_image.plan["runtime_image"]  # a Debian bookworm image, as debian:bookworm would be
    tag = f"specbench/base-runtime:test-registry-{uuid.uuid4().hex[:8]}"
    try:
        bases.make_from_registry(LocalEngine(docker_client), "runtime", tag, lambda s: None, debian=debian)
        out = docker_client.containers.run(tag, ["sh", "-c", "dpkg -s libgomp1 ca-certificates | grep -c '^Status: "
                                                 "install ok installed'; echo $PATH"],
                                           remove=True, network_mode="none").decode().split()
        assert out[0] == "2" and out[1] == bases.ENV_PATH.split("=", 1)[1]
    finally:
        _remove(docker_client, tag)
