"""Shared fixtures: a real Docker engine, the real demo image (built once per session), tiny real models,
and one real demo run that the run and report tests read."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from harness import ROOT, KitError
from harness import build as bd
from harness import manifest as mf
from harness import models as md

DEMO = ROOT / "manifests" / "demo-cpu.yaml"
SPARK = ROOT / "manifests" / "spark-qwen3.8-27b.yaml"


def pytest_collection_modifyitems(config, items):
    # The slow, image-dependent tests go last, so the quick ones report first.
    items.sort(key=lambda it: 1 if it.get_closest_marker("image") else 0)


@pytest.fixture(scope="session")
def docker_client():
    """The real Docker engine. Its absence is a failure, never a skip."""
    from harness import engine

    try:
        return engine.connect()
    except KitError as e:
        pytest.fail(f"a Docker engine is required for these tests: {e}")


@pytest.fixture(scope="session")
def demo_manifest() -> mf.Manifest:
    return mf.load(DEMO)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """The demo's tiny models, generated once for the session."""
    d = tmp_path_factory.mktemp("models")
    md.ensure(mf.load(DEMO), d, download=False, log=lambda s: None)
    md.write_tiny(d / "tiny-foreign.gguf", "tiny-foreign", 7)
    return d


@pytest.fixture(scope="session")
def demo_image(docker_client, demo_manifest) -> dict:
    """The real CPU image built from the pinned sdist on the debootstrap base (reused when already built)."""
    lines: list[str] = []

    def log(s: str) -> None:
        lines.append(s)
        print(s, file=sys.stderr, flush=True)

    return bd.build(docker_client, demo_manifest, log=log)


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("results")


def write_manifest(folder: Path, text: str, name: str = "m.yaml") -> Path:
    """A manifest in `folder` with the demo's task prompts beside it (prompts must live in the manifest's folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tasks").exists():
        shutil.copytree(ROOT / "manifests" / "tasks", folder / "tasks")
    p = folder / name
    p.write_text(text)
    return p


@pytest.fixture()
def chdir_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def demo_run(demo_image, models_dir, results_dir) -> Path:
    """One real demo run: every strategy and task, 2 runs each, one fresh container per measurement."""
    from harness import session

    session.run(DEMO, results_dir=results_dir, models_dir=models_dir, run_id="demo-run", runs=2, seed=1234,
                progress=False, log=lambda s: None)
    return results_dir / "demo-run"
