"""The pieces of one measurement without Docker: the llama-server command line a strategy gets, the record
builder both protocols share, and the plan's rounds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from harness import schema
from harness.hosts.devices import Access
from harness.hosts.engine import container_options
from harness.intake import manifest as mf
from harness.run import plan as pl
from harness.run.client import MeasurementFailed
from harness.run.protocol import PROTOCOLS, Context, MeasurementProtocol, new_record, set_failure
from harness.run.server import server_command, server_spec
from tests.conftest import DEMO, write_manifest

DEMO_M = mf.load(DEMO)
PATHS = {"target": Path("/m/tiny-target.gguf"), "draft": Path("/m/tiny-draft.gguf")}


def test_server_command_binds_loopback_and_mounts_only_its_models():
    s = DEMO_M.strategy("draft-simple")
    cmd = server_command(DEMO_M, s, PATHS, 4242)
    assert cmd[:5] == ["llama-server", "-m", "/models/target/tiny-target.gguf", "-md", "/models/draft/tiny-draft.gguf"]
    assert cmd[cmd.index("--spec-type") + 1] == "draft-simple" and cmd.count("--spec-type") == 1
    assert cmd[-5:] == ["--host", "127.0.0.1", "--port", "4242", "--no-webui"]
    assert "--spec-draft-n-max" in cmd
    spec = server_spec(DEMO_M, DEMO_M.strategy("baseline"), PATHS, "img", 1, Access("cpu"))
    assert [m.container_path for m in spec.mounts] == ["/models/target/tiny-target.gguf"]
    assert container_options(spec.access) == {} and "-lv" not in spec.command
    # a GPU backend's server logs its load lines (device, layers, buffers), before the kit's own flags
    gpu = server_spec(DEMO_M, DEMO_M.strategy("baseline"), PATHS, "img", 1, Access("vulkan"))
    assert gpu.command[-7:] == ["-lv", "4", "--host", "127.0.0.1", "--port", "1", "--no-webui"]


def test_strategy_on_its_own_target_and_parallel_slots(tmp_path):
    raw = yaml.safe_load(DEMO.read_text())
    raw["models"]["other"] = {"file": "other.gguf"}
    raw["server_args"] = ["--ctx_size=4096", "--parallel", "1", "-t", "2"]
    raw["strategies"] = [{"id": "baseline", "spec_type": "none"},
                         {"id": "other-base", "spec_type": "none", "model": "other"},
                         {"id": "other-ngram", "spec_type": "ngram-mod", "model": "other", "parallel": 3}]
    m = mf.load(write_manifest(tmp_path, yaml.safe_dump(raw), "own.yaml"))
    s = m.strategy("other-ngram")
    assert m.baseline_for(s).id == "other-base" and m.baseline_for(m.strategy("baseline")).id == "baseline"
    cmd = server_command(m, s, {"other": Path("/x/other.gguf")}, 1)
    assert cmd[1:3] == ["-m", "/models/other/other.gguf"]
    # `--ctx_size=4096` reaches the server as llama-server reads it; the strategy's slots replace --parallel 1
    # (llama-server splits the context among the slots: each of the 3 clients keeps 4096)
    assert cmd[cmd.index("--ctx-size") + 1] == str(4096 * 3) and cmd.count("--parallel") == 1
    assert cmd[cmd.index("--parallel") + 1] == "3"


def test_record_builder_gives_schema_valid_ok_and_failed_records():
    p = pl.make_plan(DEMO_M, ["local"], runs=1, shuffle_seed=3)
    item = p.items[0]
    ctx = Context("r1", DEMO_M, "img", "cpu", {"local": PATHS}, lambda e, w: None)
    rec = new_record(ctx, item, "fresh-container")
    assert rec["measurement_id"] == item.measurement_id and rec["prompt"] == item.cell.task.id
    set_failure(rec, MeasurementFailed("server exited during load (exit code 1): boom", "log...", "load"))
    rec.update(wall_s=0.5)
    assert schema.errors("result", rec) == []
    assert rec["status"] == "failed" and rec["failure"]["phase"] == "load"


def test_rounds_shuffle_every_cell_once_per_round_reproducibly():
    a = pl.make_plan(DEMO_M, ["local"], runs=3, shuffle_seed=11)
    b = pl.make_plan(DEMO_M, ["local"], runs=3, shuffle_seed=11)
    assert [i.measurement_id for i in a.items] == [i.measurement_id for i in b.items]
    rounds = [[i.cell.id for i in a.items if i.round == r] for r in (1, 2, 3)]
    assert all(sorted(x) == sorted(rounds[0]) for x in rounds) and rounds[0] != rounds[1]
    more = a.add_rounds(4, 4)
    assert len(more) == len(DEMO_M.strategies) * 8 and {i.round for i in more} == {4}


def test_prompt_sets_make_one_cell_per_prompt(tmp_path):
    raw = yaml.safe_load(DEMO.read_text())
    raw.pop("distribution")  # the demo's sampling study is not what this measures
    raw["tasks"] = [{"id": "code", "n_predict": 16, "prompts": ["tasks/code-gen.md",
                                                                {"file": "tasks/code-edit.md", "id": "edit"}]}]
    m = mf.load(write_manifest(tmp_path, yaml.safe_dump(raw), "sets.yaml"))
    assert [p.id for p in m.task("code").prompts] == ["code-gen", "edit"]
    p = pl.make_plan(m, ["h"], runs=2, shuffle_seed=1)
    assert len(p.items) == len(m.strategies) * 2 * 2
    assert "h/baseline/code/edit/2" in {i.measurement_id for i in p.items}
    assert "(2 prompts)" in p.describe()


def test_subset_keeps_the_baselines_it_needs():
    strats, _ = pl.select(DEMO_M, ["ngram-mod"], None)
    assert [s.id for s in strats] == ["baseline", "ngram-mod"]


def test_plan_size_is_bounded():
    import pytest

    from harness import KitError

    big = dataclasses.replace(DEMO_M, runs=1)
    with pytest.raises(KitError, match="at most 100,000"):
        pl.make_plan(big, [f"h{i}" for i in range(4000)], runs=1, shuffle_seed=1)


def test_both_protocols_are_measurement_protocols():
    """The executor needs of a protocol only its name, whether it retakes, and `run`: both have them, and only
    the fresh container measures a disturbed measurement again (a warmed server would not measure it anew)."""
    made = {name: cls() for name, cls in PROTOCOLS.items()}
    assert set(made) == {"fresh-container", "reuse-server"}
    assert all(isinstance(p, MeasurementProtocol) and p.name == name for name, p in made.items())
    assert made["fresh-container"].retakes and not made["reuse-server"].retakes
