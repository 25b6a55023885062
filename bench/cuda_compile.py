"""The full CUDA image, compiled without a GPU or a registry, and what it costs.

    python3 bench/cuda_compile.py [--manifest manifests/spark-qwen3.8-27b.yaml] [--source sdist] [--jobs 2]
                                  [--cpu-shares 128] [--force] [--estimate-only]

Makes the offline CUDA bases (harness/image/cuda_base.py), builds the manifest's image on them (llama.cpp's CUDA
backend for the manifest's architectures, 121 for the Spark study), runs the no-GPU checks
(harness/image/cuda_image.py) and prints: wall time, image and base sizes, the check results. Then it estimates what a
multi-architecture build would cost: it times the same sample of ggml-cuda files for the manifest's
architectures and for llama.cpp's default list, and scales the measured wall time by their ratio.
Order of an hour on 2 cores; `--cpu-shares 128` lets other work on the machine go first."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import LABEL_PREFIX  # noqa: E402
from harness.hosts.engine import Engine, LocalEngine, Mount, connect  # noqa: E402
from harness.image import build as bd  # noqa: E402
from harness.image import cuda_base, cuda_image  # noqa: E402
from harness.image.source import resolve_source  # noqa: E402
from harness.intake import manifest as mf  # noqa: E402
from harness.intake import trust  # noqa: E402

#: llama.cpp's default CUDA architectures for CUDA 13 (ggml/src/ggml-cuda/CMakeLists.txt, GGML_NATIVE=OFF).
DEFAULT_ARCHS = "75-virtual;80-virtual;86-real;89-real;90-virtual;120a-real;121a-real"
#: A sample of ggml-cuda translation units: a heavy template instance of each family and two plain files.
SAMPLE = (
    "template-instances/mmq-instance-q4_k.cu",
    "template-instances/fattn-mma-f16-instance-ncols1_8-ncols2_8.cu",
    "mmvq.cu",
)


def log(s: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)


def time_sample(engine: Engine, devel: str, src: Path, archs: str,
                cpu_shares: int) -> dict[str, dict[str, float]]:
    """CPU and wall seconds to compile each SAMPLE file (CMake's own compile rule) for `archs`, in the devel base.

    CPU seconds (the shell's children's user+system time) hold still when other work shares the machine."""
    script = f"""set -e
cmake -S /src -B /tmp/b -DGGML_CUDA=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \\
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "-DCMAKE_CUDA_ARCHITECTURES={archs}" >/dev/null
ticks() {{ awk '{{print $16 + $17}}' /proc/$$/stat; }}
for f in {' '.join(SAMPLE)}; do
  t0=$(date +%s.%N); c0=$(ticks)
  make -C /tmp/b/ggml/src/ggml-cuda -s "$f.o" >/dev/null
  echo "TIME $f $t0 $(date +%s.%N) $c0 $(ticks) $(getconf CLK_TCK)"
done
"""
    out = engine.run_container(devel, ["/bin/sh", "-c", script], {f"{LABEL_PREFIX}.role": "bench"},
                               mounts=(Mount(src, "/src"),), cpu_shares=cpu_shares).stdout
    times = {}
    for m in re.finditer(r"^TIME (\S+) (\S+) (\S+) (\d+) (\d+) (\d+)$", out, re.M):
        times[m.group(1)] = {"wall": round(float(m.group(3)) - float(m.group(2)), 1),
                             "cpu": round((int(m.group(5)) - int(m.group(4))) / int(m.group(6)), 1)}
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", default="manifests/spark-qwen3.8-27b.yaml")
    ap.add_argument("--source", default="sdist")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cpu-shares", type=int, default=128)
    ap.add_argument("--force", action="store_true", help="compile even when the image exists")
    ap.add_argument("--estimate-only", action="store_true", help="skip the full build; time the sample only")
    ap.add_argument("--build-seconds", type=float, help="with --estimate-only: a measured build time to scale")
    args = ap.parse_args()
    engine = LocalEngine(connect(timeout=7200))
    manifest = mf.load(Path(args.manifest))
    figures: dict = {"manifest": manifest.name, "cuda_architectures": manifest.build.cuda_architectures,
                     "jobs": args.jobs, "cpus": engine.info().get("NCPU")}
    started = time.monotonic()
    bases = cuda_base.ensure(engine, log)
    figures["bases_seconds"] = round(time.monotonic() - started, 1)
    figures["bases"] = {t: engine.image(t).size for t in (bases.builder, bases.runtime)}
    source = resolve_source(manifest, log, args.source)
    if not args.estimate_only:
        started = time.monotonic()
        rec = bd.build(engine, trust.decide(manifest, False), backend="cuda", force=args.force, prefer=args.source,
                       log=log, jobs=args.jobs, offline_base=True, cpu_shares=args.cpu_shares)
        figures["build_wall_seconds"] = round(time.monotonic() - started, 1)
        figures["reused"] = rec.reused
        report = cuda_image.inspect(engine, rec.tag)
        figures["image"] = rec.tag
        figures["image_bytes"] = report.size_bytes
        figures["checks"] = report.as_dict()
        for line in report.lines():
            log(line)
    one = time_sample(engine, bases.builder, source.path, manifest.build.cuda_architectures, args.cpu_shares)
    many = time_sample(engine, bases.builder, source.path, DEFAULT_ARCHS, args.cpu_shares)
    cpu_one, cpu_many = (sum(t["cpu"] for t in x.values()) for x in (one, many))
    ratio = cpu_many / max(cpu_one, 1e-9)
    figures["sample_seconds"] = {"archs": manifest.build.cuda_architectures, "files": one}
    figures["sample_seconds_default_archs"] = {"archs": DEFAULT_ARCHS, "files": many}
    figures["multi_arch_ratio"] = round(ratio, 2)
    if args.build_seconds and "build_wall_seconds" not in figures:
        figures["build_wall_seconds"] = args.build_seconds
    if "build_wall_seconds" in figures:
        figures["multi_arch_estimate_seconds"] = round(figures["build_wall_seconds"] * ratio)
    print(json.dumps(figures, indent=2, default=str))
    log(f"sample: {cpu_one:.0f} CPU s for {manifest.build.cuda_architectures}, {cpu_many:.0f} CPU s for the "
        f"default list ({ratio:.2f}x)")
    if "build_wall_seconds" in figures:
        log(f"full build: {figures['build_wall_seconds'] / 60:.1f} min wall; a default-architecture build: ~"
            f"{figures['multi_arch_estimate_seconds'] / 60:.0f} min")


if __name__ == "__main__":
    main()
