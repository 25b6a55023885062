"""harness.run.interference: parsers and the disturbed rule on their own, then real samples around a real container
with a real busy loop started and stopped here by pid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jsonschema
import pytest

from harness import SCHEMAS
from harness.hosts.engine import LocalEngine
from harness.run import interference as itf

# -- parsers and the rule -----------------------------------------------------------------------------------

PROC_STAT = """cpu  57592 10 8401 375093 1029 5 234 51 0 0
cpu0 28000 5 4200 187000 500 2 117 25 0 0
cpu1 29592 5 4201 188093 529 3 117 26 0 0
intr 1 2 3
"""


def test_proc_stat():
    h = itf.parse_proc_stat(PROC_STAT)
    assert h.cpus == 2
    assert h.busy == 57592 + 10 + 8401 + 5 + 234
    assert h.steal == 51
    assert h.total == 57592 + 10 + 8401 + 375093 + 1029 + 5 + 234 + 51


def test_cgroup_usage_v1_and_v2():
    assert itf.parse_cgroup_usage("1500000000\n") == (1.5, "cgroup v1")
    assert itf.parse_cgroup_usage("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n") == \
        (2.5, "cgroup v2")
    assert itf.parse_cgroup_usage("cat: no such file") is None


def test_cgroup_files_only_for_the_container():
    cid = "78245ae54a7b3a08337441efe6bc38032b7a5c76b91790b628cf0ee2e0c68e40"
    v1 = f"2:cpuacct:/docker/{cid}\n1:cpu:/docker/{cid}\n0::/docker/{cid}\n"
    files = itf.cgroup_files(v1, cid)
    assert f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage" in files
    assert f"/sys/fs/cgroup/docker/{cid}/cpu.stat" in files
    v2 = f"0::/system.slice/docker-{cid}.scope\n"
    assert itf.cgroup_files(v2, cid)[0] == f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"
    # Another pid namespace's process: its cgroup does not name the container, so nothing is trusted.
    assert itf.cgroup_files("0::/user.slice/session-3.scope\n", cid) == []


def test_gpu_apps_and_frequency():
    # nvidia-smi cannot run here (no GPU): its documented CSV output stands in.
    out = "4242, 20480\n5151, 512\n"
    assert itf.parse_gpu_apps(out) == [{"pid": 4242, "used_memory_mib": 20480.0},
                                       {"pid": 5151, "used_memory_mib": 512.0}]
    freq, thr = itf.parse_freq_throttle("2400000\n3100000\n---\n0\n3\n")
    assert freq == [2400.0, 3100.0] and thr == 3
    assert itf.parse_freq_throttle("---\n") == (None, None)


def edge(at: float, busy: int, total: int, container: float | None, **kw) -> itf.Sample:
    defaults = {"client_s": None, "freq_mhz": None, "throttle_count": None, "gpu_other_apps": None,
                "gpu_util_pct": None}
    defaults.update(kw)
    return itf.Sample(at, itf.HostCpu(4, busy, 0, total), container, "host cgroup v2", **defaults)


def test_disturbed_rule():
    # 2 s on 4 CPUs = 800 ticks; the host was busy 300 ticks = 3 s; the container used 2.5 s: others 0.5 s.
    f = itf.figure(edge(0, 0, 0, 10.0), edge(2, 300, 800, 12.5))
    assert f.window_s == 2 and f.host_busy_s == 3 and f.container_s == 2.5
    assert f.others_s == 0.5 and f.others_cores == 0.25 and f.others_fraction == 0.0625
    assert not f.disturbed  # exactly at the limit
    f = itf.figure(edge(0, 0, 0, 10.0), edge(2, 310, 800, 12.5))
    assert f.disturbed and "0.30 cores" in f.reasons[0]
    f = itf.figure(edge(0, 0, 0, 10.0, gpu_other_apps=[{"pid": 9, "used_memory_mib": 1.0}]),
                   edge(2, 250, 800, 12.5, gpu_other_apps=[]))
    assert f.disturbed and "pids 9" in f.reasons[0]
    f = itf.figure(edge(0, 0, 0, 10.0, throttle_count=4), edge(2, 250, 800, 12.5, throttle_count=6))
    assert f.throttled and f.disturbed


# -- real container, real busy loop -------------------------------------------------------------------------

@pytest.fixture()
def sleeper(docker_client, demo_image):
    c = docker_client.containers.run(demo_image.tag, ["sh", "-c", "sleep 120"], detach=True,
                                     network_mode="host", labels={"specbench.role": "interference-test"})
    try:
        yield c  # attrs as containers.run returns them: taken before the start, without a pid
    finally:
        c.remove(force=True)


def spin(seconds: float) -> float:
    """A busy loop in its own process, started and reaped here by pid; returns the CPU-seconds it used."""
    proc = subprocess.Popen([sys.executable, "-c", f"import time\nt = time.monotonic()\n"
                             f"while time.monotonic() - t < {seconds}: pass"])
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


@pytest.mark.image
def test_a_busy_loop_outside_the_container_is_seen(docker_client, sleeper):
    engine = LocalEngine(docker_client)
    before = itf.sample(engine, sleeper)
    hog = spin(2.0)
    after = itf.sample(engine, sleeper, edge="end")
    f = itf.figure(before, after)
    assert f.container_source.startswith("host cgroup")
    assert hog > 0.3, "the busy loop got almost no CPU"
    # Everything the loop used is others' work (less /proc/stat's 10 ms ticks per CPU at each edge).
    assert f.others_s >= hog - 0.05 * f.cpus
    assert f.container_s < 0.05  # a sleeping container
    assert f.disturbed and f.others_cores >= itf.DISTURBED_CORES


@pytest.mark.image
def test_the_containers_own_work_is_not_interference(docker_client, sleeper):
    engine = LocalEngine(docker_client)
    api = docker_client.api
    usage = lambda: api.stats(sleeper.id, stream=False, one_shot=True)["cpu_stats"]["cpu_usage"]["total_usage"]  # noqa: E731
    docker_before = usage()
    before = itf.sample(engine, sleeper)
    sleeper.exec_run(["timeout", "2", "sh", "-c", "while :; do :; done"])  # spins inside the container
    after = itf.sample(engine, sleeper, edge="end")
    docker_delta = (usage() - docker_before) / 1e9
    f = itf.figure(before, after)
    assert f.container_s > 0.3, "the loop in the container got almost no CPU"
    # The cgroup read from the host agrees with the Docker engine's own account of the container.
    assert f.container_s == pytest.approx(docker_delta, abs=0.1)
    assert f.others_s == pytest.approx(f.host_busy_s - f.container_s - (f.client_s or 0), abs=1e-3)


@pytest.mark.image
def test_exec_fallback_reads_the_same_counter(docker_client, sleeper):
    engine = LocalEngine(docker_client)
    host = itf.sample(engine, sleeper)
    caps = itf._capabilities(engine)
    caps.cgroup_file[sleeper.id] = None  # as on a host whose cgroup filesystem is not readable
    t = time.monotonic()
    via_exec = itf.sample(engine, sleeper)
    assert via_exec.container_source.startswith("exec cgroup")
    assert via_exec.container_s >= host.container_s
    # The exec itself runs in the container: a few ms of its CPU at most.
    assert via_exec.container_s - host.container_s < 0.2 + (time.monotonic() - t)


@pytest.mark.image
def test_around_fills_the_record_field(docker_client, sleeper):
    engine = LocalEngine(docker_client)
    with itf.around(engine, sleeper) as watched:
        assert watched.window is None
        time.sleep(0.3)
    figure = watched.window.as_dict()
    assert figure["window_s"] == pytest.approx(0.3, abs=0.1)
    assert set(figure) >= {"others_s", "others_cores", "container_s", "disturbed", "reasons", "sample_cost_s"}
    schema = json.loads((SCHEMAS / "result.schema.json").read_text())["properties"]["interference"]
    jsonschema.validate(json.loads(json.dumps(figure)), schema)
