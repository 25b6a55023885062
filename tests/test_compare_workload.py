"""`invoke compare` names every workload property that differs between A and B (server flags, strategy flags,
sampling, n_predict, prompts by sha256, protocol) before its verdict and calls no such pair a reproduction; a run
compared with itself is told to be its own records."""

from __future__ import annotations

import json
import shutil

from harness import ROOT
from harness.analysis import compare as cmp
from harness.analysis import workload
from harness.analysis.reproduction import Call
from harness.report import compare as compare_words

RUN = ROOT / "results" / "real-gemma3-270m"


def _copy(tmp_path, name, edit=None):
    d = tmp_path / name
    shutil.copytree(RUN, d)
    if edit:
        recs = [json.loads(x) for x in (d / "measurements.jsonl").read_text().splitlines() if x.strip()]
        (d / "measurements.jsonl").write_text("".join(json.dumps(edit(r)) + "\n" for r in recs))
    return d


def test_flags_of_a_server_command_leave_out_what_differs_by_design():
    cmd = ["llama-server", "-m", "/models/t.gguf", "--spec-type", "ngram-mod", "-t", "2", "--flash-attn",
           "--temp", "-1", "--port", "5001", "--host", "127.0.0.1", "--no-webui"]
    assert workload.flags(cmd) == {"--spec-type": "ngram-mod", "-t": "2", "--flash-attn": "", "--temp": "-1",
                                   "--no-webui": ""}


def test_two_runs_that_differ_only_in_threads_name_the_difference_and_are_not_a_reproduction(tmp_path):
    def one_thread(r):
        cmd = r["server_command"]
        r["server_command"] = [("1" if i and cmd[i - 1] == "-t" else x) for i, x in enumerate(cmd)]
        r["container_id"] = "b" + str(r.get("container_id"))  # B's own measurements
        return r

    a, b = RUN, _copy(tmp_path, "b", one_thread)
    res = cmp.compare(a, b)
    work = [d for d in res.differences if d.kind == "workload"]
    assert [(d.field, d.a, d.b) for d in work] == [("server flag -t (every strategy)", "2", "1")]
    assert res.call is Call.NOT_COMPARABLE and "server flag -t (every strategy)" in res.verdict
    assert all(res.row_call(r) in (Call.NOT_COMPARABLE, Call.MISSING, Call.BASELINE) for r in res.rows)
    text = compare_words.text(res)
    assert text.index("server flag -t (every strategy): A 2 | B 1") < text.index("verdict:")


def test_a_task_whose_prompt_and_n_predict_changed_is_named(tmp_path):
    b = _copy(tmp_path, "b", lambda r: {**r, "container_id": "b" + str(r.get("container_id"))})
    meta = json.loads((b / "run.json").read_text())
    task = next(t for t in meta["tasks"] if t["id"] in meta["plan"]["tasks"])
    task["n_predict"] += 1
    task["prompts"][0]["sha256"] = "0" * 64
    (b / "run.json").write_text(json.dumps(meta))
    fields = {d.field for d in cmp.compare(RUN, b).differences if d.kind == "workload"}
    assert fields == {f"n_predict ({task['id']})", f"prompts ({task['id']})"}


def test_a_run_compared_with_itself_says_b_records_are_a_records():
    res = cmp.compare(RUN, RUN)
    assert res.same_records and res.shared[0] == res.shared[1] > 0 and res.call is Call.NOT_COMPARABLE
    assert res.verdict.startswith("not a reproduction: B's records are A's")
    assert not [d for d in res.differences if d.kind == "workload"]
