"""Run folders, GGUF headers and derive parents fuzzed with hypothesis: every input is a correct result or a
one-line KitError, never a traceback; what comes out to the terminal holds no escape, and a derived drafter is
never larger than its parent nor left behind half-written."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import KitError
from harness.analysis import compare as cmp
from harness.analysis.summary import summarize
from harness.models import gguf_facts
from harness.models.derive import derive_layer_skip
from harness.report import compare as compare_words
from harness.store.rundir import RunDir
from tests.crafted import DEMO_RUN, layered_gguf, raw_gguf

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


def _one_line_error(e: KitError) -> None:
    msg = str(e)
    assert "Traceback" not in msg and msg.strip(), msg


# ---------------------------------------------------------------- run folders


#: What a forged run folder puts where a value was: wrong types, overflowing numbers, escapes, empties.
odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([1e308, -1e308, 1e16, 0.0, -1.0, 2.5]),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=12), st.just("\x1b]0;pwned\x07\x1b[2K\rverdict: x"),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
JSON_LITERALS = ["NaN", "Infinity", "-Infinity", "1e400", "[]", "{}", "\"\\u001b[2K\"", "null", "1e308"]


def _paths(node, prefix=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


#: A small slice of the committed demo run (two strategies, two tasks: 12 records), so each example is quick.
_KEEP_STRATEGIES, _KEEP_TASKS = ["baseline", "ngram-mod"], ["code-gen", "json-out"]
_META = json.loads((DEMO_RUN / "run.json").read_text())
_META["plan"].update(strategies=_KEEP_STRATEGIES, tasks=_KEEP_TASKS, measurements=12)
_RECORDS = [json.loads(x) for x in (DEMO_RUN / "measurements.jsonl").read_text().splitlines()
            if x.strip() and json.loads(x)["strategy"] in _KEEP_STRATEGIES and json.loads(x)["task"] in _KEEP_TASKS]
META_PATHS = [p for p in _paths(_META) if p[0] not in ("manifest",)]
RECORD_PATHS = list(_paths(_RECORDS[0]))


def _write_run(run: Path, meta: dict, lines: list[str]) -> Path:
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(meta))
    (run / "measurements.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _set(obj, path, value) -> None:
    """Put value at path; a path an earlier edit removed is left alone."""
    node = obj
    try:
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass


@st.composite
def forged_runs(draw):
    meta_edits = draw(st.lists(st.tuples(st.sampled_from(META_PATHS), odd_values), max_size=2))
    record_edits = draw(st.lists(st.tuples(st.integers(0, len(_RECORDS) - 1), st.sampled_from(RECORD_PATHS),
                                           odd_values), max_size=3))
    literal = draw(st.none() | st.tuples(st.integers(0, len(_RECORDS) - 1), st.sampled_from(RECORD_PATHS[:40]),
                                         st.sampled_from(JSON_LITERALS)))
    return meta_edits, record_edits, literal


@FUZZ
@given(forged=forged_runs())
def test_a_forged_run_folder_is_analysed_or_one_line(tmp_path_factory, forged):
    meta_edits, record_edits, literal = forged
    folder = tmp_path_factory.mktemp("fuzzrun")
    base = _write_run(folder / "base", _META, [json.dumps(r) for r in _RECORDS])
    meta = copy.deepcopy(_META)
    for path, value in meta_edits:
        _set(meta, path, value)
    lines = [json.dumps(r) for r in _RECORDS]
    for i, path, value in record_edits:
        rec = json.loads(lines[i])
        _set(rec, path, value)
        lines[i] = json.dumps(rec)
    if literal is not None:
        i, path, text = literal
        rec = json.loads(lines[i])
        _set(rec, path, "@@LITERAL@@")
        lines[i] = json.dumps(rec).replace('"@@LITERAL@@"', text)
    run = _write_run(folder / "forged", meta, lines)
    try:
        summary = summarize(RunDir.open(run))
        assert summary["measurements"]["ok"] <= len(_RECORDS)
        text = compare_words.text(cmp.compare(base, run))
    except KitError as e:
        _one_line_error(e)
        return
    assert not any(ord(c) < 32 and c != "\n" for c in text) and "\x9b" not in text


# ---------------------------------------------------------------- GGUF headers


def _honest_parent() -> bytes:
    kv, tensors, data = layered_gguf()
    return raw_gguf(kv, tensors, data)


HONEST = _honest_parent()
HEADER_END = len(HONEST) - 6 * 32


@st.composite
def mutated_headers(draw):
    data = bytearray(HONEST)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["byte", "u64", "cut"]))
        at = draw(st.integers(0, HEADER_END - 8))
        if at + 8 > len(data):  # an earlier cut took this part away
            continue
        if kind == "byte":
            data[at] = draw(st.integers(0, 255))
        elif kind == "u64":
            data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from([0, 1, 3, 2**31, 2**32 - 1, 2**62, 2**64 - 1])))
        else:
            del data[draw(st.integers(0, len(data))):]
    return bytes(data)


@FUZZ
@given(data=mutated_headers())
def test_a_mutated_gguf_header_gives_facts_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzzgguf") / "m.gguf"
    path.write_bytes(data)
    for read in (lambda: gguf_facts.read_facts(path), lambda: gguf_facts.facts_from_prefix(data, "prefix")):
        try:
            facts = read()
        except KitError as e:
            _one_line_error(e)
            continue
        assert facts.tensor_count <= gguf_facts.MAX_TENSORS and facts.header_bytes <= len(data)


# ---------------------------------------------------------------- derive parents


@st.composite
def crafted_parents(draw):
    kv, tensors, data = layered_gguf(blocks=draw(st.integers(2, 5)))
    tensors = list(tensors)
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(tensors) - 1))
        name, shape, ggml_type, offset = tensors[i]
        what = draw(st.sampled_from(["offset", "shape", "type", "copy", "drop"]))
        if what == "offset":
            offset = draw(st.sampled_from([0, 32, 64, 3, 2**40, 2**63, len(data), len(data) - 32]))
        elif what == "shape":
            shape = draw(st.sampled_from([(8,), (16,), (1,), (2**61, 8), (8, 8, 8, 8), (4, 2), (256,)]))
        elif what == "type":
            ggml_type = draw(st.sampled_from([0, 1, 2, 8, 30, 99, 2**31]))
        elif what == "copy":
            tensors.append((f"blk.0.copy{len(tensors)}.weight", shape, ggml_type, offset))
            continue
        else:
            tensors.pop(i)
            continue
        tensors[i] = (name, shape, ggml_type, offset)
    return raw_gguf(kv, tensors, data + b"\0" * draw(st.sampled_from([0, 32, 100])))


@FUZZ
@given(parent=crafted_parents(), keep=st.integers(0, 6))
def test_a_crafted_parent_derives_within_its_size_or_is_one_line(tmp_path_factory, parent, keep):
    folder = tmp_path_factory.mktemp("fuzzderive")
    src = folder / "parent.gguf"
    src.write_bytes(parent)
    out = folder / "models" / "d.gguf"
    try:
        derive_layer_skip(src, out, keep)
    except KitError as e:
        _one_line_error(e)
        assert not out.exists()
    else:
        assert out.stat().st_size <= len(parent) + (1 << 16)
        assert gguf_facts.read_facts(out).block_count == keep
    leftovers = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    assert leftovers in ([], ["d.gguf"])  # never a partial file


# ---------------------------------------------------------------- run folders against their own plan

#: The committed sweep run (a sweep with its confirmation rounds, concurrency levels): forged in its structure only,
#: never in its figures, so a folder the kit accepts must give the honest folder's verdicts.
SWEEP_RUN = DEMO_RUN.parent / "real-gemma3-270m-sweep"
_SWEEP_META = json.loads((SWEEP_RUN / "run.json").read_text())
_SWEEP_RECORDS = [json.loads(x) for x in (SWEEP_RUN / "measurements.jsonl").read_text().splitlines() if x.strip()]
_HONEST: dict[str, object] = {}


def _verdicts(summary: dict) -> dict:
    cells = {(c["strategy"], c["task"]): (c["speedup"], c["speedup_interval"], c["verdict"]) for c in summary["cells"]}
    return {"cells": cells, "sweeps": [s["confirmation"] for s in summary.get("sweeps", [])]}


@st.composite
def restructured_runs(draw):
    """Edits a forger makes to a run's structure: records moved to other rounds or copied into new ones (ids
    following or not), retakes that name other measurements, confirmation rounds moved, reordered, stripped of
    their purpose or of cells, levels changed."""
    meta, recs = copy.deepcopy(_SWEEP_META), copy.deepcopy(_SWEEP_RECORDS)
    extra = meta["plan"]["extra_rounds"]
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["move", "copy", "retake", "round", "reorder", "purpose", "drop-cell", "level",
                                     "max-rounds", "streams"]))
        i = draw(st.integers(0, len(recs) - 1))
        rnd = draw(st.integers(0, 9))
        fix_id = draw(st.booleans())
        if what in ("move", "copy", "retake"):
            rec = recs[i] if what == "move" else copy.deepcopy(recs[i])
            rec["round"] = rec["run_index"] = rnd if what != "retake" else rec["round"]
            if what == "retake":
                rec["retake_of"] = recs[draw(st.integers(0, len(recs) - 1))]["measurement_id"]
                rec["measurement_id"] = rec["retake_of"] + "/retake"
            elif fix_id:
                rec["measurement_id"] = rec["measurement_id"].rsplit("/", 1)[0] + f"/{rnd}"
            if what != "move":
                recs.append(rec)
        elif what == "round" and extra:
            extra[draw(st.integers(0, len(extra) - 1))]["round"] = rnd
        elif what == "reorder" and extra:
            for x in extra:
                x["cells"].reverse()
                x.get("combinations", []).reverse()
        elif what == "purpose" and extra:
            for x in extra:
                x.pop("purpose", None)
        elif what == "drop-cell" and extra:
            x = extra[draw(st.integers(0, len(extra) - 1))]
            x["cells"] = x["cells"][1:]
        elif what == "level":
            s = meta["strategies"][draw(st.integers(0, len(meta["strategies"]) - 1))]
            s["parallel"] = draw(st.sampled_from([1, 2, 4]))
        elif what == "max-rounds":
            meta["plan"]["max_rounds"] = draw(st.sampled_from([None, 3, 6, 20]))
        elif what == "streams" and recs[i].get("concurrency"):
            recs[i]["concurrency"]["streams"] = draw(st.sampled_from([1, 2, 4, 8]))
    return meta, recs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(forged=restructured_runs())
def test_a_restructured_run_folder_is_refused_or_gives_the_honest_verdicts(tmp_path_factory, forged):
    if not _HONEST:
        _HONEST.update(_verdicts(summarize(RunDir.open(SWEEP_RUN))))
    meta, recs = forged
    run = _write_run(tmp_path_factory.mktemp("fuzzplan") / "forged", meta, [json.dumps(r) for r in recs])
    try:
        summary = summarize(RunDir.open(run))
    except KitError as e:
        _one_line_error(e)
        assert "\n" not in str(e)
        return
    assert _verdicts(summary) == _HONEST
