"""A prompt suite's later turns (`turns: all`, harness/run/conversations.py): each later turn its own task, sent after
the target's own earlier answers, made once per run in a baseline container and kept in answers.json
(harness/store/answers.py) under the sha256 run.json records; the fake engine plays the servers."""

from __future__ import annotations

import json

import pytest

from harness import KitError
from harness.analysis.summary import summarize
from harness.intake import manifest as mf
from harness.intake import suites
from harness.report import categories as categories_report
from harness.run import plan
from harness.store import answers
from harness.store.rundir import RunDir
from tests.conftest import trusted, write_manifest
from tests.test_suites import demo_with, spec_bench_rows, write_jsonl


def chat_suite(tmp_path, turns: str = "all", endpoint: str = "chat", rows: list | None = None):
    sha = write_jsonl(tmp_path / "m" / "suites" / "mine.jsonl", rows or spec_bench_rows({"qa": 2, "rag": 1}))
    text = demo_with(f"  - suite: {{format: spec-bench, file: suites/mine.jsonl, sha256: {sha}, per_category: 2,\n"
                     f"              turns: {turns}, n_predict: 16}}\n")
    if endpoint != "completion":
        text = text.replace("\ntasks:\n", f"\nendpoint: {endpoint}\ntasks:\n", 1)
    return write_manifest(tmp_path / "m", text)


def test_turns_all_makes_each_later_turn_a_task_of_its_own(tmp_path, models_dir):
    man = mf.load(chat_suite(tmp_path))
    assert [(t.id, [p.id for p in t.prompts]) for t in man.tasks] == [
        ("mine.qa", ["q1", "q2"]), ("mine.qa.t2", ["q1", "q2"]), ("mine.rag", ["q3"]), ("mine.rag.t2", ["q3"])]
    assert man.tasks[1].prompts[0].text() == "And then?"  # turn 2's own user text (its sha256 recorded)
    assert man.tasks[1].prompts[0].source == "suites/mine.jsonl#1"
    assert [suites.task_turn(t.id) for t in man.tasks] == [1, 2, 1, 2]
    text = plan.render(man, models_dir)
    assert "turns all: turn k of a category is the task mine.<category>.t<k>" in text
    assert "3 answers are generated once per run before the timed rounds" in text


def test_a_question_with_fewer_turns_is_absent_from_a_later_turn(tmp_path):
    rows = [{"question_id": 1, "category": "qa", "turns": ["a?", "b?", "c?"]},
            {"question_id": 2, "category": "qa", "turns": ["d?"]}]
    man = mf.load(chat_suite(tmp_path, rows=rows))
    assert [(t.id, [p.id for p in t.prompts]) for t in man.tasks] == [
        ("mine.qa", ["q1", "q2"]), ("mine.qa.t2", ["q1"]), ("mine.qa.t3", ["q1"])]


def test_turns_all_needs_the_chat_endpoint(tmp_path):
    with pytest.raises(KitError) as e:
        mf.load(chat_suite(tmp_path, endpoint="completion"))
    msg = str(e.value)
    assert "\n" not in msg and "tasks[0].suite.turns" in msg and "endpoint: chat" in msg


def _answering(engine) -> list:
    """The containers that answered the earlier turns (labelled with no task)."""
    return [c for c in engine.started if not any(k.endswith(".task") for k in c.labels)]


def test_later_turns_follow_the_targets_own_answers_the_same_for_every_strategy(tmp_path, models_dir, world):
    from tests import fake_engine

    m = chat_suite(tmp_path)
    engine = fake_engine.fake()
    served: dict = {}  # each container's fake server, kept after the container is removed
    serve = engine._serve


    def serving(rec, labels, ctr):
        srv = served.setdefault(ctr.id, serve(rec, labels, ctr))
        if not any(k.endswith(".task") for k in labels):  # the answering container: an answer of its own per prompt
            plain = srv.plain
            srv.plain = lambda body: {**plain(body),
                                      "content": f"answer {answers.sha256_bytes(body['prompt'].encode())}"}
        return srv

    engine._serve = serving
    said = fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="turns",
                                  progress=False, log=[].append, engines=[engine],
                                  strategies=["baseline", "ngram-mod"], runs=3, seed=1)
    assert "36 ok, 0 failed" in said  # 2 strategies x (3 first turns + 3 second turns) x 3 rounds
    rd = RunDir.open(world / "r" / "turns")
    meta = rd.read_meta()
    data = (rd.path / answers.ANSWERS_FILE).read_bytes()
    assert meta.answers["sha256"] == answers.sha256_bytes(data) and meta.answers["answers"] == 3
    obj = answers.read(rd.path, meta.answers)
    assert obj["strategy"] == "baseline" and obj["temperature"] == 0.0
    by_q = {(a["task"], a["prompt"]): a["text"] for a in obj["answers"]}
    assert set(by_q) == {("mine.qa", "q1"), ("mine.qa", "q2"), ("mine.rag", "q3")}
    assert len(set(by_q.values())) == 3  # each question's own answer
    assert len(_answering(engine)) == 1  # one container answered them all, before any measurement
    assert engine.started[0] is _answering(engine)[0]
    answer_bodies = [b for p, b in served[_answering(engine)[0].id].requests if p == "/completion"]
    assert len(answer_bodies) == 3 and all(b["temperature"] == 0.0 and not b["stream"] for b in answer_bodies)
    # every strategy's turn-2 request renders the same conversation: turn 1, the answer to it, turn 2
    rendered: dict[tuple[str, str], set[str]] = {}
    for c in engine.started[1:]:
        task = next(v for k, v in c.labels.items() if k.endswith(".task"))
        for path, body in served[c.id].requests:
            if path == "/apply-template":
                roles = [x["role"] for x in body["messages"]]
                if task.endswith(".t2"):
                    assert roles == ["user", "assistant", "user"]
                    assert body["messages"][2]["content"] == "And then?"
                    qid = body["messages"][0]["content"].split()[1]  # "Question <id> about <category>: ..."
                    assert body["messages"][1]["content"] == by_q[(task.removesuffix(".t2"), f"q{qid}")]
                else:
                    assert roles == ["user"]
            if path == "/completion" and body.get("stream"):
                strategy = next(v for k, v in c.labels.items() if k.endswith(".strategy"))
                rendered.setdefault((task, body["prompt"]), set()).add(strategy)
    assert {t for t, _ in rendered} == {"mine.qa", "mine.qa.t2", "mine.rag", "mine.rag.t2"}
    assert all(s == {"baseline", "ngram-mod"} for s in rendered.values())  # the same text for both strategies

    # the report keeps turn 2 apart from turn 1, category by category, and says what a later turn is
    summary = summarize(rd)
    assert [(c["task"], c["category"]) for c in summary["categories"]] == [
        ("mine.qa", "qa"), ("mine.qa.t2", "qa.t2"), ("mine.rag", "rag"), ("mine.rag.t2", "rag.t2")]
    text = "\n".join(categories_report.section(summary))
    assert "| mine/qa.t2 " in text and "`<category>.t<k>`: turn k of the category's questions" in text

    # a resume reads the answers back and makes none again
    again = fake_engine.fake()
    fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, resume="turns",
                           progress=False, log=[].append, engines=[again], runs=4)
    assert not _answering(again) and rd.read_meta().answers == meta.answers
    assert (rd.path / answers.ANSWERS_FILE).read_bytes() == data

    # answers changed after the run made them are refused in one line, never sent nor reported
    (rd.path / answers.ANSWERS_FILE).write_bytes(data.replace(b'"text": "', b'"text": "edited ', 1))
    with pytest.raises(KitError, match=r"answers\.json: sha256 .* run\.json recorded"):
        summarize(rd)
    with pytest.raises(KitError) as e:
        fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, resume="turns",
                               progress=False, log=[].append, engines=[fake_engine.fake()], runs=5)
    assert "\n" not in str(e.value) and "answers.json: sha256" in str(e.value) and "run.json recorded" in str(e.value)


def _obj(**changes) -> dict:
    a = {"task": "mine.qa", "prompt": "q1", "turn": 1, "asked_sha256": "a" * 64, "text": "fine"}
    obj = {"format_version": 1, "run_id": "r", "strategy": "baseline", "model": "target", "temperature": 0.0,
           "seed": 42, "n_predict": 16, "generated_at": "2026-01-01T00:00:00Z", "answers": [a]}
    for k, v in changes.items():
        (a if k in a else obj)[k] = v
    return obj


@pytest.mark.parametrize(("changes", "expected"), [
    ({"text": "x" * (answers.MAX_ANSWER_CHARS + 1)}, "answers[0].text: longer than 1048576 characters"),
    ({"prompt": "../../etc"}, "answers[0].prompt: '../../etc' does not match"),
    ({"temperature": 0.7}, "temperature: expected 0.0"),
    ({"turn": 0}, "answers[0].turn: expected at least 1"),
])
def test_a_bad_answers_file_is_one_line(tmp_path, changes, expected):
    data = (json.dumps(_obj(**changes)) + "\n").encode()
    (tmp_path / answers.ANSWERS_FILE).write_bytes(data)
    meta = {"file": "answers.json", "sha256": answers.sha256_bytes(data), "bytes": len(data), "answers": 1}
    with pytest.raises(KitError) as e:
        answers.read(tmp_path, meta)
    assert "\n" not in str(e.value) and expected in str(e.value)


def test_an_answers_file_is_bounded_missing_or_named_otherwise_in_one_line(tmp_path, monkeypatch):
    data = (json.dumps(_obj()) + "\n").encode()
    meta = {"file": "answers.json", "sha256": answers.sha256_bytes(data), "bytes": len(data), "answers": 1}
    with pytest.raises(KitError, match="answers.json: missing"):
        answers.read(tmp_path, meta)
    (tmp_path / answers.ANSWERS_FILE).write_bytes(data)
    assert answers.read(tmp_path, meta)["answers"][0]["text"] == "fine"
    with pytest.raises(KitError, match="answers.file is '../x'"):
        answers.read(tmp_path, {**meta, "file": "../x"})
    monkeypatch.setattr(answers, "MAX_BYTES", 100)
    with pytest.raises(KitError, match="more than 100 bytes"):
        answers.read(tmp_path, meta)


def test_the_sampling_study_of_a_later_turn_sends_its_conversation(tmp_path, models_dir, world):
    from tests import fake_engine

    m = chat_suite(tmp_path)
    m.write_text(m.read_text() + "distribution:\n  sampling: {temperature: 0.8}\n  samples: 4\n  tokens: 8\n"
                 "  batch: 4\n  tasks: [mine.qa.t2]\n  control: {top_k: 1}\n")
    engine = fake_engine.fake()
    served: dict = {}
    serve = engine._serve
    engine._serve = lambda rec, labels, ctr: served.setdefault(ctr.id, serve(rec, labels, ctr))
    fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="study",
                           progress=False, log=[].append, engines=[engine], distribution=4, seed=1)
    meta = RunDir.open(world / "r" / "study").read_meta()
    assert meta.answers is not None and meta.answers["answers"] == 2  # q1 and q2 of mine.qa, turn 1
    templates = [b["messages"] for c in engine.started[1:] for p, b in served[c.id].requests if p == "/apply-template"]
    assert templates and all([x["role"] for x in t] == ["user", "assistant", "user"] for t in templates)


def test_answers_that_cannot_be_made_stop_the_run_before_any_measurement_in_one_line(tmp_path, models_dir, world):
    from tests import fake_engine

    m = chat_suite(tmp_path)
    broken = fake_engine.fake(request_fails=lambda labels, attempt: not any(k.endswith(".task") for k in labels))
    with pytest.raises(KitError) as e:
        fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, run_id="broken",
                               progress=False, log=[].append, engines=[broken], strategies=["baseline", "ngram-mod"],
                               runs=1, seed=1)
    msg = str(e.value)
    assert "\n" not in msg and "the answers to the earlier turns could not be made" in msg and "--resume broken" in msg
    rd = RunDir.open(world / "r" / "broken")
    assert rd.read_meta().answers is None and not list(rd.measurements())
    assert not (rd.path / answers.ANSWERS_FILE).exists()
    assert all(c.status == "removed" for c in broken.started)
    said = fake_engine.runner.run(trusted(m), results_dir=world / "r", models_dir=models_dir, resume="broken",
                                  progress=False, log=[].append, engines=[fake_engine.fake()])
    assert "12 ok, 0 failed" in said and rd.read_meta().answers["answers"] == 3


def test_a_conversation_with_a_depth_reads_the_filler_first_and_keeps_its_turns():
    import dataclasses

    from harness.run import client, filler
    from harness.run.server import Endpoint
    from tests.conftest import DEMO
    from tests.fakeserver import FakeLlamaServer

    chat = dataclasses.replace(mf.load(DEMO), endpoint="chat")
    task = dataclasses.replace(chat.tasks[0], depth=40)
    said = [{"role": "user", "content": "first?"}, {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "and then?"}]
    with FakeLlamaServer() as srv:
        out = client.run_request(chat, task, Endpoint(srv.port), said, with_probs=False)
        sent = next(b for p, b in srv.requests if p == "/apply-template")["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"] and sent[1:] == said[1:]
    text, first = sent[0]["content"].rsplit("\n\n", 1)
    assert first == "first?" and len(text.split()) == 40 and out["context"]["filler_sha256"] == filler.sha256(text)
