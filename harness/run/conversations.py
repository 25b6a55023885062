"""A prompt suite's later turns (`turns: all`), as MT-Bench defines them: turn k is sent after the question's turns
1..k-1 and the target's own answers to them.

The answers are generated once per run, before the timed rounds, in one fresh container of the baseline (the target
without speculation) at temperature 0 with the manifest's seed and the suite's n_predict, one question after
another; they are written to the run folder's answers.json (harness/store/answers.py) and run.json records its
sha256. Every strategy is then sent the same conversation for a later turn (the pairing stays fair), and a resumed
run reads the answers back (checked against that sha256) instead of making them again: it never sends different
text. The conversation of a later turn is what its measurement's request renders with the model's chat template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness import KitError
from harness import formatter as fm
from harness.files import display_path, now_iso
from harness.hosts.engine import Engine
from harness.intake import suites
from harness.run.client import MeasurementFailed, post_json, render_prompt, request_body
from harness.run.plan import Plan
from harness.run.protocol import Context
from harness.run.server import Server, labels_for
from harness.store import answers
from harness.store.rundir import RunDir

Conversations = dict[tuple[str, str], list[dict[str, str]]]


def later_turns(ctx: Context, plan: Plan) -> dict[tuple[str, str], tuple[int, suites.Question]]:
    """Each planned later-turn measurement's (task, prompt) -> its turn and question."""
    questions = {c.task_id: {q.prompt_id: q for q in c.questions}
                 for d in ctx.manifest.suites if d.suite.turns == "all" for c in d.categories}
    out = {}
    for t in plan.tasks:
        turn = suites.task_turn(t.id)
        base = suites.TURN_TASK.fullmatch(t.id)
        if turn < 2 or base is None or base["base"] not in questions:
            continue
        for p in t.prompts:
            q = questions[base["base"]].get(p.id)
            if q is not None and len(q.turns) >= turn:
                out[(t.id, p.id)] = (turn, q)
    return out


def conversation(q: suites.Question, turn: int, said: dict[int, str]) -> list[dict[str, str]]:
    """The messages of turn `turn` of a question: each earlier user turn and the answer to it, then the turn."""
    out: list[dict[str, str]] = []
    for k in range(1, turn):
        out += [{"role": "user", "content": q.turns[k - 1]}, {"role": "assistant", "content": said[k]}]
    return out + [{"role": "user", "content": q.turns[turn - 1]}]


def baseline_of(ctx: Context, plan: Plan):  # -> harness.intake.manifest.Strategy
    """The strategy whose container answers: the plan's first single-slot strategy without speculation on the
    target, else the manifest's."""
    for pool in (plan.strategies, ctx.manifest.strategies):
        for s in pool:
            if not s.speculative and s.parallel == 1 and s.model == "target" and not s.args:
                return s
    for pool in (plan.strategies, ctx.manifest.strategies):
        for s in pool:
            if not s.speculative and s.parallel == 1 and s.model == "target":
                return s
    raise KitError(f"{display_path(ctx.manifest.path)}: turns: all needs a strategy without speculation on the "
                   "target (spec_type none) to answer the earlier turns")


def prepare(ctx: Context, engine: Engine, plan: Plan, rd: RunDir, log: Callable[[str], None]) -> Conversations:
    """The conversation of every planned later turn: from the run's answers.json where run.json records one (checked
    against its sha256), else from answers generated now on `engine` and recorded; {} without later turns."""
    wanted = later_turns(ctx, plan)
    if not wanted:
        return {}
    meta = rd.read_meta()
    if meta.answers is not None:
        said = _indexed(answers.read(rd.path, meta.answers), rd)
        log(f"run {rd.run_id}: the later turns follow the {len(said)} answers made before ({answers.ANSWERS_FILE}, "
            f"sha256 {meta.answers['sha256'][:12]})")
    else:
        said = generate(ctx, engine, plan, wanted, rd, log)
    out: Conversations = {}
    for key, (turn, q) in wanted.items():
        base = suites.TURN_TASK.fullmatch(key[0])["base"]  # type: ignore[index]
        got = {}
        for k in range(1, turn):
            a = said.get((base, key[1], k))
            messages_k = conversation(q, k, got)
            if a is None or a["asked_sha256"] != answers.conversation_sha256(messages_k):
                raise KitError(f"{display_path(rd.path / answers.ANSWERS_FILE)}: no answer to turn {k} of {key[0]} "
                               f"{key[1]} as the manifest asks it; the later turns cannot be sent as they were")
            got[k] = a["text"]
        out[key] = conversation(q, turn, got)
    return out


def _indexed(obj: answers.AnswersJson, rd: RunDir) -> dict[tuple[str, str, int], answers.Answer]:
    out = {}
    for i, a in enumerate(obj["answers"]):
        key = (a["task"], a["prompt"], a["turn"])
        if key in out:
            raise KitError(f"{display_path(rd.path / answers.ANSWERS_FILE)}: answers[{i}]: a second answer to turn "
                           f"{a['turn']} of {fm.console(a['task'], 80)} {fm.console(a['prompt'], 70)}")
        out[key] = a
    return out


def generate(ctx: Context, engine: Engine, plan: Plan, wanted: dict[tuple[str, str], tuple[int, suites.Question]],
             rd: RunDir, log: Callable[[str], None]) -> dict[tuple[str, str, int], answers.Answer]:
    """The answers the later turns need, made in one fresh baseline container, written and recorded in run.json."""
    m = ctx.manifest
    s = baseline_of(ctx, plan)
    need: dict[tuple[str, str], tuple[int, suites.Question]] = {}
    for (task_id, prompt_id), (turn, q) in wanted.items():  # each question up to its latest planned turn
        base = suites.TURN_TASK.fullmatch(task_id)["base"]  # type: ignore[index]
        if need.get((base, prompt_id), (0, q))[0] < turn:
            need[(base, prompt_id)] = (turn, q)
    count = sum(turn - 1 for turn, _ in need.values())
    n_predict = {c.task_id: d.suite.n_predict for d in m.suites for c in d.categories}
    log(f"run {rd.run_id}: {count} answers to the earlier turns, made by {s.id} at temperature 0 in one container "
        "(untimed), before the timed rounds")
    server = Server(engine, m, s, ctx.paths_by_host[engine.name], ctx.image_for(s), ctx.access_on(engine),
                    labels_for(ctx.run_id, s, None, None))
    made: list[answers.Answer] = []
    try:
        with server:
            for (base, prompt_id), (turn, q) in need.items():
                task = dataclasses.replace(plan.tasks[0], n_predict=n_predict[base])  # the body reads n_predict
                got: dict[int, str] = {}
                for k in range(1, turn):
                    messages = conversation(q, k, got)
                    body = request_body(m, task, render_prompt(server.endpoint, m, messages), stream=False)
                    body["temperature"] = 0.0
                    body.pop("top_k", None)
                    text = post_json(server.endpoint, "/completion", body, m.request_timeout_s, "answer").get("content")
                    if not isinstance(text, str) or len(text) > answers.MAX_ANSWER_CHARS:
                        raise MeasurementFailed(f"/completion answered turn {k} of {base} {prompt_id} without a "
                                                f"text of at most {fm.count(answers.MAX_ANSWER_CHARS)} characters",
                                                phase="answer")
                    got[k] = text
                    made.append({"task": base, "prompt": prompt_id, "turn": k,
                                 "asked_sha256": answers.conversation_sha256(messages), "text": text})
    except MeasurementFailed as e:
        if server.container is not None:
            engine.remove(server.container)
        raise KitError(f"run {rd.run_id}: the answers to the earlier turns could not be made on {engine.name} "
                       f"({e.reason}); nothing was measured: run again, or resume with `invoke run --resume "
                       f"{rd.run_id}`") from None
    obj: answers.AnswersJson = {"format_version": 1, "run_id": rd.run_id, "strategy": s.id, "model": s.model,
                              "temperature": 0.0, "seed": m.sampling.seed,
                              "n_predict": max(n_predict.values(), default=1), "generated_at": now_iso(),
                              "answers": made}
    recorded = answers.write(rd.path, obj)
    rd.update_meta(answers=dict(recorded))
    return {(a["task"], a["prompt"], a["turn"]): a for a in made}
