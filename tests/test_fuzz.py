"""Manifests fuzzed with hypothesis: every input is either a valid plan or a one-line error, never a traceback."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import KitError
from harness.intake import flags, sweep
from harness.intake import manifest as mf
from harness.run.plan import make_plan
from harness.run.server import server_command
from harness.store.runmeta import MAX_MEASUREMENTS
from tests.conftest import DEMO, write_manifest

BASE = yaml.safe_load(DEMO.read_text())

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False, width=32),
                    st.text(max_size=12), st.sampled_from(["none", "draft-simple", "ngram-mod", "target", "draft",
                                                          "tasks/en-prose.md", "../x.md", "cpu", "cuda"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


ALL_PATHS = [p for p in _paths(BASE) if p]


@st.composite
def mutated(draw):
    raw = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(ALL_PATHS))
        node = raw
        try:
            for p in path[:-1]:
                node = node[p]
            if draw(st.booleans()) and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = draw(values)
        except (KeyError, IndexError, TypeError):
            continue
    return raw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(mutated(), values))
def test_fuzzed_manifest_gives_plan_or_one_line_error(tmp_path_factory, raw):
    folder = tmp_path_factory.mktemp("fuzz")
    path = write_manifest(folder, yaml.safe_dump(raw, allow_unicode=True), "fuzz.yaml")
    try:
        m = mf.load(path)
    except mf.ManifestError as e:
        msg = str(e)
        assert msg.startswith(str(path)) and "\n" not in msg and "Traceback" not in msg
        return
    try:
        plan = make_plan(m, ["local"], shuffle_seed=1)
    except KitError as e:  # more measurements than a run may make, the confirmation rounds counted
        assert "\n" not in str(e) and "at most 100,000" in str(e)
        return
    assert len(plan.items) == len(m.strategies) * len(m.tasks) * m.runs


# ---------------------------------------------------------------- sweeps and concurrency levels

#: Flags a sweep or args may name, with spellings of one option side by side, and values as a manifest may write
#: them: numbers, the same number written otherwise, non-finite and non-numeric text.
SWEEP_FLAGS = ["--spec-draft-p-min", "--draft-p-min", "--spec-draft-n-max", "--spec-ngram-simple-size-n",
               "--spec-ngram-simple-size-m", "--threads-draft", "-td", "--cpu-strict", "-np", "--parallel", "-t"]
GOOD_VALUES = st.one_of(st.integers(1, 64), st.sampled_from([0.5, 0.75, 0.9, "0.5", "0.50", "5e-1", "1", "01"]))
ODD_VALUES = st.one_of(st.integers(-2, 0), st.sampled_from(["nan", "inf", "-inf", "q8_0", "x", 2.0, 1e-3]))
SWEEP_VALUES = st.one_of(GOOD_VALUES, GOOD_VALUES, GOOD_VALUES, ODD_VALUES)
LEVELS = st.one_of(st.none(), st.none(), st.integers(1, 8), st.lists(st.integers(1, 8), min_size=1, max_size=3,
                                                                     unique=True),
                   st.sampled_from([0, 70, 4.0, True, "2", [1, 2.0], [2, 2]]))


@st.composite
def swept_manifests(draw):
    raw = copy.deepcopy(BASE)
    entries = [{"id": "baseline", "spec_type": "none"}]
    for i in range(draw(st.integers(1, 3))):
        e = {"id": f"s{i}", "spec_type": draw(st.sampled_from(["ngram-simple", "ngram-mod", "ngram-mod", "none"]))}
        sweep = draw(st.dictionaries(st.sampled_from(SWEEP_FLAGS), st.lists(SWEEP_VALUES, min_size=1, max_size=3,
                                                                            unique_by=str), max_size=2))
        if sweep:
            e["sweep"] = sweep
        level = draw(LEVELS)
        if level is not None:
            e["parallel"] = level
        args = draw(st.lists(st.tuples(st.sampled_from(SWEEP_FLAGS), SWEEP_VALUES), max_size=1))
        if args:
            e["args"] = [str(x) for pair in args for x in pair]
        entries.append(e)
    raw["strategies"] = entries
    slots = draw(st.sampled_from([None, None, "1", "4", "0", "4.0"]))
    raw["server_args"] = ["-c", "4096", "-t", "2"] + (["-np", slots] if slots else [])
    raw["confirm_rounds"] = draw(st.sampled_from([0, 1, 2, 3, 100, 2.0]))
    raw["runs"] = draw(st.sampled_from([1, 2, 3, 3, 1000]))
    return raw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=swept_manifests())
def test_a_manifest_with_sweeps_and_levels_gives_a_plan_that_measures_what_it_says(tmp_path_factory, raw):
    path = write_manifest(tmp_path_factory.mktemp("fuzzsweep"), yaml.safe_dump(raw), "fuzz.yaml")
    try:
        m = mf.load(path)
        plan = make_plan(m, ["local"], shuffle_seed=1)
    except KitError as e:
        assert "\n" not in str(e) and "Traceback" not in str(e) and str(e).strip()
        return
    ids = [s.id for s in m.strategies]
    assert len(set(ids)) == len(ids)
    for fam in {s.family_id for s in m.strategies}:
        combos = [(s.parallel, frozenset((flags.option(f), sweep.value_key(v)) for f, v in s.sweep))
                  for s in m.strategies if s.family_id == fam]
        assert len(set(combos)) == len(combos)  # no two combinations measure the same thing
    paths = {k: Path(f"{k}.gguf") for k in m.models}
    for s in m.strategies:
        cmd = server_command(m, s, paths, 8080)
        slots = [int(cmd[i + 1]) for i, a in enumerate(cmd) if flags.option(a) == "--parallel"]  # "01" is 1 slot
        assert slots in ([], [s.parallel]) and (s.parallel == 1 or slots == [s.parallel])
        assert all(math.isfinite(float(v)) for _, v in s.sweep if v.lstrip("+-").replace(".", "", 1).isdigit())
    assert len(plan.items) <= MAX_MEASUREMENTS
