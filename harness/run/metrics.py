"""llama-server's own speculative counters, read from `GET /metrics` (Prometheus text, served with `--metrics`).

The pinned build (b11434, tools/server/server-task.cpp) counts for every backend, at any log level:
- `llamacpp:spec_decode_num_drafts_total`: verification steps (draft calls);
- `llamacpp:spec_decode_num_draft_tokens_total`: tokens drafted;
- `llamacpp:spec_decode_num_accepted_tokens_total`: drafted tokens the target accepted;
- `llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="k"}` (k from 0): steps that accepted at least
  k + 1 drafted tokens (the family is absent until a speculative request has finished).
They add up over the server's life, flushed when a request's slot is released (before the next task the server
takes: a scrape after the response has the request in it). On a fresh server, the counters after one request
minus those before it are that request's own; mean acceptance length = 1 + accepted / drafts, acceptance at
position k = per_pos[k] / drafts.

A scrape is untrusted text: its size is bounded, only these families are read, every other line is ignored, and a
scrape that cannot be read (no `--metrics`, an error status, garbage, a counter that went down) is a recorded
absence with its reason, never an exception. Other modules that read /metrics (serving under load) share
`parse`."""

from __future__ import annotations

import http.client
import math
import re
from dataclasses import dataclass, field

from harness.hosts.engine import Endpoint
from harness.store.result import MAX_COUNT, MAX_POSITIONS, CountersAbsent, SpecCounters

PREFIX = "llamacpp:spec_decode_"
DRAFTS = PREFIX + "num_drafts_total"
DRAFT_TOKENS = PREFIX + "num_draft_tokens_total"
ACCEPTED = PREFIX + "num_accepted_tokens_total"
PER_POS = PREFIX + "num_accepted_tokens_per_pos_total"
#: The most bytes of a /metrics answer read (the pinned build's is about 3 KB; 64 per-position lines add 6 KB).
MAX_BYTES = 256 << 10
SCRAPE_TIMEOUT_S = 5.0

# `name{labels} value [timestamp]`; labels as Prometheus writes them (no nested braces)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^{}]*\})?[ \t]+(\S+)(?:[ \t]+\S+)?$")
_POSITION = re.compile(r'^\{\s*position\s*=\s*"(\d{1,5})"\s*,?\s*\}$')


@dataclass
class Scrape:
    """The speculative families of one /metrics answer (None: the family was not in it)."""

    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    per_pos: dict[int, int] = field(default_factory=dict)


class ScrapeError(ValueError):
    """A /metrics answer the kit cannot read as counters; the message is one line."""


def _count(text: str) -> int:
    # the pinned build writes its totals through a double stream: integers, or e.g. 1.23457e+06 past 6 digits
    try:
        v = float(text)
    except ValueError:
        raise ScrapeError(f"value {text[:40]!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or v > MAX_COUNT or v != int(v):
        raise ScrapeError(f"value {text[:40]!r} is not a count (a whole number from 0 to 2^53)")
    return int(v)


def parse(text: str) -> Scrape:
    """The `llamacpp:spec_decode_*` counters of a Prometheus text answer; ScrapeError on a malformed sample of
    those families (other lines, comments and families are ignored)."""
    out = Scrape()
    for n, raw in enumerate(text.splitlines()[:100_000], start=1):
        line = raw.strip()
        if not line.startswith(PREFIX):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ScrapeError(f"line {n}: {line[:80]!r} is not a Prometheus sample")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name == PER_POS:
            pos = _POSITION.match(labels or "")
            if pos is None:
                raise ScrapeError(f"line {n}: {PER_POS} without a position label")
            k = int(pos.group(1))
            if k >= MAX_POSITIONS or k in out.per_pos:
                raise ScrapeError(f"line {n}: position {k} repeated or beyond {MAX_POSITIONS - 1}")
            out.per_pos[k] = _count(value)
        elif name in (DRAFTS, DRAFT_TOKENS, ACCEPTED) and not labels:
            attr = {DRAFTS: "drafts", DRAFT_TOKENS: "draft_tokens", ACCEPTED: "accepted"}[name]
            if getattr(out, attr) is not None:
                raise ScrapeError(f"line {n}: {name} given twice")
            setattr(out, attr, _count(value))
    return out


def difference(before: Scrape, after: Scrape) -> SpecCounters:
    """What happened between two scrapes of one server: its counters' increase; ScrapeError where a total is
    missing or went down (another server, a restart)."""
    def inc(name: str, a: int | None, b: int | None) -> int:
        if b is None:
            raise ScrapeError(f"{PREFIX}{name}_total missing from the scrape after the request")
        d = b - (a or 0)
        if d < 0:
            raise ScrapeError(f"{PREFIX}{name}_total went down ({a} to {b}): not the same server")
        return d

    drafts = inc("num_drafts", before.drafts, after.drafts)
    tokens = inc("num_draft_tokens", before.draft_tokens, after.draft_tokens)
    accepted = inc("num_accepted_tokens", before.accepted, after.accepted)
    if after.per_pos and sorted(after.per_pos) != list(range(len(after.per_pos))):
        raise ScrapeError(f"{PER_POS}: positions are not 0..{len(after.per_pos) - 1}")
    per_pos = [inc("num_accepted_tokens_per_pos", before.per_pos.get(k), after.per_pos[k])
               for k in range(len(after.per_pos))]
    if accepted > tokens or (per_pos and (per_pos[0] > drafts or sum(per_pos) > accepted)):
        raise ScrapeError(f"inconsistent counters: {drafts} drafts, {tokens} drafted, {accepted} accepted, "
                          f"per position {per_pos[:8]}")
    return {"drafts": drafts, "draft_tokens": tokens, "accepted": accepted, "accepted_per_pos": per_pos}


def scrape(endpoint: Endpoint, transient: tuple[type[BaseException], ...] = ()) -> Scrape | str:
    """One untimed `GET /metrics`: its counters, or one line saying why there are none."""
    errors: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError, http.client.HTTPException, OSError,
                                               *transient)
    try:
        conn = endpoint.connection(SCRAPE_TIMEOUT_S)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            body = resp.read(MAX_BYTES + 1)
        finally:
            conn.close()
    except errors as e:
        return f"GET /metrics failed: {type(e).__name__}"
    if resp.status != 200:
        return f"GET /metrics answered {resp.status} (a server started without --metrics?)"
    if len(body) > MAX_BYTES:
        return f"GET /metrics answered more than {MAX_BYTES} bytes"
    try:
        return parse(body.decode("utf-8", errors="replace"))
    except ScrapeError as e:
        return f"GET /metrics: {e}"


def request_counters(before: Scrape | str, after: Scrape | str) -> SpecCounters | CountersAbsent:
    """A request's counters from the scrapes around it, or why there are none."""
    for s in (before, after):
        if isinstance(s, str):
            return {"absent": s[:300]}
    assert isinstance(before, Scrape) and isinstance(after, Scrape)
    try:
        return difference(before, after)
    except ScrapeError as e:
        return {"absent": str(e)[:300]}


def mean_length(c: SpecCounters) -> float | None:
    """Mean acceptance length per verification step, the target's own token included: 1 + accepted / drafts."""
    return 1 + c["accepted"] / c["drafts"] if c["drafts"] else None
