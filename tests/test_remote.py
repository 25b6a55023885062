"""The remote path through a real sshd on loopback, against this machine's own Docker engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from harness import ROOT, KitError
from harness.hosts.engine import LocalEngine
from harness.hosts.remote import RemoteEngine, engines_for
from harness.image import build as bd
from harness.report import results as rp
from harness.run import doctor as doc
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, _free_port, first_takes, single_stream, trusted, write_manifest


def _remote(sshd, tmp_path, **kw) -> RemoteEngine:
    return RemoteEngine.connect(sshd["spec"], key_filename=sshd["client_key"], known_hosts=sshd["known_hosts"],
                                remote_models=str(tmp_path / "remote-models"), **kw)


def test_unknown_host_key_is_refused(sshd, tmp_path):
    with pytest.raises(KitError, match=r"unknown host key: refusing to connect; .*ssh-keyscan -p \d+ 127.0.0.1"):
        RemoteEngine.connect(sshd["spec"], key_filename=sshd["client_key"])


def test_mismatched_host_key_is_refused(sshd, tmp_path):
    other = tmp_path / "kh"
    pub = open(sshd["client_key"] + ".pub").read().split()
    other.write_text(f"[127.0.0.1]:{sshd['port']} {pub[0]} {pub[1]}\n")
    with pytest.raises(KitError, match="host key does not match known_hosts"):
        RemoteEngine.connect(sshd["spec"], key_filename=sshd["client_key"], known_hosts=str(other))


def test_wrong_key_is_refused(sshd):
    with pytest.raises(KitError, match=r"authentication failed .*check the key \(--ssh-key\)"):
        RemoteEngine.connect(sshd["spec"], key_filename=sshd["wrong_key"], known_hosts=sshd["known_hosts"])


def test_refused_connection(sshd):
    port = _free_port()
    with pytest.raises(KitError, match=f"127.0.0.1:{port}: connection refused"):
        RemoteEngine.connect(f"{sshd['user']}@127.0.0.1:{port}", key_filename=sshd["client_key"],
                             known_hosts=sshd["known_hosts"])


def test_cli_error_is_one_line(sshd):
    res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "doctor", "--host", sshd["spec"],
                          "--ssh-key", sshd["wrong_key"], "--known-hosts", sshd["known_hosts"]],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1 and "authentication failed" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.image
def test_remote_doctor_build_run_report(sshd, tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] in ("baseline", "ngram-mod")])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [t for t in raw["tasks"] if t["id"] in ("en-prose", "json-out")]
    raw["runs"] = 2
    path = write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True), "remote.yaml")
    from harness.intake import manifest as mf

    m = mf.load(path)
    eng = _remote(sshd, tmp_path)
    try:
        assert eng.name == sshd["spec"]
        items = {i.name: i for i in doc.check(eng, m, models_dir)}
        assert items["docker"].ok and "API" in items["docker"].detail
        assert items["model target"].ok and "sent over SSH" in items["model target"].detail
        assert items["gpu"].ok  # cpu backend: no GPU needed
        rec = bd.build(eng, trusted(m), log=lambda s: None, host=eng.name)
        assert rec.reused and rec.host == eng.name and rec.image_id == demo_image.image_id
        out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="remote", seed=3,
                          progress=False, engines=[eng], log=lambda s: None)
        assert "8 ok, 0 failed" in out
        assert eng.endpoint(1).via == "ssh-tunnel"  # llama-server is reached through the SSH connection
        items = {i.name: i for i in doc.check(eng, m, models_dir)}
        assert items["model target"].ok and "sha256 ok" in items["model target"].detail
    finally:
        eng.close()
    recs = RunDir.open(tmp_path / "r" / "remote").measurements()
    assert len(recs) == 8 and {r["host"] for r in recs} == {sshd["spec"]}
    assert all(r["measurement_id"].startswith(sshd["spec"] + "/") for r in recs)
    for r in recs:
        cmd = r["server_command"]
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
        assert cmd[cmd.index("-m") + 1].startswith("/models/")
    assert LocalEngine().kit_containers("remote") == []
    meta = json.loads((tmp_path / "r" / "remote" / "run.json").read_text())
    assert sshd["spec"] in meta["environment"] and meta["plan"]["hosts"] == [sshd["spec"]]
    written = rp.write([tmp_path / "r" / "remote"], tmp_path / "R.md")
    assert any(p.name == "summary.json" for p in written)
    assert sshd["spec"] in (tmp_path / "R.md").read_text()


@pytest.mark.image
def test_two_hosts_in_parallel_side_by_side(sshd, tmp_path, demo_image, models_dir):
    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] in ("baseline", "ngram-mod")])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [t for t in raw["tasks"] if t["id"] == "json-out"]
    raw["runs"] = 2
    path = write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True), "two.yaml")
    engines = engines_for(["local", sshd["spec"]], ssh_key=sshd["client_key"], known_hosts=sshd["known_hosts"],
                          remote_models=str(tmp_path / "remote-models"))
    try:
        for e in engines:
            from harness.intake import manifest as mf

            bd.build(e, trusted(mf.load(path)), log=lambda s: None, host=e.name)
        runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="two", seed=5,
                    progress=False, engines=engines, log=lambda s: None)
    finally:
        for e in engines:
            e.close()
    recs = RunDir.open(tmp_path / "r" / "two").measurements()
    assert len(recs) == 8 and {r["host"] for r in recs} == {"local", sshd["spec"]}
    assert all(r["status"] == "ok" for r in recs)
    assert sorted(r["order"] for r in recs) == list(range(8))
    rp.write([tmp_path / "r" / "two"], tmp_path / "R.md")
    text = (tmp_path / "R.md").read_text()
    assert "| local: baseline " in text and f"| {sshd['spec']}: ngram-mod " in text


@pytest.mark.image
def test_host_dropping_mid_run_is_resumable(sshd, tmp_path, demo_image, models_dir):
    import threading
    import time

    raw = yaml.safe_load(DEMO.read_text())
    raw["strategies"] = single_stream([s for s in raw["strategies"] if s["id"] == "baseline"])
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [dict(t, n_predict=64) for t in raw["tasks"] if t["id"] in ("zh-prose", "en-prose", "code-gen")]
    raw["runs"] = 2
    path = write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True), "drop.yaml")
    from harness.intake import manifest as mf

    eng = _remote(sshd, tmp_path)
    bd.build(eng, trusted(mf.load(path)), log=lambda s: None, host=eng.name)
    mfile = tmp_path / "r" / "rdrop" / "measurements.jsonl"

    def drop():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if mfile.exists() and len(mfile.read_text().splitlines()) >= 2:
                eng.conn.client.close()  # the network goes away under the run
                return
            time.sleep(0.02)

    threading.Thread(target=drop, daemon=True).start()
    with pytest.raises(KitError) as e:
        runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="rdrop", seed=1,
                    progress=False, engines=[eng], log=lambda s: None)
    assert "\n" not in str(e.value) and "resume with `invoke run --resume rdrop`" in str(e.value)
    first = RunDir.open(tmp_path / "r" / "rdrop").measurements()
    assert 2 <= len(first_takes(first)) < 6
    eng2 = _remote(sshd, tmp_path)
    try:
        out = runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, resume="rdrop",
                          progress=False, engines=[eng2], log=lambda s: None)
    finally:
        eng2.close()
    assert f"{len(first_takes(first))} already recorded" in out
    final = RunDir.open(tmp_path / "r" / "rdrop").measurements()
    # every planned measurement once (a measurement disturbed by other work may be retaken beside it)
    assert len(first_takes(final)) == 6
    assert len(final) == len({r["measurement_id"] for r in final})
    assert LocalEngine().kit_containers("rdrop") == []


@pytest.mark.image
def test_cli_build_run_report_with_host(sshd, tmp_path, demo_image, models_dir):
    ssh = ["--host", sshd["spec"], "--ssh-key", sshd["client_key"], "--known-hosts", sshd["known_hosts"],
           "--remote-models", str(tmp_path / "remote-models")]

    def invoke(*args):
        res = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    out = invoke("build", *ssh)
    assert f"{sshd['spec']}: image specbench/llama-server:cpu-" in out and "reused" in out
    out = invoke("doctor", *ssh, "--models-dir", str(models_dir))
    assert "ok   docker:" in out and "FAIL" not in out
    invoke("run", *ssh, "--models-dir", str(models_dir), "--results", str(tmp_path / "r"), "--run-id", "cli",
           "--strategy", "baseline,ngram-mod", "--task-id", "json-out", "--runs", "1", "--no-progress")
    invoke("report", str(tmp_path / "r" / "cli"), "--out", str(tmp_path / "R.md"))
    recs = RunDir.open(tmp_path / "r" / "cli").measurements()
    assert len(recs) == 2 and all(r["host"] == sshd["spec"] and r["status"] == "ok" for r in recs)
    assert "ngram-mod" in (tmp_path / "R.md").read_text()


def test_docker_api_over_the_ssh_connection_directly(sshd):
    """The SSH adapter on its own: the Docker SDK's API calls travel over the Fabric connection, through one
    small pool (sshd allows 10 sessions per connection)."""
    from harness.hosts.remote import POOL_SIZE, docker_over, open_connection

    conn = open_connection(sshd["spec"], key_filename=sshd["client_key"], known_hosts=sshd["known_hosts"])
    try:
        client = docker_over(conn)
        for _ in range(3 * POOL_SIZE):
            assert client.ping()
        assert client.version()["ApiVersion"]
        pool = client.api.get_adapter("http+docker://ssh").pools["all"]
        assert pool.pool.qsize() <= POOL_SIZE
    finally:
        conn.close()
