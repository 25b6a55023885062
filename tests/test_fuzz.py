"""Manifests fuzzed with hypothesis: every input is either a valid plan or a one-line error, never a traceback."""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.intake import manifest as mf
from harness.run.plan import make_plan
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
    plan = make_plan(m, ["local"], shuffle_seed=1)
    assert len(plan.items) == len(m.strategies) * len(m.tasks) * m.runs
