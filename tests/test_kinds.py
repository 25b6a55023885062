"""Spec types and backends are rows (harness/intake/spec_types.py, harness/image/backends.py): held here against the
schemas' enums, and a new one of each shown to be one row plus a schema entry, through validate, the plan, the
pre-flight and `invoke build --plan`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from invoke import Config, Context, Exit

import tasks
from harness import DOCKER, SCHEMAS, KitError, schema
from harness.hosts import devices
from harness.hosts.access import Access
from harness.hosts.engine import container_options
from harness.image import backends
from harness.intake import flags, spec_types
from harness.intake import manifest as mf
from harness.models import gguf_facts as gf
from harness.models import passbytes, preflight
from harness.run import plan
from harness.run.server import GPU_LOG_FLAGS, server_spec
from tests.conftest import DEMO, write_manifest

SPEC_TYPE_ENUMS = [("manifest", ("properties", "strategies", "items", "properties", "spec_type"))]
BACKEND_ENUMS = [("manifest", ("properties", "build", "properties", "backend")),
                 ("build", ("properties", "plan", "properties", "backend"))]
GPU_BACKEND_ENUMS = [("run", ("properties", "environment", "additionalProperties", "properties", "devices",
                              "properties", "backend"))]


def _enum(name: str, path: tuple[str, ...], folder: Path = SCHEMAS) -> list[str]:
    node = json.loads((folder / f"{name}.schema.json").read_text())
    for key in path:
        node = node[key]
    return node["enum"]


# ---------------------------------------------------------------- the rows against the schemas


def test_every_spec_type_the_schema_names_has_a_row_in_its_order():
    for name, path in SPEC_TYPE_ENUMS:
        assert _enum(name, path) == spec_types.names(), name


def test_every_backend_the_schemas_name_has_a_row_in_its_order():
    for name, path in BACKEND_ENUMS:
        assert _enum(name, path) == backends.names(), name
    for name, path in GPU_BACKEND_ENUMS:
        assert _enum(name, path) == [b.name for b in backends.BACKENDS if b.gpu], name


def test_spec_type_rows_say_what_the_rules_understand():
    assert [t.name for t in spec_types.SPEC_TYPES if not t.speculative] == ["none"]
    for t in spec_types.SPEC_TYPES:
        assert set(t.flavours) <= set(preflight.FLAVOURS), t.name
        assert t.drafter_arch is None or t.drafter_arch in preflight.DRAFTER_ARCHS, t.name
        assert t.drafting in (spec_types.SEQUENTIAL, spec_types.BLOCK, None), t.name
        assert not t.drafter_arch or t.draft_file, t.name  # a drafter architecture is a file's
        assert t.speculative or not (t.draft_file or t.flavours or t.drafting), t.name
        for f in t.tuning_flags:
            assert flags.ALLOWED.get(f) == 1, f
        for f in t.selecting_flags:
            assert f in flags.RESERVED and f not in flags.ALLOWED, f
    # each drafter flavour is run by exactly one type
    runs = [f for t in spec_types.SPEC_TYPES for f in t.flavours]
    assert sorted(runs) == sorted(set(runs))
    with pytest.raises(KitError, match="'draft-x' is not one of"):
        spec_types.get("draft-x")
    assert spec_types.is_speculative("draft-x")  # a type of a later kit, in a run folder: not taken for a baseline


def test_backend_rows_say_what_the_kit_can_do():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    roles = [b.role for r in backends.BACKENDS for b in r.debian or ()]
    assert len(roles) == len(set(roles))
    for b in backends.BACKENDS:
        assert b.device_list in (devices.VULKAN_LIST, devices.NVIDIA_SMI, None), b.name
        assert b.image_check in (backends.VULKAN_CHECK, backends.CUDA_CHECK, None), b.name
        assert set(b.doctor) <= {backends.GPUS, backends.NVIDIA_RUNTIME, backends.VULKAN_DEVICES}, b.name
        assert b.gpu == bool(b.gpu_request or b.render_nodes), b.name  # a GPU backend's containers reach one
        assert b.probe.program in dockerfile, b.name  # the probe the row names is built into the image
        assert all(f.startswith("-D") for f in b.cmake), b.name
        assert b.visible_env is None or b.visible_env.isupper(), b.name
    with pytest.raises(KitError, match="'rocm' is not one of"):
        backends.get("rocm")


# ---------------------------------------------------------------- a new one of each: a row and a schema entry

#: A block drafter that reads DFlash files (a tree of drafts, say), with a width flag of its own.
DTREE = spec_types.SpecType("draft-dtree", draft_file=True, drafter_arch="dflash", flavours=("dflash1", "dflash2"),
                            drafting=spec_types.BLOCK, selecting_flags=("--dtree",),
                            tuning_flags=("--spec-dtree-width",))
#: A render-node GPU backend on Debian bases (AMD's HIP, say) that lists no devices yet.
HIP = backends.Backend(
    "hip", "HIP", gpu=True,
    debian=(backends.Base("hip-builder", "trixie", ("build-essential", "cmake", "ca-certificates", "pkg-config",
                                                   "hipcc", "libhipblas-dev", "librocblas-dev")),
            backends.Base("hip-runtime", "trixie", ("libgomp1", "ca-certificates", "libhipblas0"))),
    cmake=("-DGGML_HIP=ON",), probe=backends.Probe("specbench-probe", 256, 10), render_nodes=True,
    visible_env="HIP_VISIBLE_DEVICES")


@pytest.fixture()
def one_row_each(tmp_path, monkeypatch):
    """The kit with DTREE and HIP: one row added to each table, and each name added to a copy of the schemas."""
    folder = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, folder)
    for names, new in ((SPEC_TYPE_ENUMS, DTREE.name), (BACKEND_ENUMS + GPU_BACKEND_ENUMS, HIP.name)):
        for name, path in names:
            doc = json.loads((folder / f"{name}.schema.json").read_text())
            node = doc
            for key in path:
                node = node[key]
            node["enum"].append(new)
            (folder / f"{name}.schema.json").write_text(json.dumps(doc, indent=2))
    monkeypatch.setattr(schema, "SCHEMAS", folder)
    monkeypatch.setattr(spec_types, "SPEC_TYPES", (*spec_types.SPEC_TYPES, DTREE))
    monkeypatch.setattr(backends, "BACKENDS", (*backends.BACKENDS, HIP))
    _reload()
    yield
    monkeypatch.undo()
    _reload()


def _reload() -> None:
    """What a module derives from the tables or the schemas when it is loaded: the allowed flags, the validators."""
    import importlib

    importlib.reload(flags)
    schema.load.cache_clear()
    schema.validator.cache_clear()


def _manifest(folder: Path) -> Path:
    raw = yaml.safe_load(DEMO.read_text())
    raw["build"] = {"backend": "hip"}
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "dflash2", "spec_type": "draft-dflash", "draft": "dflash2"},
                         {"id": "tree", "spec_type": "draft-dtree", "draft": "dflash2",
                          "args": ["--spec-dtree-width", "4"]}]
    return write_manifest(folder, yaml.safe_dump(raw, sort_keys=False))


def _ctx() -> Context:
    return Context(Config(overrides={"specbench": {}}))


def test_without_its_schema_entry_a_new_name_is_refused(tmp_path):
    with pytest.raises(KitError, match=r"'hip' is not one of \['cpu', 'cuda', 'vulkan'\]"):
        mf.load(_manifest(tmp_path))
    raw = yaml.safe_load(_manifest(tmp_path).read_text())
    raw["build"]["backend"] = "cpu"
    with pytest.raises(KitError, match=r"strategies\[2\]\.spec_type: 'draft-dtree' is not one of"):
        mf.load(write_manifest(tmp_path, yaml.safe_dump(raw), "cpu.yaml"))


def test_a_new_spec_type_and_backend_validate_and_plan(one_row_each, tmp_path, models_dir, capsys):
    path = _manifest(tmp_path)
    m = mf.load(path)
    assert [s.spec_type for s in m.strategies] == ["none", "draft-dflash", "draft-dtree"]
    assert m.strategy("tree").speculative and m.baseline_for(m.strategy("tree")).id == "baseline"
    planned = plan.make_plan(m, ["local"], shuffle_seed=0)
    assert {i.cell.strategy.id for i in planned.items} == {"baseline", "dflash2", "tree"}
    tasks.validate(_ctx(), manifest=str(path), models_dir=str(models_dir))  # the models are there: pre-flight runs
    out = capsys.readouterr().out
    assert "build: hip;" in out and "--spec-type draft-dtree draft=dflash2 --spec-dtree-width 4 (vs baseline)" in out
    # its selecting flag is the kit's to set, its own flag is allowed only where a manifest may pass flags
    assert "the kit sets the speculative type" in flags.check(["--dtree"]).message
    with pytest.raises(KitError, match=r"strategies\[0\].args\[0\]"):
        raw = yaml.safe_load(path.read_text())
        raw["strategies"][0]["args"] = ["--dtree"]
        mf.load(write_manifest(tmp_path / "bad", yaml.safe_dump(raw)))


def test_a_new_spec_type_gets_the_preflight_and_physics_of_its_row(one_row_each, tmp_path, models_dir, capsys):
    t, d2, ds = (gf.read_facts(models_dir / f"tiny-{n}.gguf") for n in ("target", "dflash2", "dspark"))
    every = set(preflight.FLAVOURS)
    assert preflight.check("draft-dtree", t, d2, every) == []
    assert preflight.check("draft-dtree", t, None, every) == [
        "models.draft: no draft file given; spec type draft-dtree reads one (-md)"]
    (line,) = preflight.check("draft-dtree", t, ds, every)
    assert "a dspark file under spec type draft-dtree" in line and "expected spec type draft-dspark" in line
    (line,) = preflight.check("draft-dtree", t, d2, every - {"dflash2"})
    assert "a dflash2 drafter" in line
    # `invoke validate` runs the same rules on the files it finds
    raw = yaml.safe_load(_manifest(tmp_path).read_text())
    raw["strategies"][2]["draft"] = "dspark"
    path = write_manifest(tmp_path, yaml.safe_dump(raw), "dspark.yaml")
    with pytest.raises(Exit):
        tasks.validate(_ctx(), manifest=str(path), models_dir=str(models_dir))
    err = capsys.readouterr().err
    assert "strategies tree: models.dspark" in err and "expected spec type draft-dspark" in err
    # a block drafter: one draft step per call, whatever it drafted
    assert passbytes.draft_steps("draft-dtree", 40, 10, calls=10) == 1.0
    assert passbytes.draft_steps("draft-simple", 40, 10) == 4.0


def test_a_new_backend_builds_its_plan_and_reaches_its_devices(one_row_each, tmp_path, capsys):
    path = _manifest(tmp_path)
    tasks.build(_ctx(), manifest=str(path), plan=True)
    p = json.loads(capsys.readouterr().out)
    assert p["backend"] == "hip" and "-DGGML_HIP=ON" in p["cmake_args"]
    assert p["base_image"].startswith("specbench/base-hip-builder:trixie-")
    assert p["runtime_image"].startswith("specbench/base-hip-runtime:trixie-")
    assert p["labels"]["specbench.backend"] == "hip" and p["labels"]["specbench.cuda-architectures"] == ""
    tasks.build(_ctx(), manifest=str(path), backend="hip", plan=True)  # --backend hip: the name is known
    assert json.loads(capsys.readouterr().out)["tag"] == p["tag"]
    # its containers get the host's render nodes and the variable that picks a device, no shader cache
    acc = devices.access_from_nodes(HIP, [("/dev/dri/renderD128", 105), ("/dev/kfd", 105)]).with_visible(0)
    assert container_options(acc) == {"devices": ["/dev/dri/renderD128:/dev/dri/renderD128:rwm",
                                                  "/dev/kfd:/dev/kfd:rwm"],
                                      "group_add": ["105"], "environment": {"HIP_VISIBLE_DEVICES": "0"}}
    m = mf.load(path)
    paths = {k: tmp_path / f"{k}.gguf" for k in m.models}
    command = server_spec(m, m.strategy("tree"), paths, "img", 1, Access("hip")).command
    at = command.index("--host")  # a GPU backend's server logs its device lines
    assert command[at - len(GPU_LOG_FLAGS):at] == GPU_LOG_FLAGS
    assert "--spec-type" in command and command[command.index("--spec-type") + 1] == "draft-dtree"
