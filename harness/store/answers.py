"""answers.json: the target's own answers to a prompt suite's earlier turns (`turns: all`), made once per run before
the timed rounds (harness/run/conversations.py) so that every strategy is sent the same conversation for a later
turn. Schema: schemas/answers.schema.json; run.json records the file's sha256 and size (`answers`).

A run folder handed over is untrusted: the file is read bounded in bytes, schema-checked (each answer bounded in
characters, the answers in number) and checked against the sha256 run.json recorded, before any of its text is used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from harness import KitError, schema
from harness import formatter as fm
from harness.files import atomic_write_bytes, display_path, sha256_bytes

ANSWERS_FILE = "answers.json"
MAX_BYTES = 64 << 20
#: One answer is at most this many characters (n_predict tokens of text; the schema says the same).
MAX_ANSWER_CHARS = 1 << 20


class Answer(TypedDict):
    task: str  # the category's task (turn 1's), `<suite>.<category>`
    prompt: str  # the question's prompt id, `q<question_id>`
    turn: int  # the turn it answers (1-based)
    asked_sha256: str  # sha256 of the conversation it answers (conversation_sha256)
    text: str


class AnswersJson(TypedDict):
    format_version: int
    run_id: str
    strategy: str
    model: str
    temperature: float
    seed: int
    n_predict: int
    generated_at: str
    answers: list[Answer]


class AnswersMeta(TypedDict):
    """What run.json says of the file (its `answers`)."""

    file: str
    sha256: str
    bytes: int
    answers: int


def conversation_sha256(messages: list[dict[str, str]]) -> str:
    """The sha256 of a conversation (its messages as compact JSON, keys sorted): what an answer answers."""
    return sha256_bytes(json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode())


def write(folder: Path, obj: AnswersJson) -> AnswersMeta:
    """The file, schema-checked, written atomically; what run.json records of it."""
    path = Path(folder) / ANSWERS_FILE
    schema.check("answers", obj, display_path(path))
    data = (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    if len(data) > MAX_BYTES:
        raise KitError(f"{display_path(path)}: {fm.count(len(data))} bytes of answers; at most "
                       f"{fm.count(MAX_BYTES)} (lower the suite's n_predict or per_category)")
    atomic_write_bytes(path, data)
    return {"file": ANSWERS_FILE, "sha256": sha256_bytes(data), "bytes": len(data), "answers": len(obj["answers"])}


def read(folder: Path, meta: AnswersMeta) -> AnswersJson:
    """The file run.json names, bounded, checked against its recorded sha256 and the schema; one line otherwise."""
    path = Path(folder) / ANSWERS_FILE
    shown = display_path(path)
    if meta.get("file") != ANSWERS_FILE:
        raise KitError(f"{shown}: run.json's answers.file is {fm.console(meta.get('file'), 80)!r}, expected "
                       f"{ANSWERS_FILE!r}")
    try:
        if path.is_symlink() or not path.is_file():
            raise KitError(f"{shown}: missing (run.json records answers with sha256 {meta['sha256'][:12]}...): the "
                           "later turns' conversations cannot be made again the same way")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise KitError(f"{shown}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise KitError(f"{shown}: more than {fm.count(MAX_BYTES)} bytes; an answers file is at most that")
    actual = sha256_bytes(data)
    if actual != meta["sha256"]:
        raise KitError(f"{shown}: sha256 {actual[:12]}... is not the {meta['sha256'][:12]}... run.json recorded "
                       "(the answers were changed after the run made them)")
    try:
        obj: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise KitError(f"{shown}: not a JSON object ({type(e).__name__})") from None
    return schema.read("answers", obj, shown)  # type: ignore[return-value]
