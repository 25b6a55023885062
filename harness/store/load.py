"""The load study's file: load.jsonl in a run folder, one line per (strategy, slots, level, round), each with its
requests as the open-loop sender saw them (harness/run/load.py) and the server's speculative counters before and
after the level. A run folder is untrusted: a line is read back only when every field the analysis uses has the
type and bounds written here; a wrong one is one line naming the file, the line and the field."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, TypedDict

from harness import KitError
from harness import formatter as fm

LOAD_FILE = "load.jsonl"
FORMAT_VERSION = 1
MAX_LOAD_FILE_BYTES = 256 << 20
MAX_LINES = 20_000
MAX_REQUESTS = 10_000
MAX_ITL = 100_000  # inter-token gaps of one request
MAX_SECONDS = 86_400.0
MODES = ("rate", "synchronous", "throughput")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms")


class _RequestRequired(TypedDict):
    prompt: str  # task/prompt
    scheduled_s: float  # when the schedule said to send it, from the level's start
    sent_s: float | None  # when it was sent (None: never, the level was stopped)
    ttft_s: float | None
    e2el_s: float | None
    output_tokens: int
    error: str | None


class Request(_RequestRequired, total=False):
    """One timed request of a level (warm-up requests are not recorded)."""

    itl_s: list[float]  # every gap between tokens after the first, as they arrived (a chunk of k: its gap, k-1 zeros)


class _LevelRequired(TypedDict):
    format_version: int
    run_id: str
    strategy: str  # the arm: `<id>@<slots>` where the study has several slot counts
    entry: str  # the manifest's strategy
    speculative: bool
    slots: int
    level: str
    mode: str  # rate | synchronous | throughput
    offered_rate: float | None  # req/s; None for synchronous and throughput
    round: int
    arrivals: str
    burstiness: float
    schedule_seed: str
    warmup: int  # requests sent before the level and not counted
    status: str  # ok | failed
    baseline: str  # the study's baseline entry: what every other strategy is judged against
    slo: dict[str, float]  # the SLOs given (ttft_ms, tpot_ms, e2el_ms), milliseconds
    requests: list[Request]
    wall_s: float


class Level(_LevelRequired, total=False):
    """One line of load.jsonl."""

    failure: str
    started_at: str
    server_command: list[str]
    container_id: str
    max_concurrency: int | None
    #: The server's `llamacpp:spec_decode_*` counters (GET /metrics) after the warm-up and after the level.
    metrics_before: dict[str, float]
    metrics_after: dict[str, float]


def path_of(run_dir: Path) -> Path:
    return Path(run_dir) / LOAD_FILE


def append(run_dir: Path, rec: Level) -> None:
    """One level's line, flushed and synced: a crash loses at most the level being measured."""
    with open(path_of(run_dir), "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, ensure_ascii=False, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _number(x: Any, high: float = MAX_SECONDS, *, none: bool = False) -> bool:
    if x is None:
        return none
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and 0 <= x <= high


def _request_problem(r: Any) -> str | None:
    if not isinstance(r, dict):
        return "expected a mapping"
    if not isinstance(r.get("prompt"), str) or len(r["prompt"]) > 300:
        return "prompt: expected a task/prompt name"
    for k in ("scheduled_s",):
        if not _number(r.get(k)):
            return f"{k}: expected seconds from 0 to {fm.plain(MAX_SECONDS)}"
    for k in ("sent_s", "ttft_s", "e2el_s"):
        if not _number(r.get(k), none=True):
            return f"{k}: expected seconds from 0 to {fm.plain(MAX_SECONDS)} or null"
    n = r.get("output_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 10_000_000:
        return "output_tokens: expected a whole number of tokens"
    if r.get("error") is not None and not isinstance(r["error"], str):
        return "error: expected a string or null"
    itl = r.get("itl_s", [])
    if not isinstance(itl, list) or len(itl) > MAX_ITL or not all(_number(x) for x in itl):
        return f"itl_s: expected at most {fm.count(MAX_ITL)} gaps in seconds"
    return None


def problem(obj: Any) -> str | None:
    """Why a line is not a load level the analysis can read (the field and what was expected), else None."""
    if not isinstance(obj, dict):
        return "expected a mapping"
    if obj.get("format_version") != FORMAT_VERSION:
        return f"format_version: expected {FORMAT_VERSION}"
    for k in ("run_id", "strategy", "entry", "level", "arrivals", "schedule_seed", "baseline"):
        if not isinstance(obj.get(k), str) or not obj[k] or len(obj[k]) > 300:
            return f"{k}: expected a name"
    if obj.get("mode") not in MODES:
        return f"mode: expected one of {list(MODES)}"
    if obj.get("status") not in ("ok", "failed"):
        return "status: expected ok or failed"
    if not isinstance(obj.get("speculative"), bool):
        return "speculative: expected true or false"
    for k, high in (("slots", 64), ("round", 1000), ("warmup", 1000)):
        v = obj.get(k)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= high:
            return f"{k}: expected a whole number from 0 to {high}"
    if not _number(obj.get("offered_rate"), 1e6, none=True) or not _number(obj.get("burstiness"), 1e3) \
            or not _number(obj.get("wall_s"), 10 * MAX_SECONDS):
        return "offered_rate, burstiness, wall_s: expected bounded numbers"
    slo = obj.get("slo")
    if not isinstance(slo, dict) or any(k not in SLO_KEYS or not _number(v, 3.6e6) for k, v in slo.items()):
        return f"slo: expected milliseconds for some of {list(SLO_KEYS)}"
    reqs = obj.get("requests")
    if not isinstance(reqs, list) or len(reqs) > MAX_REQUESTS:
        return f"requests: expected a list of at most {fm.count(MAX_REQUESTS)}"
    for i, r in enumerate(reqs):
        if (why := _request_problem(r)) is not None:
            return f"requests[{i}].{why}" if not why.startswith("expected") else f"requests[{i}]: {why}"
    for k in ("metrics_before", "metrics_after"):
        m = obj.get(k, {})
        if not isinstance(m, dict) or len(m) > 200 or not all(
                isinstance(a, str) and len(a) <= 200 and _number(b, 1e15) for a, b in m.items()):
            return f"{k}: expected at most 200 counters"
    return None


def read(run_dir: Path) -> list[Level]:
    """Every level of a run folder's load.jsonl ([] without one); a line that is not one is one line of error. A
    last line cut short (a crash mid-write) is left out: that level is lost."""
    p = path_of(run_dir)
    if not p.is_file():
        return []
    if p.stat().st_size > MAX_LOAD_FILE_BYTES:
        raise KitError(f"{p}: larger than {MAX_LOAD_FILE_BYTES >> 20} MB; not a load study")
    lines = p.read_text(encoding="utf-8", errors="replace").split("\n")
    out: list[Level] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if i > MAX_LINES:
            raise KitError(f"{p}: more than {fm.count(MAX_LINES)} levels")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                continue  # the last line cut short: no newline after it
            raise KitError(f"{p}:{i}: not JSON") from None
        if (why := problem(obj)) is not None:
            raise KitError(f"{p}:{i}: {fm.visible(why, 300)}")
        out.append(obj)
    return out
