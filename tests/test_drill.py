"""Reliability drill: a server killed mid-request, a Docker engine stopped mid-run, an unwritable or full results
folder. The run records what happened, says so in one line, resumes, and leaves no container behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import pytest
import yaml

import docker
from harness import KitError
from harness.hosts.engine import LocalEngine
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, single_stream, trusted, write_manifest

pytestmark = pytest.mark.image


def _manifest(tmp_path, tasks, runs=1, n_predict=None):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] == "baseline"])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [dict(t, n_predict=n_predict or t["n_predict"]) for t in raw["tasks"] if t["id"] in tasks]
    raw["runs"] = runs
    return write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True), "drill.yaml")


def test_server_killed_mid_request_is_recorded_and_run_goes_on(tmp_path, demo_image, models_dir, docker_client):
    path = _manifest(tmp_path, ["long-ctx", "en-prose"])
    killed: list[str] = []

    def killer():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for c in docker_client.containers.list(filters={"label": ["specbench.run=kill",
                                                                      "specbench.task=long-ctx"]}):
                time.sleep(1.0)  # the long prompt is being processed: mid-request
                c.kill()
                killed.append(c.id)
                return
            time.sleep(0.05)

    t = threading.Thread(target=killer)
    t.start()
    out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="kill", seed=2,
                      progress=False, log=lambda s: None)
    t.join()
    assert killed, "the long-ctx container was never seen running"
    recs = {r["task"]: r for r in RunDir.open(tmp_path / "r" / "kill").measurements()}
    f = recs["long-ctx"]
    assert f["status"] == "failed" and f["failure"]["phase"] == "request"
    assert "server container" in f["failure"]["reason"] and f["container_id"] == killed[0]
    assert recs["en-prose"]["status"] == "ok"
    assert "1 ok, 1 failed" in out
    assert LocalEngine().kit_containers("kill") == []


@pytest.fixture()
def private_dockerd(tmp_path, demo_image, docker_client):
    """A second Docker engine of the test's own (own socket, data and exec roots), holding the demo image."""
    if not shutil.which("dockerd"):
        pytest.fail("dockerd is required")
    d = tmp_path / "dockerd"
    d.mkdir()
    sock = d / "docker.sock"
    exec_root = f"/tmp/sbx-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    args = ["dockerd", "--bridge=none", "--iptables=false", "--host", f"unix://{sock}", "--data-root",
            str(d / "data"), "--exec-root", exec_root, "--pidfile", str(d / "docker.pid")]
    procs: list[subprocess.Popen] = []

    def start() -> docker.DockerClient:
        log = open(d / "dockerd.log", "ab")
        procs.append(subprocess.Popen(args, stdout=log, stderr=log))
        deadline = time.monotonic() + 60
        while True:
            try:
                client = docker.DockerClient(base_url=f"unix://{sock}", timeout=120)
                client.ping()
                return client
            except Exception:  # noqa: BLE001 - not up yet
                if procs[-1].poll() is not None or time.monotonic() > deadline:
                    pytest.fail("private dockerd did not start: " + (d / "dockerd.log").read_text()[-600:])
                time.sleep(0.2)

    def stop() -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=60)

    client = start()
    client.images.load(b"".join(docker_client.images.get(demo_image.tag).save(named=True)))
    yield {"start": start, "stop": stop, "client": client}
    try:
        c = docker.DockerClient(base_url=f"unix://{sock}", timeout=30)
        c.ping()
        for ctr in c.containers.list(all=True):
            ctr.remove(force=True)
    except Exception:  # noqa: BLE001 - already stopped
        pass
    stop()
    # dockerd leaves its own mounts (data root, network namespace) under the two roots: undo exactly those
    prefixes = (str(d), exec_root)
    mounts = [line.split()[1] for line in open("/proc/mounts") if line.split()[1].startswith(prefixes)]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", m], capture_output=True)
    shutil.rmtree(exec_root, ignore_errors=True)


def test_dockerd_stopped_mid_run_then_resumed(tmp_path, models_dir, private_dockerd):
    path = _manifest(tmp_path, ["zh-prose", "en-prose", "code-gen", "reasoning"], runs=2, n_predict=64)
    engine = LocalEngine(private_dockerd["client"])
    stopper_done = threading.Event()

    def stopper():
        mfile = tmp_path / "r" / "drop" / "measurements.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if mfile.exists() and len(mfile.read_text().splitlines()) >= 3:
                private_dockerd["stop"]()
                break
            time.sleep(0.05)
        stopper_done.set()

    threading.Thread(target=stopper, daemon=True).start()
    with pytest.raises(KitError) as e:
        runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="drop", seed=4,
                    progress=False, engines=[engine], log=lambda s: None)
    stopper_done.wait(30)
    msg = str(e.value)
    assert "\n" not in msg and "resume with `invoke run --resume drop`" in msg
    first = RunDir.open(tmp_path / "r" / "drop").measurements()
    assert 3 <= len(first) < 8 and all(r["status"] == "ok" for r in first)
    client = private_dockerd["start"]()
    out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, resume="drop", progress=False,
                      engines=[LocalEngine(client)], log=lambda s: None)
    assert f"{len(first)} already recorded" in out
    final = RunDir.open(tmp_path / "r" / "drop").measurements()
    assert len(final) == 8 == len({r["measurement_id"] for r in final})
    assert client.containers.list(all=True, filters={"label": "specbench.run=drop"}) == []


def test_unwritable_results_folder_fails_before_starting(tmp_path, models_dir, docker_client):
    path = _manifest(tmp_path, ["en-prose"])
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    target = ro / "results"
    if os.geteuid() == 0:
        # root writes through mode bits: make the path a file instead, which nobody can make a folder of
        target = tmp_path / "file"
        target.write_text("x")
    with pytest.raises(KitError, match="results folder .* is not writable"):
        runner.run(trusted(path), results_dir=target, models_dir=models_dir, run_id="ro", progress=False,
                    log=lambda s: None)
    assert LocalEngine().kit_containers("ro") == []


def test_full_disk_fails_before_starting(tmp_path, models_dir):
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)]).returncode != 0:
        pytest.fail("mounting a small tmpfs (as root) is needed to simulate a full disk")
    try:
        (mnt / "filler").write_bytes(b"\0" * 32 * 1024)
        path = _manifest(tmp_path, ["en-prose"])
        with pytest.raises(KitError, match=r"results folder .* has .* free"):
            runner.run(trusted(path), results_dir=mnt / "results", models_dir=models_dir, run_id="full", progress=False,
                        log=lambda s: None)
    finally:
        subprocess.run(["umount", str(mnt)])
