"""invoke build: the real CPU image from the pinned sdist on the registry-free base, and the CUDA plan."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile

import pytest
import yaml

from harness import KitError
from harness.hosts.engine import LocalEngine
from harness.image import build as bd
from harness.image import recipe
from harness.image import source as sources
from harness.intake import manifest as mf
from tests.conftest import DEMO, SPARK, trusted, write_manifest


def test_spark_renders_cuda_plan_with_arch_121_and_pinned_source():
    m = mf.load(SPARK)
    for prefer in ("git", "sdist"):
        p = recipe.build_plan(m, sources.describe_source(m, prefer))
        assert p.backend == "cuda"
        assert p.base_image.startswith("nvidia/cuda:") and "devel" in p.base_image
        assert p.runtime_image.startswith("nvidia/cuda:") and "runtime" in p.runtime_image
        assert "-DGGML_CUDA=ON" in p.cmake_args and "-DCMAKE_CUDA_ARCHITECTURES=121" in p.cmake_args
        assert "-DLLAMA_CURL=OFF" in p.cmake_args
        assert p.build_args["BACKEND"] == "cuda" and p.build_args["CUDA_ARCHITECTURES"] == "121"
        assert "-DGGML_CUDA=ON" in p.build_args["CMAKE_ARGS"]
        assert p.labels["specbench.backend"] == "cuda" and p.labels["specbench.cuda-architectures"] == "121"
        assert p.labels["specbench.llama-build-number"] == "11434"
        assert p.tag.startswith("specbench/llama-server:cuda-b11434-")
    git_plan = recipe.build_plan(m, sources.describe_source(m, "git"))
    assert git_plan.source["kind"] == "git" and git_plan.source["ref"] == "b11434"
    sdist_plan = recipe.build_plan(m, sources.describe_source(m, "sdist"))
    assert sdist_plan.source["sha256"].startswith("b0a2feb64c6f")
    assert git_plan.tag != sdist_plan.tag


def test_cpu_plan_uses_registry_free_base_and_differs_from_cuda():
    m = mf.load(DEMO)
    p = recipe.build_plan(m, sources.describe_source(m, "sdist"))
    assert p.registry_free and p.base_image.startswith("specbench/base-builder:")
    assert "-DGGML_CUDA=ON" not in p.cmake_args
    assert recipe.build_plan(m, sources.describe_source(m, "sdist"), backend="cuda").tag != p.tag


def _fake_llama_tree(root):
    (root / "tools" / "server").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.14)\nproject(fake)\n")
    (root / "tools" / "server" / "server.cpp").write_text("int main() { return 0; }\n")
    (root / "models").mkdir()
    (root / "models" / "ggml-vocab.gguf").write_bytes(b"x" * 100)


def test_local_folder_source_is_hashed_and_excludes_models(tmp_path):
    src = tmp_path / "llama.cpp"
    _fake_llama_tree(src)
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"path": str(src)}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    tree = sources.resolve_source(m, log=lambda s: None)
    assert tree.kind == "path" and len(tree.identity["content_sha256"]) == 64
    with open(tmp_path / "ctx.tar", "wb") as f:
        n = bd.write_context(tree, f)
    names = tarfile.open(tmp_path / "ctx.tar").getnames()
    assert "Dockerfile" in names and "llama.cpp/CMakeLists.txt" in names and "probe/probe.c" in names
    assert not any(x.startswith("llama.cpp/models") for x in names) and n == 2
    before = tree.identity["content_sha256"]
    (src / "tools" / "server" / "server.cpp").write_text("int main() { return 1; }\n")
    assert sources.resolve_source(m, log=lambda s: None).identity["content_sha256"] != before


def test_local_folder_that_is_not_llama_cpp(tmp_path):
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"path": str(tmp_path)}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    with pytest.raises(KitError, match="is not a llama.cpp source folder"):
        sources.resolve_source(m, log=lambda s: None)


def test_sdist_with_wrong_sha256_is_refused(tmp_path):
    src = tmp_path / "pkg" / "fake-1.0" / "llama.cpp"
    _fake_llama_tree(src)
    archive = tmp_path / "fake-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(tmp_path / "pkg" / "fake-1.0", "fake-1.0")
    good = hashlib.sha256(archive.read_bytes()).hexdigest()
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"sdist": {"package": "fake", "version": "1.0", "sha256": "3" * 64}}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    with pytest.raises(KitError, match=f"has sha256 {good}, the manifest pins 3333"):
        sources.resolve_sdist(m, lambda s: None, cache=tmp_path / "cache", local_file=archive)
    raw["llama_cpp"]["sdist"]["sha256"] = good
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    tree = sources.resolve_sdist(m, lambda s: None, cache=tmp_path / "cache", local_file=archive)
    assert (tree.path / "CMakeLists.txt").is_file() and tree.identity["sha256"] == good


def test_git_ref_that_does_not_exist(tmp_path):
    if shutil.which("git") is None:
        pytest.fail("git is required")
    repo = tmp_path / "repo"
    _fake_llama_tree(repo)
    env = ["-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", *env, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", *env, "-C", str(repo), "commit", "-qm", "x"], check=True)
    subprocess.run(["git", "-C", str(repo), "tag", "b1"], check=True)
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"git": {"repo": str(repo), "ref": "b999"}}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    with pytest.raises(KitError, match=r"ref 'b999' does not exist in"):
        sources.resolve_source(m, log=lambda s: None, cache=tmp_path / "cache")
    raw["llama_cpp"] = {"git": {"repo": str(repo), "ref": "b1"}}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    tree = sources.resolve_source(m, log=lambda s: None, cache=tmp_path / "cache")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert tree.kind == "git" and tree.identity["commit"] == head


@pytest.mark.image
def test_demo_image_runs_llama_server(docker_client, demo_image):
    assert demo_image.plan["backend"] == "cpu"
    assert "11434" in demo_image.server_version and "b11434" in demo_image.server_version
    img = docker_client.images.get(demo_image.tag)
    assert img.labels["specbench.llama-build-number"] == "11434"
    assert img.labels["specbench.base-image"].startswith("specbench/base-builder:")
    help_text = docker_client.containers.run(demo_image.tag, ["llama-server", "--help"], remove=True,
                                             network_mode="none", stdout=True, stderr=True).decode()
    spec_line = next(ln for ln in help_text.splitlines() if "--spec-type" in ln)
    block = help_text[help_text.index(spec_line):][:600]
    assert "draft-dflash" in block and "ngram-mod" in block and "draft-dspark" in block
    bench = docker_client.containers.run(demo_image.tag, ["llama-bench", "--help"], remove=True,
                                         network_mode="none", stdout=True, stderr=True).decode()
    assert "usage" in bench.lower()


@pytest.mark.image
def test_second_build_reuses_the_image(docker_client, demo_image, demo_manifest):
    again = bd.build(LocalEngine(docker_client), trusted(demo_manifest), log=lambda s: None)
    assert again.reused is True and again.image_id == demo_image.image_id
    assert again.tag == demo_image.tag


@pytest.mark.image
def test_failing_build_leaves_no_tagged_image(docker_client, tmp_path, demo_image):
    src = tmp_path / "llama.cpp"
    _fake_llama_tree(src)
    (src / "CMakeLists.txt").write_text("this is not cmake(\n")
    raw = yaml.safe_load(DEMO.read_text())
    raw["llama_cpp"] = {"path": str(src)}
    m = mf.load(write_manifest(tmp_path / "m", yaml.safe_dump(raw)))
    tag = recipe.build_plan(m, sources.describe_source(m)).tag
    with pytest.raises(KitError) as e:
        bd.build(LocalEngine(docker_client), trusted(m, True), log=lambda s: None)
    assert "build failed" in str(e.value) and "last log lines" in str(e.value)
    assert LocalEngine(docker_client).image(tag) is None
