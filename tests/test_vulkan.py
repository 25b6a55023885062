"""The GPU path on a software Vulkan device: the real Vulkan image, real lavapipe, real llama-server with every
layer offloaded, in real containers. Speed on lavapipe is not judged; the path is: the device each measurement ran
on, the layers offloaded, device memory, the device facts, the device's bandwidth, the same checks as the CPU demo."""

from __future__ import annotations

import pytest
import yaml

from harness import KitError, schema
from harness.analysis import summary as sm
from harness.hosts import devices
from harness.image import backends
from harness.image import vulkan_image as vk_image
from harness.intake import manifest as mf
from harness.report import results as rp
from harness.run import doctor, runner
from harness.store.rundir import RunDir
from tests.conftest import VULKAN, VULKAN_STRATEGIES, VULKAN_TASKS, write_manifest

pytestmark = pytest.mark.image


def test_the_image_loads_the_vulkan_backend_and_lists_the_software_device(vulkan_image, engine):
    assert vulkan_image.plan["backend"] == "vulkan" and "-DGGML_VULKAN=ON" in vulkan_image.plan["cmake_args"]
    labels = engine.image(vulkan_image.tag).labels
    assert labels["specbench.backend"] == "vulkan" and labels["specbench.runtime-image"].startswith(
        "specbench/base-vulkan-runtime:trixie-")
    assert "build 11434, commit b11434" in vulkan_image.server_version
    # the build check again, for an image the session found already built
    report = vulkan_image.vulkan_checks or vk_image.inspect(engine, vulkan_image.tag).as_dict()
    assert report["ok"], report["problems"]
    soft = [d for d in report["devices"] if d["software"]]
    assert soft and "llvmpipe" in soft[0]["name"] and "SOFTWARE device (Mesa lavapipe" in soft[0]["line"]
    assert any(x.startswith("Vulkan0: llvmpipe") for x in report["listed"]), report["listed"]


def test_vulkan_demo_run_offloads_every_layer_to_the_software_device(vulkan_run):
    rd = RunDir.open(vulkan_run)
    recs = rd.measurements()
    assert len([r for r in recs if not r.get("retake_of")]) == len(VULKAN_STRATEGIES) * len(VULKAN_TASKS) * 2
    for r in recs:
        assert schema.errors("result", r) == []
        assert r["status"] == "ok", r.get("failure")
        cmd = r["server_command"]
        assert cmd[cmd.index("-ngl") + 1] == "999" and cmd[cmd.index("-ngld") + 1] == "999"
        assert cmd[cmd.index("-lv") + 1] == "4"  # the load lines (device, layers, buffers) are at trace level
        d = r["device"]
        target = d["models"][0]
        assert target["device"] == "Vulkan0" and "llvmpipe" in target["description"]
        assert target["layers_offloaded"] == target["layers"] > 0  # every layer of the target on the device
        assert d["device_mib"] > 10  # the 11 MB target's weights at least
        assert r["interference"]["window_s"] > 0
    drafted = [r for r in recs if r["strategy"] == "draft-simple"]
    assert all(len(r["device"]["models"]) == 2 and r["device"]["models"][1]["layers_offloaded"] ==
               r["device"]["models"][1]["layers"] > 0 for r in drafted)  # -ngld 999: the drafter too
    for s in ("draft-simple", "ngram-mod"):
        assert sum(r["server"]["draft_n"] for r in recs if r["strategy"] == s) > 0, f"{s} drafted nothing"
    meta = rd.read_meta()
    facts = meta.environment["local"].devices
    assert facts["backend"] == "vulkan" and facts["chosen"] == 0
    assert facts["access"]["environment"]["GGML_VK_VISIBLE_DEVICES"] == "0"
    image_id = meta.build.image_id.split(":")[-1]  # the image's own shader cache
    assert facts["access"]["volumes"] == {f"specbench-mesa-shader-cache-{image_id[:16]}":
                                          "/var/cache/specbench-mesa-shaders"}
    assert facts["devices"][0]["software"] == "Mesa lavapipe"
    assert meta.hardware.software_device is True


def test_vulkan_demo_is_judged_like_the_cpu_demo(vulkan_run, engine, tmp_path):
    summary = sm.summarize(RunDir.open(vulkan_run))
    assert schema.errors("summary", summary) == []
    # outputs compared with the baseline, speculation checked, interference measured
    for s in ("draft-simple", "ngram-mod"):
        assert summary["determinism"][f"local/{s}"]["tasks"] == len(VULKAN_TASKS)
    for c in summary["cells"]:
        assert c["device"]["devices"] == [c["device"]["devices"][0]] and "llvmpipe" in c["device"]["devices"][0]
        assert c["device"]["runs_without_device"] == 0
        if c["strategy"] != "baseline":
            assert not c["checks"]["speculation"]["flagged"], c["checks"]["speculation"]
    assert summary["interference"]["local"]
    out = tmp_path / "RESULTS.md"
    rp.write([vulkan_run], out, plot=False)
    text = out.read_text()
    assert "### Devices: where the measurements ran" in text and "Vulkan0 (llvmpipe" in text
    assert "SOFTWARE device (Mesa lavapipe" in text
    assert engine.kit_containers("vulkan-run", helpers=True) == []


def test_doctor_names_the_software_device_and_the_one_llama_cpp_uses(vulkan_image, engine, models_dir):
    items = doctor.check(engine, mf.load(VULKAN), models_dir, models=False)
    lines = [i.line() for i in items]
    dev = [ln for ln in lines if "vulkan device:" in ln]
    assert dev and all(ln.startswith("ok") for ln in dev), lines
    assert any("SOFTWARE device (Mesa lavapipe" in ln and "unified memory" in ln for ln in dev), dev
    assert any(ln.startswith("ok   llama.cpp device: Vulkan 0 (GGML_VK_VISIBLE_DEVICES=0") for ln in lines), lines


def test_without_a_gpu_a_vulkan_run_refuses_unless_the_manifest_measures_on_software(vulkan_image, engine,
                                                                                     tmp_path):
    if devices.access(engine, backends.get("vulkan")).nodes:
        pytest.fail("this test expects a host without /dev/dri (the CI machine and this one have none)")
    raw = yaml.safe_load(VULKAN.read_text())
    raw["hardware"]["software_device"] = False
    m = mf.load(write_manifest(tmp_path, yaml.safe_dump(raw)))
    with pytest.raises(KitError, match="sees no Vulkan GPU on this host") as e:
        runner.device_setups(m, [engine], vulkan_image)
    assert "\n" not in str(e.value) and "hardware.software_device: true" in str(e.value)


def test_probe_measures_the_device_through_llama_cpp_and_physics_uses_it(vulkan_probe, vulkan_run, tmp_path):
    rec = vulkan_probe
    assert rec["kind"] == "ggml-copy" and rec["gbs"] > 0.1
    assert rec["raw"]["backend"] == "Vulkan" and "llvmpipe" in rec["device"]
    run = RunDir.open(vulkan_run)
    assert run.read_meta().bandwidth.device == rec["device"]
    physics = sm.summarize(run)["cells"][0]["checks"]["physics"]
    assert physics["data"]["bandwidth_source"] == "measured" and physics["data"]["bandwidth_gbs"] == rec["gbs"]
    out = tmp_path / "R.md"
    rp.write([vulkan_run], out, plot=False)
    assert "measured by `invoke probe` (ggml-copy on Vulkan0 (llvmpipe" in out.read_text()
