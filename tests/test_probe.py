"""The memory-bandwidth probe in the image, and the physics check using its figure."""

from __future__ import annotations

import pytest
import yaml

from harness.analysis.summary import summarize
from harness.hosts.engine import LocalEngine
from harness.image import build
from harness.image.source import CACHE
from harness.intake import manifest as mf
from harness.run import bandwidth as probe
from harness.run import runner
from harness.store.rundir import RunDir
from tests.conftest import DEMO, trusted, write_manifest

pytestmark = pytest.mark.image


def test_probe_measures_and_physics_uses_it(tmp_path, demo_image, models_dir, docker_client):
    name = f"probe-test-{tmp_path.name}"
    rec = probe.measure(LocalEngine(), demo_image.tag, "cpu", name, size_mib=32, repetitions=3)
    try:
        assert rec["kind"] == "cpu-stream" and rec["gbs"] > 0.5 and rec["raw"]["copy_gbs"] > 0.5
        raw = yaml.safe_load(DEMO.read_text())
        raw["name"] = name
        raw["strategies"] = raw["strategies"][:1]
        raw.pop("distribution")  # the demo's sampling study is not what this measures
        raw["tasks"] = raw["tasks"][:1]
        raw["runs"] = 1
        path = write_manifest(tmp_path / "m", yaml.safe_dump(raw, allow_unicode=True), "p.yaml")
        # the same image, recorded for this name
        build.build(LocalEngine(docker_client), trusted(mf.load(path)), log=lambda s: None)
        runner.run(trusted(path), results_dir=tmp_path / "r", models_dir=models_dir, run_id="p", progress=False,
                    log=lambda s: None)
        meta = RunDir.open(tmp_path / "r" / "p").read_meta()
        assert meta.bandwidth.gbs == rec["gbs"] and meta.bandwidth.host == "local"
        physics = summarize(RunDir.open(tmp_path / "r" / "p"))["cells"][0]["checks"]["physics"]
        assert physics["data"]["bandwidth_source"] == "measured" and physics["data"]["bandwidth_gbs"] == rec["gbs"]
    finally:
        probe._path(name, "local").unlink(missing_ok=True)
        CACHE.joinpath("builds", f"{name}-cpu-latest.json").unlink(missing_ok=True)
