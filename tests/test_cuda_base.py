"""The CUDA image without a registry or a GPU: pinned toolkit wheels, offline bases laid out like nvidia/cuda's,
docker/Dockerfile's CUDA stages on them (CMake, nvcc, the link stub, the runtime stage), and the no-GPU checks."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from harness import KitError
from harness.hosts.engine import LocalEngine
from harness.image import build as bd
from harness.image import cuda_base, cuda_image, recipe
from harness.image import source as sources
from harness.intake import manifest as mf
from tests.conftest import DEMO, SPARK, trusted, write_manifest

SMOKE_TREE = Path(__file__).parent / "data" / "llama-cuda-smoke"
#: What the dynamic loader prints for a CUDA binary started without the driver (seen in the built image).
LOADER_NO_DRIVER = ("llama-server: error while loading shared libraries: libcuda.so.1: cannot open shared object "
                    "file: No such file or directory")


# ---------------------------------------------------------------- pins and layout, no engine


def test_pins_are_one_release_for_both_architectures():
    assert set(cuda_base.WHEELS) == {"amd64", "arm64"}
    amd = {w.package: w.version for w in cuda_base.WHEELS["amd64"]}
    arm = {w.package: w.version for w in cuda_base.WHEELS["arm64"]}
    assert amd == arm
    assert {"nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cublas",
            "nvidia-nvvm"} == set(amd)
    # nvcc, crt, nvvm and cudart are released together (13.0.88 in CUDA 13.0.1).
    assert len({amd[p] for p in ("nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime")}) == 1
    for arch, machine in (("amd64", "x86_64"), ("arm64", "aarch64")):
        for w in cuda_base.WHEELS[arch]:
            assert len(w.sha256) == 64 and int(w.sha256, 16) >= 0
            assert w.filename.startswith(w.package.replace("-", "_") + "-" + w.version + "-")
            assert w.platforms() and all(p.endswith(machine) for p in w.platforms())
    assert len({w.sha256 for ws in cuda_base.WHEELS.values() for w in ws}) == 12


def test_base_tags_carry_architecture_and_change_with_the_pins(monkeypatch):
    amd, arm = cuda_base.tags("amd64"), cuda_base.tags("arm64")
    assert ":13.0.1-amd64-" in amd.builder and ":13.0.1-amd64-" in amd.runtime
    assert ":13.0.1-arm64-" in arm.builder and amd.builder.split("-")[-1] != arm.builder.split("-")[-1]
    assert amd.builder.startswith("specbench/base-cuda-devel:")
    assert amd.runtime.startswith("specbench/base-cuda-runtime:")
    first = cuda_base.WHEELS["amd64"][0]
    moved = cuda_base.Wheel(first.package, first.version, first.filename, "0" * 64, first.size)
    monkeypatch.setitem(cuda_base.WHEELS, "amd64", (moved, *cuda_base.WHEELS["amd64"][1:]))
    assert cuda_base.tags("amd64").builder != amd.builder
    with pytest.raises(KitError, match="architecture 'ppc64le' is not one of"):
        cuda_base.tags("ppc64le")


def test_wheel_members_map_to_nvidia_layout():
    path = cuda_base.toolkit_path
    assert path("nvidia-cuda-nvcc", "nvidia/cu13/bin/nvcc") == "bin/nvcc"
    assert path("nvidia-cuda-runtime", "nvidia/cu13/lib/libcudart.so.13") == "lib64/libcudart.so.13"
    assert path("nvidia-cublas", "nvidia/cu13/include/cublas_v2.h") == "include/cublas_v2.h"
    assert path("nvidia-cuda-cccl", "nvidia/cu13/include/cccl/cub/cub.cuh") == "include/cccl/cub/cub.cuh"
    assert path("nvidia-nvvm", "nvidia/cu13/lib/libnvvm.so.4") == "nvvm/lib64/libnvvm.so.4"
    assert path("nvidia-nvvm", "nvidia/cu13/include/nvvm.h") == "nvvm/include/nvvm.h"
    assert path("nvidia-nvvm", "nvidia/cu13/nvvm/bin/cicc") == "nvvm/bin/cicc"
    for skipped in ("nvidia_cuda_nvcc-13.0.88.dist-info/RECORD", "nvidia/cu13/.metadata/provenance.txt",
                    "nvidia/cu13/../../etc/passwd", "/etc/passwd", "nvidia/cu13/bin/"):
        assert path("nvidia-cuda-nvcc", skipped) is None


def test_devel_context_streams_wheels_into_the_toolkit_tree(tmp_path, monkeypatch):
    """A fake pinned wheel goes into cuda/ with NVIDIA's layout and only an executable bit kept."""
    name = "nvidia_cuda_nvcc-13.0.88-py3-none-test.whl"
    fake = cuda_base.Wheel("nvidia-cuda-nvcc", "13.0.88", name, "0" * 64, 0)
    monkeypatch.setitem(cuda_base.WHEELS, "test", (fake,))
    whl = tmp_path / name
    with zipfile.ZipFile(whl, "w") as zf:
        for member, mode, data in (("nvidia/cu13/bin/nvcc", 0o744, b"#!nvcc"), ("nvidia/cu13/lib/libx.so.1", 0o664,
                                   b"elf"), ("nvidia_cuda_nvcc-13.0.88.dist-info/RECORD", 0o644, b"")):
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, data)
    out = io.BytesIO()
    n = cuda_base.write_devel_context([whl], out, {"cuda": {"version": "13.0.1"}})
    out.seek(0)
    tf = tarfile.open(fileobj=out)
    members = {m.name: m for m in tf.getmembers()}
    assert n == 2
    assert {"Dockerfile", "cuda-devel.sh", "cuda/version.json", "cuda/bin/nvcc", "cuda/lib64/libx.so.1"} == set(members)
    assert members["cuda/bin/nvcc"].mode == 0o755 and members["cuda/lib64/libx.so.1"].mode == 0o644
    assert tf.extractfile("cuda/bin/nvcc").read() == b"#!nvcc"
    assert b"cuda-devel.sh" in tf.extractfile("Dockerfile").read()


def test_no_driver_is_named_and_other_failures_are_not():
    said = cuda_image.describe_version(LOADER_NO_DRIVER, 127)
    assert said.startswith("no NVIDIA driver: libcuda.so.1 is not in the container")
    assert cuda_image.missing_driver(LOADER_NO_DRIVER.replace("libcuda.so.1", "libcublas.so.13")) is None
    other = cuda_image.describe_version(LOADER_NO_DRIVER.replace("libcuda.so.1", "libcublas.so.13"), 127)
    assert other.startswith("failed (exit 127)") and "libcublas.so.13" in other
    assert cuda_image.describe_version("version: 11434 (b11434)\nbuilt with GNU 12.2.0", 0) == "version: 11434 (b11434)"


def test_ldd_lines_are_parsed():
    link = cuda_image._linkage("/opt/llama/bin/llama-server", [
        "\tlinux-vdso.so.1 (0x00007ffd)",
        "\tlibcuda.so.1 => not found",
        "\tlibcublas.so.13 => /usr/local/cuda-13.0/lib64/libcublas.so.13 (0x00007f00)",
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f01)"])
    assert link.unresolved == ["libcuda.so.1"]
    assert link.resolved == {"libcublas.so.13": "/usr/local/cuda-13.0/lib64/libcublas.so.13"}


def test_offline_plan_uses_the_offline_bases_and_its_own_tag():
    m = mf.load(SPARK)
    tree = sources.describe_source(m, "sdist")
    registry = recipe.build_plan(m, tree)
    offline = recipe.build_plan(m, tree, made=cuda_base.tags("arm64"))
    assert offline.registry_free and not registry.registry_free
    assert offline.base_image == cuda_base.tags("arm64").builder
    assert offline.labels["specbench.base-image"] == offline.base_image
    assert offline.labels["specbench.runtime-image"] == cuda_base.tags("arm64").runtime
    assert offline.cmake_args == registry.cmake_args and offline.tag != registry.tag
    assert "-DCMAKE_CUDA_ARCHITECTURES=121" in offline.cmake_args


# ---------------------------------------------------------------- the real bases and Dockerfile, no GPU


@pytest.fixture(scope="module")
def cuda_bases(docker_client):
    """The offline CUDA bases for this engine (wheels downloaded and checked on first use; about a minute)."""
    return cuda_base.ensure(LocalEngine(docker_client), log=lambda s: print(s, flush=True))


def _sh(client, image: str, script: str) -> str:
    return client.containers.run(image, ["/bin/sh", "-c", script], entrypoint=[], remove=True, network_mode="none",
                                 labels={"specbench.role": "test"}, stdout=True, stderr=True).decode()


@pytest.mark.docker
def test_offline_devel_base_is_laid_out_like_nvidia_cuda(docker_client, cuda_bases):
    out = _sh(docker_client, cuda_bases.builder, """set -e
nvcc --version | tail -1
readlink /usr/local/cuda
for t in nvcc ptxas nvlink fatbinary cudafe++; do test -x /usr/local/cuda/bin/$t && echo "tool $t"; done
test -x /usr/local/cuda/nvvm/bin/cicc && echo "tool cicc"
for l in cudart cublas cublasLt; do echo "link lib$l.so -> $(readlink /usr/local/cuda/lib64/lib$l.so)"; done
readelf -d /usr/local/cuda/lib64/stubs/libcuda.so | grep SONAME
nm -D --defined-only /usr/local/cuda/lib64/stubs/libcuda.so | grep -c ' T cu'
nm -D --defined-only /usr/local/cuda/lib64/stubs/libcuda.so | grep -E ' T (cuMemCreate|cuMemGetInfo_v2)$'
test -f /usr/local/cuda/include/cccl/cub/cub.cuh && echo "cccl"
echo "env $CUDA_HOME $LIBRARY_PATH"
ldconfig -p | grep -c libcuda.so || true
""")
    assert "Build cuda_13.0" in out and "cuda-13.0" in out
    for tool in ("nvcc", "ptxas", "nvlink", "fatbinary", "cudafe++", "cicc"):
        assert f"tool {tool}" in out
    for lib in ("cudart", "cublas", "cublasLt"):
        assert f"link lib{lib}.so -> lib{lib}.so.13" in out
    assert "Library soname: [libcuda.so.1]" in out and " T cuMemCreate" in out and " T cuMemGetInfo_v2" in out
    assert int(out.split("[libcuda.so.1]")[1].split()[0]) > 400  # every driver entry point cuda.h declares
    assert "cccl" in out and "env /usr/local/cuda /usr/local/cuda/lib64/stubs" in out
    assert out.strip().splitlines()[-1] == "0"  # the stub is for linking only: the loader never sees it


@pytest.mark.docker
def test_dockerfile_builds_cuda_on_offline_bases_and_stops_at_the_driver(docker_client, cuda_bases, tmp_path):
    """docker/Dockerfile, unchanged flags, on a tree that goes through ggml-cuda's CMake and links like it."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"path": str(SMOKE_TREE), "identity": {"build_number": 1, "commit": "smoke"}}
    raw["build"] = {"backend": "cuda", "cuda_architectures": "121"}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    lines: list[str] = []
    engine = LocalEngine(docker_client)
    rec = bd.build(engine, trusted(m, True), offline_base=True, log=lines.append)  # a local tree
    assert rec.plan["base_image"] == cuda_bases.builder and rec.plan["registry_free"]
    log = "\n".join(lines)
    if not rec.reused and "Configuring done" in log:  # the compile ran (not a layer the engine had cached)
        assert "The CUDA compiler identification is NVIDIA 13.0.88" in log
    assert rec.server_version.startswith("no NVIDIA driver: libcuda.so.1")
    if not rec.reused:
        assert rec.cuda_checks["ok"] and rec.cuda_checks["problems"] == []
    report = cuda_image.inspect(engine, rec.tag)
    assert report.ok, report.problems
    assert report.driver_missing and report.version_exit == 127
    assert report.labels["specbench.runtime-image"] == cuda_bases.runtime
    assert report.labels["specbench.cuda-architectures"] == "121"
    by_path = {link.path: link for link in report.linkage}
    assert by_path["/opt/llama/bin/llama-server"].unresolved == ["libcuda.so.1"]
    cuda_lib = next(link for path, link in by_path.items() if "libggml-cuda" in path)
    assert cuda_lib.unresolved == ["libcuda.so.1"]
    assert set(cuda_lib.resolved) >= {"libcudart.so.13", "libcublas.so.13"}
    names = {p.rsplit("/", 1)[-1] for p in report.cuda_libraries}
    assert {"libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"} <= names
    assert not any(n.startswith(("libnvvm", "libcuda.so")) for n in names)  # no toolkit, no driver
    # Device code for the GB10 only (121 became 121a, as ggml does), and the bandwidth probe built by nvcc.
    out = _sh(docker_client, rec.tag, "grep -ao 'sm_[0-9]*a*' /opt/llama/lib/libggml-cuda.so | sort -u; "
              "ls /opt/llama/bin")
    assert "sm_121a" in out.split() and not [w for w in out.split() if w.startswith("sm_") and w != "sm_121a"]
    assert "specbench-probe-cuda" in out.split()


@pytest.mark.docker
def test_doctor_says_in_one_line_whether_docker_has_the_nvidia_runtime(docker_client, tmp_path):
    from harness.hosts.engine import LocalEngine
    from harness.run import doctor

    items = doctor.check(LocalEngine(docker_client), mf.load(SPARK), tmp_path, models=False)
    item = next(i for i in items if i.name == "nvidia runtime")
    assert "\n" not in item.detail
    if cuda_image.has_nvidia_runtime(LocalEngine(docker_client)):
        assert item.ok and item.detail.startswith("Docker has the NVIDIA runtime")
    else:
        assert not item.ok and item.detail.startswith("Docker has no NVIDIA runtime: containers get no GPU")
        assert item.line().splitlines()[0].startswith("FAIL nvidia runtime: Docker has no NVIDIA runtime")


def test_build_task_plans_the_offline_base_and_refuses_an_unknown_one():
    import json
    import subprocess
    import sys

    from harness import ROOT

    cmd = [sys.executable, "-m", "invoke", "build", "--manifest", str(SPARK), "--source", "sdist", "--plan"]
    out = subprocess.run([*cmd, "--base", "offline"], capture_output=True, text=True, cwd=ROOT, check=True)
    plan = json.loads(out.stdout)
    assert plan["base_image"] == cuda_base.planned(offline=True).builder and plan["registry_free"] is True
    default = json.loads(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout)
    assert default["base_image"] == cuda_base.planned(offline=False).builder and default["registry_free"] is False
    assert default["base_image"].startswith("specbench/base-cuda-registry-devel:13.0.1-")
    assert "amd64" not in default["base_image"] and "arm64" not in default["base_image"]
    assert default["runtime_image"] == recipe.CUDA_RUNTIME and plan["tag"] != default["tag"]
    bad = subprocess.run([*cmd, "--base", "cloud"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 1 and bad.stderr.strip() == "error: --base: 'cloud' is not one of ['registry', 'offline']"


@pytest.mark.docker
def test_registry_devel_base_adds_cmake_where_the_devel_image_has_none(docker_client, cuda_bases):
    """nvidia/cuda's devel images have no CMake and the llama.cpp build has no network: the registry path's base
    gets it first. Rehearsed on a stand-in for nvidia/cuda devel (no registry here): the offline devel base with
    CMake purged."""
    import docker

    stand_in = "specbench/test-cuda-devel-no-cmake:1"
    made: list[str] = []
    try:
        dockerfile = (f"FROM {cuda_bases.builder}\nRUN dpkg --purge --force-all cmake cmake-data && "
                      "! command -v cmake\n").encode()
        docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=stand_in, network_mode="none", rm=True)
        made.append(stand_in)
        bases = cuda_base.ensure_registry(LocalEngine(docker_client), log=lambda s: None, devel=stand_in)
        made.append(bases.builder)
        assert bases.builder != cuda_base.registry_tags().builder
        assert not bases.registry_free and bases.runtime == recipe.CUDA_RUNTIME
        out = _sh(docker_client, bases.builder, "cmake --version | head -1; for t in g++ make nvcc; do command -v $t; "
                  "done")
        assert out.startswith("cmake version 3.") and all(f"/{t}\n" in out for t in ("g++", "make", "nvcc"))
    finally:
        for tag in reversed(made):
            try:
                docker_client.images.remove(tag)
            except docker.errors.APIError:
                pass
