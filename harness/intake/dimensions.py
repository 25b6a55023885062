"""Output length and context depth as dimensions of a task: a task entry with `n_predict: [128, 512, 2048]` and/or
`depth: [0, 4096, 16384]` becomes one task per combination, each measured like any other task (fresh container,
rounds, every strategy paired with its baseline on the same task in the same round), so the speedup can be read
against the length and the depth.

A combination is named by the dimensions given as lists: `code-gen[n_predict=512]`, `code-gen[depth=4096]`,
`code-gen[n_predict=512,depth=4096]` (lengths outermost). A scalar (or a list of one value) keeps the plain name,
so an entry without lists is the task it always was. `depth` is a filler prefix of that many tokens before the
prompt (harness/run/filler.py says what the filler is). Prompt suites call `points` for each task they make."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from harness.intake import flags
from harness.intake.bounded_yaml import ManifestError

#: Combinations of one task entry (lengths times depths).
MAX_POINTS = 16
#: Tasks of a whole manifest once dimensions are expanded.
MAX_TASKS = 256
#: The deepest filler prefix, in tokens.
MAX_DEPTH = 131072
#: The longest output a task may ask for (the schema's bound on a scalar n_predict).
MAX_N_PREDICT = 65536
#: The dimensions, in the order they appear in a combination's name.
NAMES = ("n_predict", "depth")


@dataclass(frozen=True)
class Point:
    """One task of an expanded entry: its id, output length, context depth, and the listed dimensions' values."""

    id: str
    n_predict: int
    depth: int
    dims: tuple[tuple[str, int], ...] = ()


class DimensionError(ValueError):
    """A dimension that cannot be expanded; `field` is the field path below the task entry."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def values(name: str, raw: Any, default: int | None) -> list[int]:
    """A dimension's values: a scalar or a list of whole numbers within bounds, strictly increasing (a curve is
    read from left to right); DimensionError otherwise."""
    if raw is None:
        if default is None:
            raise DimensionError(name, "required")
        return [default]
    items = raw if isinstance(raw, list) else [raw]
    low, high = (1, MAX_N_PREDICT) if name == "n_predict" else (0, MAX_DEPTH)
    if not items:
        raise DimensionError(name, "expected at least one value")
    for i, v in enumerate(items):
        at = f"{name}[{i}]" if isinstance(raw, list) else name
        if isinstance(v, bool) or not isinstance(v, int):
            raise DimensionError(at, f"{v!r}: expected a whole number of tokens")
        if not low <= v <= high:
            raise DimensionError(at, f"{v}: expected {low} to {high} tokens")
    for i in range(1, len(items)):
        if items[i] <= items[i - 1]:
            raise DimensionError(f"{name}[{i}]", f"{items[i]} after {items[i - 1]}: expected increasing values")
    return list(items)


def points(tid: str, n_predict: Any, depth: Any = None) -> list[Point]:
    """The tasks one entry stands for (lengths outermost); DimensionError on the first problem. Without lists it is
    the entry itself."""
    given = {"n_predict": values("n_predict", n_predict, None), "depth": values("depth", depth, 0)}
    listed = [n for n in NAMES if len(given[n]) > 1]
    combos = len(given["n_predict"]) * len(given["depth"])
    if combos > MAX_POINTS:
        raise DimensionError(listed[0], f"{len(given['n_predict'])} lengths x {len(given['depth'])} depths = "
                             f"{combos} tasks; at most {MAX_POINTS} per entry")
    out = []
    for n, d in itertools.product(given["n_predict"], given["depth"]):
        dims = tuple((k, v) for k, v in (("n_predict", n), ("depth", d)) if k in listed)
        pid = f"{tid}[{','.join(f'{k}={v}' for k, v in dims)}]" if dims else tid
        out.append(Point(pid, n, d, dims))
    return out


def entry(raw: dict[str, Any], where: str, before: int) -> list[Point]:
    """One schema-checked task entry as the tasks it stands for (`before` tasks expanded ahead of it); ManifestError
    naming `where` and the field below the entry on the first problem."""
    try:
        out = points(raw["id"], raw.get("n_predict"), raw.get("depth"))
        if before + len(out) > MAX_TASKS:
            raise DimensionError("id", f"{before + len(out)} tasks once lengths and depths are expanded; at most "
                                 f"{MAX_TASKS}")
    except DimensionError as e:
        raise ManifestError(f"{where}.{e.field}: {e.message}") from None
    return out


def family(task_id: str, dims: tuple[tuple[str, int], ...]) -> str:
    """The entry id of an expanded task (its id without the dimensions' part)."""
    return task_id.rsplit("[", 1)[0] if dims else task_id


def context_size(args: tuple[str, ...] | list[str]) -> int | None:
    """The context size these llama-server arguments give (-c / --ctx-size, the last one, as llama-server reads
    them), or None."""
    canon = flags.canonical(args)
    at = [i + 1 for i in range(len(canon) - 1) if flags.option(canon[i]) == "--ctx-size"]
    value = canon[at[-1]] if at else ""
    return int(value) if value.isascii() and value.isdigit() else None


def check_context(depth: int, n_predict: int, ctx: int | None, slots: int) -> str | None:
    """Why a depth does not fit the server's context (None when it does): the filler and the output must fit one
    slot's share of -c (the prompt itself takes a little more: its real count is recorded)."""
    if depth == 0:
        return None
    if ctx is None or ctx == 0:
        return "a depth needs a known context: give -c (--ctx-size) in server_args or the strategy's args"
    per_slot = ctx // max(1, slots)
    if depth + n_predict >= per_slot:
        where = f"-c {ctx}" + (f" over {slots} slots" if slots > 1 else "")
        return f"depth {depth} + n_predict {n_predict} does not fit a slot's context ({per_slot} tokens of {where})"
    return None
