"""Every task, as `invoke --list` lists it, when what it needs is not there: no Docker engine, a Docker socket that
refuses permission, an unreachable host, and a host whose sshd offers no SFTP. Each failure is one line that names
the problem and the fix, exit code 1, no traceback; a task that does not need what is missing still works."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import ROOT
from tests.conftest import _free_port

#: Tasks that talk to a Docker engine (all but these work without one).
ENGINE_TASKS = {"build", "run", "doctor", "clean", "probe", "reproduce"}


def _tasks() -> list[str]:
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "--list", "--list-format", "json"],
                         capture_output=True, text=True, timeout=60, check=True)
    return [t["name"] for t in json.loads(res.stdout)["tasks"]]


def _valid_args(task: str, tmp: Path) -> list[str]:
    """Arguments that make each task do its real work (required ones included), writing only under `tmp`."""
    run_copy = tmp / "runs" / "demo-cpu"
    if not run_copy.exists():
        shutil.copytree(ROOT / "results" / "demo-cpu", run_copy)
    return {
        "validate": [],
        "models": ["--models-dir", str(tmp / "models"), "--no-download"],
        "build": [],
        "doctor": ["--models-dir", str(tmp / "models")],
        "run": ["--models-dir", str(tmp / "models"), "--results", str(tmp / "results"), "--strategy", "baseline",
                "--task-id", "json-out", "--runs", "1", "--no-progress"],
        "report": [str(run_copy), "--out", str(tmp / "R.md"), "--no-plot"],
        # only a run id no container carries: other work may share this engine
        "clean": ["--run-id", "no-such-run-firsthour"],
        "bundle": [str(run_copy), "--out", str(tmp / "b.tar.gz")],
        "reproduce": [str(ROOT / "manifests" / "demo-cpu.yaml"), "--workdir", str(tmp / "rep"), "--models-dir",
                      str(tmp / "models"), "--no-progress"],
        "compare": [str(run_copy), str(run_copy)],
        "probe": ["--size-mib", "16"],
        # the committed real-text run holds the perturbation task
        "sensitivity": [str(ROOT / "results" / "real-gemma3-270m")],
    }[task]


def _invoke(args: list[str], env: dict[str, str] | None = None, prefix: list[str] | None = None,
            timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    res = subprocess.run([*(prefix or []), sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
                         capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return res, time.monotonic() - started


def _one_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-2000:]
    assert res.returncode == 1, (res.returncode, res.stdout[-500:], res.stderr[-1000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_the_sweep_covers_every_task():
    assert set(_tasks()) == {"validate", "models", "build", "doctor", "run", "report", "clean", "bundle",
                             "reproduce", "compare", "probe", "sensitivity"}


def test_every_task_without_a_docker_engine(tmp_path):
    dead = f"unix://{tmp_path / 'no-engine.sock'}"
    seen = {}
    for task in _tasks():
        res, took = _invoke([task, *_valid_args(task, tmp_path)], env={"DOCKER_HOST": dead})
        if task in ENGINE_TASKS:
            seen[task] = (_one_line(res, f"no Docker engine answers at {dead}", "start one"), round(took, 1))
        else:
            assert res.returncode == 0, (task, res.stdout[-500:], res.stderr[-1000:])
    print(json.dumps(seen, indent=1), file=sys.stderr)
    assert set(seen) == ENGINE_TASKS


def test_every_task_with_a_docker_socket_that_refuses_permission(tmp_path):
    path = tmp_path / "docker.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    os.chmod(path, 0)
    # root passes a mode-000 socket: drop the capabilities that let it, as an ordinary user would not have them
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps",
              "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    if prefix and shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to test a refused Docker socket as root")
    try:
        for task in sorted(ENGINE_TASKS):
            res, _ = _invoke([task, *_valid_args(task, tmp_path)], env={"DOCKER_HOST": f"unix://{path}"},
                             prefix=prefix)
            _one_line(res, "permission denied on the Docker socket", "docker group")
    finally:
        listener.close()


def _host_tasks() -> list[str]:
    return [t for t in _tasks() if "--host" in _invoke(["--help", t])[0].stdout]


def test_every_host_task_with_an_unreachable_host(tmp_path, sshd):
    tasks = _host_tasks()
    assert set(tasks) == {"build", "doctor", "run", "clean", "probe"}
    for task in tasks:
        for spec, needle in [(f"root@127.0.0.1:{_free_port()}", "connection refused"),
                             ("root@no-such-host.invalid", "does not resolve")]:
            res, took = _invoke([task, *_valid_args(task, tmp_path), "--host", spec, "--ssh-key", sshd["client_key"],
                                 "--known-hosts", sshd["known_hosts"]])
            line = _one_line(res, needle)
            assert took < 30, (task, spec, took, line)


@pytest.mark.image
def test_every_host_task_against_an_sshd_without_sftp(tmp_path, sshd_nosftp, demo_image, models_dir):
    """No SFTP: model files go over the SSH exec channel, so every task works; where writing there cannot work
    either, one line says what to fix."""
    import paramiko

    from harness.hosts.remote import open_connection

    conn = open_connection(sshd_nosftp["spec"], key_filename=sshd_nosftp["client_key"],
                           known_hosts=sshd_nosftp["known_hosts"])
    with pytest.raises(paramiko.SSHException):  # the sshd really offers no SFTP
        conn.client.open_sftp()
    conn.close()
    ssh = ["--host", sshd_nosftp["spec"], "--ssh-key", sshd_nosftp["client_key"], "--known-hosts",
           sshd_nosftp["known_hosts"]]
    remote_models = tmp_path / "remote-models"
    shutil.copytree(models_dir, tmp_path / "models")
    for task in _host_tasks():
        res, _ = _invoke([task, *_valid_args(task, tmp_path), *ssh, "--remote-models", str(remote_models)])
        assert res.returncode == 0 and "Traceback" not in res.stderr, (task, res.stdout[-800:], res.stderr[-1500:])
        if task == "run":
            assert "sending tiny-target.gguf" in res.stdout and "1 ok, 0 failed" in res.stdout
    # `run --strategy baseline` sends the one model it measures with, no drafter
    sent = [p.relative_to(remote_models).parts for p in remote_models.rglob("*") if p.is_file()]
    assert [(top, name) for top, _, name in sent] == [(".specbench-sent", "tiny-target.gguf")]  # the kit's own folder
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")
    res, _ = _invoke(["run", *_valid_args("run", tmp_path), *ssh, "--remote-models", str(blocked / "models")])
    _one_line(res, "cannot make the models folder", "--remote-models")
