"""What the CI-sized CUDA check costs from empty: the wheel download, the offline CUDA bases and docker/Dockerfile's
CUDA stages on the smoke tree (tests/data/llama-cuda-smoke), each step timed with nothing cached.

    python3 bench/cuda_offline_base.py

The wheels go to a temporary folder with pip's own cache off; both bases and the smoke image are built without
the engine's build cache (the bases' tags are replaced by identical images). The Debian bases are reused: CI makes
them for the CPU image anyway (about 75 s with debootstrap, see DESIGN.md)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml  # noqa: E402

from harness import ROOT  # noqa: E402
from harness.hosts.engine import LocalEngine, connect  # noqa: E402
from harness.image import build as bd  # noqa: E402
from harness.image import cuda_base, cuda_image
from harness.intake import manifest as mf  # noqa: E402
from harness.intake import trust  # noqa: E402

SMOKE_TREE = ROOT / "tests" / "data" / "llama-cuda-smoke"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    engine = LocalEngine(connect(timeout=3600))
    arch = cuda_base.arch_of(engine)
    figures: dict = {"arch": arch, "cpus": engine.info().get("NCPU")}
    with tempfile.TemporaryDirectory(prefix="cuda-ci-cost-") as tmp:
        os.environ["PIP_NO_CACHE_DIR"] = "1"  # the download is measured, not pip's http cache
        started = time.monotonic()
        wheels = cuda_base.download(arch, print, Path(tmp) / "wheels")
        figures["download_seconds"] = round(time.monotonic() - started, 1)
        figures["download_bytes"] = sum(p.stat().st_size for p in wheels)
        started = time.monotonic()
        bases = cuda_base.ensure(engine, print, arch, cache=Path(tmp) / "wheels", force=True)
        figures["bases_seconds"] = round(time.monotonic() - started, 1)
        figures["bases_bytes"] = {t: engine.image(t).size for t in (bases.builder, bases.runtime)}
        raw = yaml.safe_load((ROOT / "manifests" / "demo-cpu.yaml").read_text())
        raw["llama_cpp"] = {"path": str(SMOKE_TREE), "identity": {"build_number": 1, "commit": "smoke"}}
        raw["build"] = {"backend": "cuda", "cuda_architectures": "121"}
        folder = Path(tmp) / "manifest"
        folder.mkdir()
        shutil.copytree(ROOT / "manifests" / "tasks", folder / "tasks")  # prompts must lie in the manifest's folder
        (folder / "m.yaml").write_text(yaml.safe_dump(raw))
        started = time.monotonic()
        rec = bd.build(engine, trust.decide(mf.load(folder / "m.yaml"), True), force=True, offline_base=True, log=print)
        figures["smoke_build_seconds"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        report = cuda_image.inspect(engine, rec.tag)
        figures["checks_seconds"] = round(time.monotonic() - started, 1)
        figures["checks_ok"] = report.ok
        figures["total_seconds"] = round(figures["download_seconds"] + figures["bases_seconds"]
                                         + figures["smoke_build_seconds"] + figures["checks_seconds"], 1)
        for line in report.lines():
            print(line)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
