"""An image is found by what it is: the matching on labels, and the decision of how bases are made for an engine
(pure functions; a run that builds a missing image at the end; bases made on a real engine: tests/test_bases.py)."""

from __future__ import annotations

import itertools

import pytest
import yaml

from harness.hosts.engine import LocalEngine
from harness.image import backends, bases, images, recipe
from harness.image import build as bd
from harness.image import source as sources
from harness.intake import manifest as mf
from tests.conftest import DEMO, SPARK, trusted, write_manifest


def _labels(m: mf.Manifest, prefer: str | None = None, arch: str = "amd64", method: str = "debootstrap",
            backend: str | None = None) -> dict[str, str]:
    """The labels `invoke build` puts on the image of this manifest for an engine of `arch`."""
    b = backend or m.build.backend
    made = bases.images_for(arch, method, b) if backends.get(b).debian else None
    return recipe.build_plan(m, sources.describe_source(m, prefer), backend, made, arch).labels


def _variant(tmp_path, name: str, **changes) -> mf.Manifest:
    raw = yaml.safe_load(DEMO.read_text())
    raw["name"] = name
    for key, value in changes.items():
        raw[key] = value
    return mf.load(write_manifest(tmp_path / name, yaml.safe_dump(raw, allow_unicode=True), f"{name}.yaml"))


def test_another_manifest_with_the_same_build_finds_the_image(tmp_path):
    demo = mf.load(DEMO)
    other = _variant(tmp_path, "other", runs=1, strategies=[{"id": "baseline", "spec_type": "none"}])
    labels = _labels(demo)
    p = images.matching_build_plan(other, labels, "cpu", "amd64")
    assert p is not None and p.tag == recipe.build_plan(demo, sources.describe_source(demo), made=bases.images_for(
        "amd64", "debootstrap"), arch="amd64").tag
    # registry-made bases of the same architecture serve as well
    assert images.matching_build_plan(other, _labels(demo, method="registry"), "cpu", "amd64") is not None


def test_a_different_build_is_not_found(tmp_path):
    demo = mf.load(DEMO)
    labels = _labels(demo)
    flags = _variant(tmp_path, "flags", build={"backend": "cpu", "cmake_args": ["-DGGML_OPENMP=OFF"]})
    assert images.matching_build_plan(flags, labels, "cpu", "amd64") is None
    sdist = dict(yaml.safe_load(DEMO.read_text())["llama_cpp"])
    sdist["sdist"] = dict(sdist["sdist"], sha256="0" * 64)
    other_src = _variant(tmp_path, "src", llama_cpp=sdist)
    assert images.matching_build_plan(other_src, labels, "cpu", "amd64") is None
    assert images.matching_build_plan(demo, labels, "cuda", "amd64") is None          # another backend
    assert images.matching_build_plan(demo, labels, "cpu", "arm64") is None           # another engine architecture
    arm = _labels(demo, arch="arm64")
    assert images.matching_build_plan(demo, arm, "cpu", "arm64") is not None
    assert arm["specbench.plan-key"] != labels["specbench.plan-key"]           # the architecture is identity


def test_tampered_or_foreign_labels_do_not_match():
    demo = mf.load(DEMO)
    good = _labels(demo)
    for key, value in [("specbench.plan-key", "0" * 12), ("specbench.source", "{not json"),
                       ("specbench.base-image", "debian:bookworm"), ("specbench.llama-build-number", "x"),
                       ("specbench.arch", "")]:
        assert images.matching_build_plan(demo, {**good, key: value}, "cpu", "amd64") is None, key
    assert images.matching_build_plan(demo, {}, "cpu", "amd64") is None


def test_git_source_matches_repo_and_ref_and_the_pinned_commit(tmp_path):
    demo = mf.load(DEMO)
    lc = yaml.safe_load(DEMO.read_text())["llama_cpp"]
    git_labels = dict(_labels(demo, "git"))
    # an image built from the resolved git commit: the label names that commit
    commit = "a" * 40
    git_labels["specbench.source"] = sources.SourceTree(
        sources.Path("-"), "git", {"repo": lc["git"]["repo"], "ref": "b11434", "commit": commit}, 11434, "b11434").key
    tree = images.source_from_labels(demo, git_labels)
    assert tree is not None and tree.identity["commit"] == commit
    pinned = _variant(tmp_path, "pinned", llama_cpp=dict(lc, git=dict(lc["git"], commit="b" * 40)))
    assert images.source_from_labels(pinned, git_labels) is None
    moved = _variant(tmp_path, "moved", llama_cpp=dict(lc, git=dict(lc["git"], ref="master")))
    assert images.source_from_labels(moved, git_labels) is None
    only_sdist = _variant(tmp_path, "only-sdist", llama_cpp={k: v for k, v in lc.items() if k != "git"})
    assert images.source_from_labels(only_sdist, git_labels) is None
    assert images.source_from_labels(demo, git_labels, prefer="sdist") is None
    assert not images.identity_known(demo, "git") and images.identity_known(demo) and images.identity_known(pinned,
                                                                                                            "git")


def test_vulkan_plan_is_its_own_image_on_trixie_bases():
    demo = mf.load(DEMO)
    tree = sources.describe_source(demo)
    p = recipe.build_plan(demo, tree, "vulkan", bases.images_for("amd64", "debootstrap", "vulkan"), "amd64")
    assert "-DGGML_VULKAN=ON" in p.cmake_args and "-DGGML_CUDA=ON" not in p.cmake_args
    assert p.labels["specbench.backend"] == "vulkan" and p.build_args["BACKEND"] == "vulkan"
    assert p.tag.startswith("specbench/llama-server:vulkan-b11434-")
    assert p.base_image.startswith("specbench/base-vulkan-builder:trixie-amd64-")
    assert p.runtime_image.startswith("specbench/base-vulkan-runtime:trixie-amd64-")
    vk = _labels(demo, backend="vulkan")
    assert images.matching_build_plan(demo, vk, "vulkan", "amd64").tag == p.tag
    assert images.matching_build_plan(demo, vk, "cpu", "amd64") is None               # not the CPU image
    assert images.matching_build_plan(demo, _labels(demo), "vulkan", "amd64") is None  # nor the other way round
    # a Vulkan image on the CPU bases is not one the kit makes
    assert images.matching_build_plan(demo, {**vk, "specbench.base-image": _labels(demo)["specbench.base-image"]},
                                      "vulkan", "amd64") is None
    assert recipe.build_plan(demo, tree, arch="amd64").tag != p.tag


def test_spark_plan_carries_the_architecture():
    m = mf.load(SPARK)
    for arch in ("amd64", "arm64"):
        p = recipe.build_plan(m, sources.describe_source(m, "sdist"), arch=arch)
        assert p.labels["specbench.arch"] == arch and p.arch == arch
        assert images.matching_build_plan(m, p.labels, "cuda", arch) is not None
    assert recipe.build_plan(m, sources.describe_source(m, "sdist"), arch="amd64").tag != \
        recipe.build_plan(m, sources.describe_source(m, "sdist"), arch="arm64").tag


def test_base_tags_name_architecture_and_method():
    roles = [b.role for r in backends.BACKENDS for b in r.debian or ()]
    tags = {bases.tag_for(role, arch, method) for role in roles for arch in ("amd64", "arm64")
            for method in bases.METHODS}
    assert len(tags) == 4 * 2 * 2  # roles (cpu and vulkan builder, runtime) x architectures x methods
    assert bases.tag_for("builder", "arm64", "registry").startswith("specbench/base-builder:bookworm-arm64-registry-")
    assert bases.tag_for("vulkan-runtime", "amd64").startswith("specbench/base-vulkan-runtime:trixie-amd64-")
    # the CPU bases' tags do not depend on the Vulkan ones being there (engines keep their CPU bases)
    assert bases.images_for("amd64", "debootstrap").builder == bases.tag_for("builder", "amd64")
    assert bases.images_for("amd64", "debootstrap", "vulkan").runtime == bases.tag_for("vulkan-runtime", "amd64")
    assert bases.debian_image("vulkan") == "debian:trixie" and bases.debian_image() == "debian:bookworm"
    assert bases.normalise_arch("x86_64") == "amd64" and bases.normalise_arch("aarch64") == "arm64"


# ---------------------------------------------------------------- how bases are made


@pytest.mark.parametrize("engine_arch", ["amd64", "arm64"])
def test_base_decision_for_every_situation(engine_arch):
    for local, registry, on_host, here, remote in itertools.product(("amd64", "arm64"), *[(False, True)] * 4):
        if not remote:
            local, on_host = engine_arch, here  # the local engine's host is this machine
        d = bases.decide(engine_arch, local, registry, on_host, here, remote, host="me@spark")
        if registry:
            assert (d.method, d.where) == ("registry", "engine")
        elif remote and on_host:
            assert (d.method, d.where) == ("debootstrap", "host")
        elif here and local == engine_arch:
            assert (d.method, d.where) == ("debootstrap", "here")
        else:
            assert d.method is None and d.problem and "\n" not in d.problem
            assert "debootstrap" in d.problem and "registry" in d.problem
            if remote and here:
                assert f"is {engine_arch} and this machine is {local}" in d.problem and "me@spark" in d.problem


def test_laptop_never_hands_a_spark_a_base_of_its_own_architecture():
    d = bases.decide("arm64", "amd64", registry=False, debootstrap_host=False, debootstrap_here=True, remote=True,
                     host="me@spark")
    assert d.method is None
    assert d.problem.startswith("me@spark's Docker engine is arm64 and this machine is amd64")
    assert bases.decide("arm64", "amd64", False, True, True, True).where == "host"
    assert bases.decide("arm64", "amd64", True, False, False, True).method == "registry"
    # a macOS laptop (no debootstrap) driving an amd64 host that has it
    assert bases.decide("amd64", "arm64", False, True, False, True).where == "host"


def test_mirror_is_read_from_either_sources_format():
    assert bases.mirror_from("Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n") == \
        "http://mirror.example/debian"
    assert bases.mirror_from("deb [arch=amd64] http://m.example/debian bookworm main\n") == "http://m.example/debian"
    assert bases.mirror_from("URIs: http://security.debian.org/debian-security\n") is None
    assert bases.host_mirror(lambda p: None) == bases.DEFAULT_MIRROR


# ---------------------------------------------------------------- on the real engine


def _fake_llama_tree(root) -> None:
    """A source tree that builds in seconds: `llama-server` and `llama-bench` that print a version and exit."""
    (root / "tools" / "server").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(fake C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_executable(llama-server tools/server/server.c)\nadd_executable(llama-bench tools/server/server.c)\n")
    (root / "tools" / "server" / "server.c").write_text(
        '#include <stdio.h>\nint main(void) { fprintf(stderr, "version: 1 (fake)\\n"); return 1; }\n')


def test_run_builds_a_missing_image_and_another_manifest_finds_it(docker_client, tmp_path, models_dir):
    """`invoke run` with no image of the build anywhere: refused with --no-build, built (saying so) without it;
    a second manifest with the same source, flags and backend then finds that image by its labels."""
    from harness import KitError
    from harness.run import runner

    src = tmp_path / "llama.cpp"
    _fake_llama_tree(src)
    few = {"strategies": [{"id": "baseline", "spec_type": "none"}], "runs": 1,
           "llama_cpp": {"path": str(src)}, "timeouts": {"load_s": 20, "request_s": 20}}
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw.update(few, name="first", tasks=[t for t in raw["tasks"] if t["id"] == "json-out"])
    path = write_manifest(tmp_path / "first", yaml.safe_dump(raw, allow_unicode=True), "first.yaml")
    first = mf.load(path)
    assert images.find(LocalEngine(docker_client), first) is None
    with pytest.raises(KitError, match=r"no image of manifest first's build .* on local; run `invoke build "
                                       r".*drop --no-build"):
        runner.run(trusted(path, True), results_dir=tmp_path / "r", models_dir=models_dir, progress=False,
                   log=lambda s: None, build_missing=False)
    lines: list[str] = []
    image_id = None
    try:
        out = runner.run(trusted(path, True), results_dir=tmp_path / "r", models_dir=models_dir, run_id="built",
                         progress=False, log=lines.append)
        assert any("no image of this build yet; building it now" in ln for ln in lines)
        assert any(ln.startswith("build: building specbench/llama-server:cpu-") for ln in lines)  # its progress
        assert "0 ok, 1 failed" in out  # the fake server exits at once: the run records it and goes on
        found = images.find(LocalEngine(docker_client), first)
        assert found is not None and found.image.labels["specbench.source"].startswith('{"content_sha256"')
        image_id = found.image.id
        raw.update(name="second", runs=3)
        second = mf.load(write_manifest(tmp_path / "second", yaml.safe_dump(raw, allow_unicode=True), "second.yaml"))
        again = images.find(LocalEngine(docker_client), second)
        assert again is not None and again.image.id == image_id and again.tag == found.tag
        rec = bd.build(LocalEngine(docker_client), trusted(second, True), log=lines.append)
        assert rec.reused and rec.image_id == image_id and rec.server_version.startswith("version: 1")
        (src / "tools" / "server" / "server.c").write_text("int main(void) { return 2; }\n")
        assert images.find(LocalEngine(docker_client), second) is None  # the folder's content is its identity
    finally:
        if image_id:
            docker_client.images.remove(image_id, force=True)
