"""What llama-server's log says (as `container.logs()` returns it): why it stopped, and its own speculative
statistics.

`parse(log)` returns a `ServerLog`:

- `failure`: the line that explains an abort or a refused start, without its timestamp: a ggml assertion or
  abort (`ggml.c:3354: GGML_ASSERT(ggml_can_mul_mat(a, b)) failed`, `common.cpp:2225: get_sub_batch: failed
  to add embedding ...`), a loader error (`error loading model: done_getting_tensors: wrong number of tensors;
  expected 37, got 36`), an uncaught exception's `what()`, else the server's own last word (`failed to create
  MTP context`, `exiting due to model loading error`); None when the log shows none. Known harmless error
  lines (DFlash's "requires ctx_other" during memory fitting) are skipped.
- `failure_detail`: the warning next to an assertion (just before it or, logged late, just after), if any
  (`ggml_new_object: not enough space in the context's memory pool (needed 418624, available 418256)`).
- `draft_acceptance`: {rate, accepted, generated, mean_len} from `draft acceptance = ... mean len = ...`.
- `acc_per_pos`: the per-position acceptance rates (`acc per pos = (...)`, trace level, `-lv 4`).
- `statistics`: per implementation, the counters of `statistics <type>: #calls(b,g,a) = ..., #gen tokens = ...,
  #acc tokens = ...` (trace level): calls_begin/draft/accept, gen_drafts, acc_drafts, gen_tokens, acc_tokens,
  mean_acc_len, acc_rate_per_pos, dur_ms {begin, draft, accept}.
- `implementations` and `params`: what `adding speculative implementation '<type>'` and its `- key=value`
  lines said (n_max, n_min, p_min, block_size, mask_token_id, n_extract, sample_from_anchor, ...).
- `timings`: prompt_ms, prompt_tokens, eval_ms, eval_tokens (the slot's print_timing).
- `requests`: how many requests printed timings. With several, the other fields are the last request's.
- `calls`: per task id, each draft call's (accepted, drafted) in order, from the lines `accepted  2/ 8 draft
  tokens` the server prints at info level when its environment sets LLAMA_TRACE (harness/run/server.py sets it
  for speculative strategies). A call whose partial acceptance restored a context checkpoint (`... (restore
  checkpoint)`, recurrent and hybrid targets) is that line; the replay the server verifies after it is no new
  call and is skipped, as the server's own counters skip it. `task_accepted`: per task id, the accepted count of
  its `draft acceptance` line, against which `draft_calls` checks that no call line is missing.

`devices(log)` reads the load lines instead (they come first: read the whole log), the same for every backend:
which device each model was put on (`using device Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits)) (unknown id) - 2048
MiB free`), how many layers went there (`offloaded 5/5 layers to GPU`), and the buffers the server allocated on
each device (model, KV cache, recurrent state, compute), in load order: the target first, then its drafter.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from harness.store import result

_PREFIX = re.compile(r"^\d+\.\d+\.\d+\.\d+ ([DIWEO]) ")
_ASSERT = re.compile(r"^(?:\S*/)?([\w.-]+\.(?:c|cc|cpp|cu|h|hpp)):(\d+): (.+)$")
_LOAD_ERROR = re.compile(r"error loading model: (.+)$")
_WHAT = re.compile(r"^\s*what\(\):\s*(.+)$")
_GENERIC = re.compile(r"(failed to create MTP context|failed to load (?:draft )?model.*|exiting due to .+|"
                      r"failed to initialize the context: .+|context type MTP requested but .+)$")
_HARMLESS = ("requires ctx_other to be set", "failed to measure the memory of the extra model")
_ACCEPTANCE = re.compile(r"draft acceptance = ([\d.]+) \(\s*(\d+) accepted /\s*(\d+) generated\), "
                         r"mean len =\s*([\d.]+)")
_PER_POS = re.compile(r"acc per pos = \(([^)]*)\)")
_STATS = re.compile(
    r"statistics\s+(\S+): #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+), #gen drafts =\s*(\d+), "
    r"#acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+)"
    r"(?:, #mean acc len =\s*([\d.]+), #acc rate/pos = \(([^)]*)\))?"
    r"(?:, dur\(b,g,a\) =\s*([\d.]+),\s*([\d.]+),\s*([\d.]+) ms)?")
_CALL = re.compile(r"\| task (-?\d+) \| accepted\s+(\d+)/\s*(\d+) draft tokens( \(restore checkpoint\))?")
_TASK = re.compile(r"\| task (-?\d+) \|")
#: A drafted length above this is not a draft call the kit can tabulate (the pinned build drafts at most 64-ish).
MAX_DRAFT = 4096
_IMPL = re.compile(r"adding speculative implementation '([\w-]+)'")
_PARAM = re.compile(r"(\w+)=([^\s,]+)")
_PROMPT = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_EVAL = re.compile(r"\|\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_USING = re.compile(r"using device (\S+) \((.*)\) \((.*)\) - (\d+) MiB free")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_BUFFER = re.compile(r"^\s*\w+:\s+(\S+) (model|KV|RS|compute) buffer size =\s*([\d.]+) MiB")
#: Buffer names that are host memory, whatever the backend (CPU, CPU_Mapped, CPU_REPACK, CUDA_Host, Vulkan_Host).
_HOST_BUFFER = re.compile(r"^CPU|_Host$")


#: What a record keeps of the implementations the log names and their parameters (schemas/result.schema.json).
MAX_NAMES, MAX_PARAMS, MAX_NAME, MAX_VALUE = 64, 256, 64, 256


def _number(s: str) -> int | float | str:
    if len(s) > MAX_VALUE:
        raise ValueError(f"a parameter value of {len(s)} characters")
    for cast in (int, float):
        try:
            x = cast(s)
            return x if math.isfinite(x) else s
        except ValueError:
            pass
    return s


def _float(s: str) -> float:
    """A non-negative, finite number of the log; ValueError otherwise."""
    x = float(s)
    if not 0 <= x < math.inf:
        raise ValueError(f"{s!r} is not a non-negative finite number")
    return x


def _share(s: str) -> float:
    """A share of the log (an acceptance rate): within [0, 1]; ValueError otherwise."""
    x = float(s)
    if not 0 <= x <= 1:
        raise ValueError(f"{s!r} is not within [0, 1]")
    return x


def _floats(s: str) -> list[float]:
    """A list of shares (acceptance by position), at most MAX_DRAFT; ValueError otherwise."""
    parts = [x for x in s.split(",") if x.strip()]
    if len(parts) > MAX_DRAFT:
        raise ValueError(f"{len(parts)} positions, more than {MAX_DRAFT}")
    return [_share(x) for x in parts]


def failure(lines: list[str]) -> tuple[str | None, str | None]:
    """The line that explains why the server stopped (and the warning before an assertion), or (None, None)."""
    generic: str | None = None
    for i, raw in enumerate(lines):
        line = _PREFIX.sub("", raw).strip()
        if not line or any(h in line for h in _HARMLESS):
            continue
        m = _ASSERT.match(line)
        if m:
            # the logger thread may print the warning after the assertion's direct write: look both ways
            detail = None
            for j in sorted(range(max(0, i - 3), min(len(lines), i + 4)), key=lambda j: abs(j - i)):
                level = _PREFIX.match(lines[j])
                if j != i and level and level.group(1) in "WE" and not any(h in lines[j] for h in _HARMLESS):
                    detail = _PREFIX.sub("", lines[j]).strip()
                    break
            return f"{m.group(1)}:{m.group(2)}: {m.group(3)}", detail
        m = _LOAD_ERROR.search(line) or _WHAT.match(line)
        if m:
            return m.group(0).strip() if _LOAD_ERROR.search(line) else m.group(1).strip(), None
        m = _GENERIC.search(line)
        if m and generic is None:
            generic = m.group(1).strip()
    return generic, None


def devices(log: str | bytes, malformed: list[str] | None = None) -> result.DeviceLoad | None:
    """What the server's load lines say about devices (see the module docstring), or None when they name no device
    (a CPU build, or a log that lost its first lines).

    Returns {"models": [{"device", "description", "free_mib", "layers_offloaded", "layers", "buffers_mib"}...] in
    load order, "device_buffers_mib": {device: {kind: MiB}}, "device_mib": total MiB on devices}."""
    text = log.decode("utf-8", errors="replace") if isinstance(log, bytes) else log
    models: list[result.LoadedModel] = []
    on_device: dict[str, dict[str, float]] = {}
    for raw in text.splitlines():
        try:
            _device_line(_PREFIX.sub("", raw), models, on_device)
        except (ValueError, OverflowError) as e:
            if malformed is not None and not malformed:
                malformed.append(f"{raw.strip()[:300]} ({e})"[:400])
    if not models:
        return None
    total = round(sum(v for b in on_device.values() for v in b.values()), 2)
    return {"models": models, "device_buffers_mib": on_device, "device_mib": total}


def _device_line(line: str, models: list[result.LoadedModel], on_device: dict[str, dict[str, float]]) -> None:
    """One load line into `models` and `on_device`; ValueError when its numbers cannot be read."""
    m = _USING.search(line)
    if m:
        models.append({"device": m.group(1), "description": m.group(2), "free_mib": int(m.group(4)),
                       "layers_offloaded": None, "layers": None, "buffers_mib": {}})
        return
    m = _OFFLOADED.search(line)
    if m and models:
        models[-1]["layers_offloaded"], models[-1]["layers"] = int(m.group(1)), int(m.group(2))
        return
    m = _BUFFER.match(line)
    if m and not _HOST_BUFFER.search(m.group(1)):
        name, kind, mib = m.group(1), m.group(2).lower(), _float(m.group(3))
        bucket = on_device.setdefault(name, {})
        bucket[kind] = round(bucket.get(kind, 0.0) + mib, 2)
        if models and kind == "model":
            models[-1]["buffers_mib"][name] = round(models[-1]["buffers_mib"].get(name, 0.0) + mib, 2)


@dataclass
class ServerLog:
    """What one llama-server log says (see the module docstring for each field)."""

    failure: str | None = None
    failure_detail: str | None = None
    draft_acceptance: result.DraftAcceptance | None = None
    acc_per_pos: list[float] | None = None
    statistics: dict[str, result.Counters] = field(default_factory=dict)  # per implementation
    implementations: list[str] = field(default_factory=list)
    params: dict[str, float | int | str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    calls: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    task_accepted: dict[int, int] = field(default_factory=dict)
    #: the first line whose numbers could not be read or lie outside their range (the figures are then not trusted)
    malformed: str | None = None

    def speculation(self) -> result.ServerLogFacts:
        """The fields a measurement record keeps under `server_log` (schemas/result.schema.json)."""
        return {"draft_acceptance": self.draft_acceptance, "acc_per_pos": self.acc_per_pos,
                "statistics": self.statistics, "implementations": self.implementations, "params": self.params}


def parse(log: str | bytes) -> ServerLog:
    """Everything `parse` knows about one llama-server log (see the module docstring)."""
    text = log.decode("utf-8", errors="replace") if isinstance(log, bytes) else log
    lines = text.splitlines()
    out = ServerLog()
    replay: set[int] = set()  # tasks whose next call line is the replay after a restored checkpoint
    out.failure, out.failure_detail = failure(lines)
    state = {"in_impl": False, "replay": replay}
    for raw in lines:
        try:
            _line(out, state, _PREFIX.sub("", raw))
        except (ValueError, IndexError, OverflowError) as e:
            if out.malformed is None:
                out.malformed = f"{raw.strip()[:300]} ({e})"[:400]
    return out


def _line(out: ServerLog, state: dict[str, Any], line: str) -> None:
    """One line of the log into `out`; ValueError when its numbers cannot be read or lie outside their range."""
    m = _IMPL.search(line)
    if m:
        if len(m.group(1)) > MAX_NAME or len(out.implementations) >= MAX_NAMES:
            raise ValueError("more or longer speculative implementations than a server adds")
        out.implementations.append(m.group(1))
        state["in_impl"] = True
        return
    if state["in_impl"] and re.search(r":\s+- \w+=", line):
        for k, v in _PARAM.findall(line.partition(": -")[2]):
            if len(k) > MAX_NAME or (k not in out.params and len(out.params) >= MAX_PARAMS):
                raise ValueError("more or longer parameters than a server prints")
            out.params[k] = _number(v)
        return
    state["in_impl"] = False
    m = _CALL.search(line)
    if m:
        _call(out.calls, state["replay"], int(m.group(1)), int(m.group(2)), int(m.group(3)), bool(m.group(4)))
        return
    m = _ACCEPTANCE.search(line)
    if m:
        out.draft_acceptance = {"rate": _share(m.group(1)), "accepted": int(m.group(2)),
                                "generated": int(m.group(3)), "mean_len": _float(m.group(4))}
        task = _TASK.search(line)
        if task:
            out.task_accepted[int(task.group(1))] = int(m.group(2))
        return
    m = _PER_POS.search(line)
    if m:
        out.acc_per_pos = _floats(m.group(1))
        return
    m = _STATS.search(line)
    if m:
        if len(m.group(1)) > MAX_NAME or (m.group(1) not in out.statistics and len(out.statistics) >= MAX_NAMES):
            raise ValueError("more or longer statistics lines than a server prints")
        out.statistics[m.group(1)] = _statistics(m.groups())
        return
    m = _PROMPT.search(line)
    if m:
        out.requests += 1
        out.timings = {"prompt_ms": _float(m.group(1)), "prompt_tokens": int(m.group(2))}
        return
    m = _EVAL.search(line)
    if m:
        out.timings.update({"eval_ms": _float(m.group(1)), "eval_tokens": int(m.group(2))})


def _statistics(g: tuple[str | Any, ...]) -> result.Counters:
    """One implementation's `statistics` line (the groups of _STATS) as the record keeps it."""
    s: result.Counters = {k: int(v) for k, v in zip(
        ("calls_begin", "calls_draft", "calls_accept", "gen_drafts", "acc_drafts", "gen_tokens", "acc_tokens"),
        g[1:8], strict=True)}
    if g[8] is not None:
        s["mean_acc_len"] = _float(g[8])
        s["acc_rate_per_pos"] = _floats(g[9])
    if g[10] is not None:
        s["dur_ms"] = {"begin": _float(g[10]), "draft": _float(g[11]), "accept": _float(g[12])}
    return s


def _call(calls: dict[int, list[tuple[int, int]]], replay: set[int], task: int, accepted: int, drafted: int,
          restored: bool) -> None:
    """One call line into `calls` (see the module docstring for the replay after a restored checkpoint)."""
    if task in replay and not restored:
        replay.discard(task)
        return
    if restored:
        replay.add(task)
    if 0 <= accepted <= drafted <= MAX_DRAFT:
        calls.setdefault(task, []).append((accepted, drafted))


def draft_calls(parsed: ServerLog, skip: set[int] | frozenset[int] = frozenset()) -> result.DraftCalls | None:
    """The draft calls of the parsed log's tasks (those in `skip` left out: a reused server's earlier requests) as
    histograms: `accepted[i]` calls accepted exactly i drafted tokens, `drafted[i]` calls drafted exactly i;
    `calls` in all. None when no call line was printed (LLAMA_TRACE unset, or nothing drafted), or when a task's
    calls do not add up to the accepted count of its own `draft acceptance` line (lines cut off: no partial
    figures)."""
    tasks = [t for t in parsed.calls if t not in skip]
    if not tasks:
        return None
    acc: list[int] = []
    dr: list[int] = []
    for t in tasks:
        calls = parsed.calls[t]
        if parsed.task_accepted.get(t) != sum(a for a, _ in calls):
            return None
        for a, d in calls:
            for hist, i in ((acc, a), (dr, d)):
                hist.extend([0] * (i + 1 - len(hist)))
                hist[i] += 1
    return {"calls": sum(acc), "accepted": acc, "drafted": dr, "tasks": len(tasks)}
