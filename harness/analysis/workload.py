"""What a run asked of its server, as `invoke compare` keys two runs on it (compare-llama-bench keys every row on
such properties): the protocol (a fresh container per measurement or a reused server), the server's flags as its
records ran them (threads, batch, context, KV types, flash-attention,
every strategy's own flags), the sampling, the endpoint, each task's n_predict and its prompts by sha256. Two runs
that differ in any of these measured different workloads: `compare` names each difference before its verdict and
does not call one a reproduction of the other.

The flags come from the records' `server_command` (what ran, not what a manifest says), with what differs by
design between any two runs taken out: the port, the host address, the model files' paths (their sha256 are compared
as models), and the program name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from harness.store import result
from harness.store.runmeta import RunMeta

#: Flags whose value differs between any two runs by design (a free port, the bind address, a path to a model file
#: whose sha256 is compared as a model).
MASKED = frozenset({"--port", "--host", "-m", "--model", "-md", "--model-draft", "-mu", "--model-url"})
#: Most flags of one command read (a bound: a record is untrusted input).
MAX_FLAGS = 400


def flags(command: Iterable[Any]) -> dict[str, str]:
    """A server command as {flag: value} ('' for a switch), the program name and MASKED flags left out; a token
    that follows a flag and does not start with '-' (or is a negative number) is its value."""
    toks = [str(t) for t in list(command)[1:MAX_FLAGS + 1]]
    out: dict[str, str] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if not t.startswith("-"):
            i += 1
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        has_value = nxt is not None and (not nxt.startswith("-") or _number(nxt))
        if t not in MASKED:
            out[t] = nxt if has_value and nxt is not None else ""
        i += 2 if has_value else 1
    return out


def _number(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Property:
    """One workload property that differs between A and B: what (`field`), A's and B's values."""

    field: str
    a: Any
    b: Any


def server_flags(records: Iterable[result.ResultRecord]) -> dict[str, dict[str, str]]:
    """Per strategy, its server's flags (the first record with a command; every measurement of a strategy starts
    the same command but for the port)."""
    out: dict[str, dict[str, str]] = {}
    for r in records:
        cmd = r.get("server_command")
        if r.get("strategy") not in out and isinstance(cmd, list) and cmd:
            out[str(r["strategy"])] = flags(cmd)
    return out


def properties(meta: RunMeta, records: Iterable[result.ResultRecord]) -> dict[str, Any]:
    """Every workload property of a run by field name (see the module docstring)."""
    out: dict[str, Any] = {"protocol": meta.protocol, "endpoint": meta.endpoint,
                           "sampling": {k: v for k, v in sorted(vars(meta.sampling).items())}}
    for t in meta.tasks:
        out[f"n_predict ({t.id})"] = t.n_predict
        out[f"prompts ({t.id})"] = ", ".join(f"{p.id} {p.sha256[:12]}" for p in t.prompts)
    for sid, fl in server_flags(records).items():
        for flag, value in fl.items():
            out[f"server flag {flag} ({sid})"] = value
    return out


def differences(a: Mapping[str, Any], b: Mapping[str, Any], strategies: Iterable[str],
                tasks: Iterable[str]) -> list[Property]:
    """The properties that differ, among the strategies and tasks both runs measured (a cell only one of them has is
    reported missing, not as a difference); a server flag that differs the same way for every such strategy is
    named once, "(every strategy)"."""
    sids, tids = set(strategies), set(tasks)

    def mine(key: str) -> bool:
        inside = key.rsplit(" (", 1)[-1].rstrip(")") if key.endswith(")") else None
        return inside is None or inside in sids or inside in tids

    diffs = [Property(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if mine(k) and a.get(k) != b.get(k)]
    by_flag: dict[str, list[Property]] = {}
    for d in diffs:
        if d.field.startswith("server flag "):
            by_flag.setdefault(d.field.rsplit(" (", 1)[0], []).append(d)
    out = []
    for d in diffs:
        base = d.field.rsplit(" (", 1)[0]
        group = by_flag.get(base)
        if d.field.startswith("server flag ") and group and len(group) == len(sids) > 1 and \
                len({(g.a, g.b) for g in group}) == 1:
            if group[0] is d:
                out.append(Property(f"{base} (every strategy)", d.a, d.b))
            continue
        out.append(d)
    return out


def same_records(a: Iterable[result.ResultRecord], b: Iterable[result.ResultRecord]) -> tuple[int, int]:
    """(B's records that are A's, B's records): a record is the same when its measurement id, start time and
    container match (a run compared with itself, or B a copy or a resumption of A)."""
    def key(r: result.ResultRecord) -> tuple[Any, Any, Any]:
        return r.get("measurement_id"), r.get("started_at"), r.get("container_id")
    mine = {key(r) for r in a}
    bs = [key(r) for r in b]
    return sum(1 for k in bs if k in mine), len(bs)
