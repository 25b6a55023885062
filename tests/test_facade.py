"""What the kit asks of an engine, through the Engine interface alone (the fake engine, tests/fake_engine.py): finding
an image by what it is, building one, the bandwidth probe, the CUDA version check, the Debian bases, the doctor's
checks and the facts recorded beside a run. The same calls against a real engine: tests/test_build.py,
tests/test_images.py, tests/test_probe.py, tests/test_bases.py."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import yaml

from harness import KitError
from harness.hosts import environment
from harness.hosts.engine import Engine, EngineRefused, Finished, Image
from harness.image import bases, build, cuda_image, images
from harness.intake import manifest as mf
from harness.run import bandwidth, doctor
from tests.conftest import DEMO, SPARK, trusted, write_manifest
from tests.fake_engine import FakeEngine, base_images, demo_image, fake

DEMO_M = mf.load(DEMO)

#: Engine operations the fake takes as they are: they read this machine's files or ask other operations.
INHERITED = {"architecture", "cpu_count", "load_average", "models_dir", "place_models", "read_head"}


def _public(cls: type) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_fake_engine_answers_every_engine_operation_itself():
    """A new Engine operation must be answered by the fake too, or the scheduling tests would reach for Docker."""
    ops = set().union(*(_public(c) for c in Engine.__mro__ if c is not object))
    assert ops - _public(FakeEngine) == INHERITED
    for name in ops & _public(FakeEngine):
        assert list(inspect.signature(getattr(FakeEngine, name)).parameters) == \
            list(inspect.signature(getattr(Engine, name)).parameters), name


def test_an_image_id_is_shortened_as_docker_shows_it():
    img = Image("sha256:" + "0123456789abcdef" * 4, ("t:1",), {}, None, 0, None)
    assert img.short_id == "sha256:0123456789ab" and dataclasses.replace(img, id="abcdef0123456789").short_id == \
        "abcdef012345"
    assert Finished(0, "out\n", "err\n").text == "out\nerr\n"


# ---------------------------------------------------------------- finding an image by what it is


def test_the_newest_image_of_the_same_build_is_found_and_others_are_not():
    old = demo_image(DEMO_M, "sha256:" + "1" * 64)
    new = dataclasses.replace(demo_image(DEMO_M, "sha256:" + "2" * 64), created="2027-01-01T00:00:00Z")
    untagged = dataclasses.replace(demo_image(DEMO_M, "sha256:" + "3" * 64), tags=(), created="2028-01-01T00:00:00Z")
    cuda = dataclasses.replace(demo_image(DEMO_M, "sha256:" + "4" * 64),
                               labels={**old.labels, "specbench.backend": "cuda"})
    eng = FakeEngine(images=[old, untagged, new, cuda])
    found = images.find(eng, DEMO_M)
    assert found is not None and found.image.id == new.id and found.tag == new.tags[0]
    assert found.build_plan.labels["specbench.plan-key"] == new.labels["specbench.plan-key"]
    assert images.find(FakeEngine(images=[untagged, cuda]), DEMO_M) is None


def test_an_image_of_another_architecture_does_not_serve(world):
    arm = demo_image(DEMO_M, arch="arm64")
    assert images.find(FakeEngine(images=[arm]), DEMO_M) is None  # the engine says x86_64
    assert images.find(FakeEngine(images=[demo_image(DEMO_M)]), DEMO_M) is not None


def test_a_found_images_record_is_made_once_and_then_read_back(world):
    eng = fake()
    asked: list[list[str]] = []
    eng.run_container = lambda image, command, labels, **kw: asked.append(command) or Finished(0, "", "version: 7")
    rec = images.record(eng, DEMO_M, host="local")
    assert rec.reused and rec.server_version == "version: 7" and rec.image_id == eng.image(rec.tag).id
    again = images.record(eng, DEMO_M, host="h2")
    assert asked == [["llama-server", "--version"]] and again.host == "h2" and again.plan == rec.plan


# ---------------------------------------------------------------- building


def _tree(tmp_path):
    src = tmp_path / "llama.cpp"
    (src / "tools" / "server").mkdir(parents=True, exist_ok=True)
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14)\nproject(fake)\n")
    (src / "tools" / "server" / "server.cpp").write_text("int main() { return 0; }\n")
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"path": str(src)}
    return trusted(write_manifest(tmp_path / "m", yaml.safe_dump(raw)), True)


@pytest.fixture()
def cache(tmp_path, monkeypatch, world):
    monkeypatch.setattr(build, "CACHE", tmp_path / "cache")
    return tmp_path / "cache"


def test_an_image_already_on_the_engine_is_reused_without_building(cache):
    eng = fake(images=[demo_image(DEMO_M), *base_images()])
    rec = build.build(eng, trusted(DEMO), log=lambda s: None)
    assert rec.reused and rec.build_seconds is None and eng.built == []


def test_a_build_sends_the_context_and_records_the_image_it_tagged(tmp_path, cache):
    eng = FakeEngine(images=base_images())
    lines: list[str] = []
    rec = build.build(eng, _tree(tmp_path), log=lines.append)
    (sent,) = eng.built
    assert sent["network"] == "none" and sent["tag"] == rec.tag and sent["labels"]["specbench.backend"] == "cpu"
    assert not rec.reused and rec.image_id == eng.image(rec.tag).id and rec.build_seconds is not None
    assert rec.server_version.startswith("version: 11434") and any(ln.startswith("build: context") for ln in lines)
    assert json.loads((cache / "builds" / f"{rec.tag.split(':')[-1]}-local.json").read_text())["tag"] == rec.tag
    assert images.find(eng, _tree(tmp_path).manifest) is not None  # what was built is found by what it is


def test_a_failed_build_is_one_error_with_the_last_log_lines(tmp_path, cache):
    eng = FakeEngine(images=base_images(), mode="build-fails")
    with pytest.raises(KitError) as e:
        build.build(eng, _tree(tmp_path), log=lambda s: None)
    said = str(e.value)
    assert said.startswith("build failed: The command '/bin/sh -c cmake' returned a non-zero code: 1")
    assert "last log lines" in said and "CMake Error at CMakeLists.txt:1" in said


def test_bases_already_on_the_engine_are_used_as_they_are():
    made = bases.ensure(FakeEngine(images=base_images()), log=lambda s: None)
    assert (made.builder, made.runtime) == tuple(i.tags[0] for i in base_images())
    assert made.reason.endswith("already on the engine")


def test_without_a_registry_or_debootstrap_the_bases_are_one_line_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(bases, "debootstrap_here", lambda: False)
    lines: list[str] = []
    with pytest.raises(KitError) as e:
        bases.ensure(FakeEngine(), log=lines.append)
    assert "no registry answers for debian:bookworm" in str(e.value) and "apt-get install debootstrap" in str(e.value)
    assert any("cannot be pulled (pull access denied for debian: no registry here)" in ln for ln in lines)


# ---------------------------------------------------------------- one-off containers: the probe, the CUDA check


@pytest.mark.parametrize("backend, out, gbs", [
    ("cpu", '{"kind": "cpu-stream", "triad_gbs": 12.5, "threads": 2}', 12.5),
    ("cuda", '{"kind": "cuda-copy", "copy_gbs": 250.0}', 250.0),
])
def test_the_bandwidth_probe_reads_the_last_line_of_what_it_printed(world, backend, out, gbs):
    eng = fake()
    asked = {}

    def run_container(image, command, labels, **kw):
        asked.update(command=command, labels=labels, **kw)
        return Finished(0, f"warming up\n{out}\n", "some noise on stderr\n")

    eng.run_container = run_container
    rec = bandwidth.measure(eng, "img:1", backend, "demo-cpu")
    assert rec["gbs"] == gbs and rec["host"] == "local" and bandwidth.latest("demo-cpu", "local")["gbs"] == gbs
    assert asked["access"].gpu_request == (backend == "cuda") and asked["labels"] == {"specbench.role": "probe"}
    assert asked["command"][0] == ("specbench-probe-cuda" if backend == "cuda" else "specbench-probe")


def test_a_probe_that_fails_says_what_it_printed_on_stderr(world):
    eng = fake()
    eng.run_container = lambda *a, **kw: Finished(1, "", "probe: cannot allocate 256 MiB x 3\n")
    with pytest.raises(KitError, match=r"^probe failed on local: probe: cannot allocate 256 MiB x 3$"):
        bandwidth.measure(eng, "img:1", "cpu", "demo-cpu")


def test_the_cuda_version_check_falls_back_to_no_gpu_and_names_the_missing_driver():
    eng = fake()
    eng.info = lambda: {**FakeEngine.info(eng), "Runtimes": {"nvidia": {}, "runc": {}}}
    tried: list[bool] = []
    missing = ("llama-server: error while loading shared libraries: libcuda.so.1: cannot open shared object file: "
               "No such file or directory\n")

    def run_container(image, command, labels, *, access=None, **kw):
        gpu = access is not None and access.gpu_request
        tried.append(gpu)
        if gpu:
            raise EngineRefused("could not select device driver \"\" with capabilities: [[gpu]]")
        return Finished(127, "", missing)

    eng.run_container = run_container
    assert cuda_image.has_nvidia_runtime(eng)
    said = cuda_image.server_version(eng, "img:cuda")
    assert tried == [True, False] and said.startswith("no NVIDIA driver: libcuda.so.1 is not in the container")


# ---------------------------------------------------------------- readiness and the facts of a host


def test_the_doctor_reads_the_engine_and_finds_the_image():
    items = {i.name: i for i in doctor.check(fake(), DEMO_M, DEMO.parent, models=False)}
    assert items["docker"].ok and items["docker"].detail == "engine 20.10.fake (API 1.41) on Fake Linux, 2 CPUs"
    assert items["gpu"].ok and not items["gpu"].fatal and items["disk"].ok
    assert items["image"].ok and "llama.cpp b11434" in items["image"].detail
    doctor.require_ready(fake(), DEMO_M, DEMO.parent)


def test_a_cuda_manifest_on_a_host_without_gpu_or_nvidia_runtime_is_not_ready():
    eng = FakeEngine(images=[])
    items = {i.name: i for i in doctor.check(eng, mf.load(SPARK), DEMO.parent, models=False)}
    assert not items["gpu"].ok and items["gpu"].fatal
    assert not items["nvidia runtime"].ok and "runtimes: runc" in items["nvidia runtime"].detail
    assert not items["image"].ok and not items["image"].fatal
    with pytest.raises(KitError) as e:
        doctor.require_ready(eng, mf.load(SPARK), DEMO.parent)
    said = str(e.value)
    assert said.startswith("local is not ready: gpu: nvidia-smi not found") and "nvidia runtime" in said
    assert "\n" not in said and "image" not in said.split("nvidia runtime")[1]


def test_the_facts_of_a_host_come_from_its_engine_and_its_files():
    eng = fake("spark")
    f = environment.facts(eng, demo_image(DEMO_M).tags[0])
    assert (f["host"], f["hostname"], f["cpus"], f["architecture"]) == ("spark", "fake-spark", 2, "x86_64")
    assert f["cpu_model"] == "Fake CPU @ 2.0GHz" and f["memory_bytes"] == 25165824 * 1024
    assert f["docker_version"] == "20.10.fake" and f["runtimes"] == ["runc"] and f["gpus"] == []
    assert f["image"]["id"] == demo_image(DEMO_M).id and f["image"]["labels"]["specbench.backend"] == "cpu"
    assert environment.facts(eng, "not:there")["image"] == {"tag": "not:there", "id": None}
