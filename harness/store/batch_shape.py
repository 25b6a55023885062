"""A sampling batch's samples checked at the speed of reading: what schemas/samples.schema.json says of each item of
`samples` (seed, tokens, stop type, draft counts, log-probabilities, the baseline's candidates), written out, so a
study of 50,000 batches is not read through the schema validator item by item. It only says yes or no: a batch it
does not pass is checked by the schema itself, which names the field. tests/test_trust_verdicts.py holds it to the
schema on crafted items."""

from __future__ import annotations

import math
from typing import Any

from harness.schema import MAX_INTEGER, MAX_NUMBER

_KEYS = frozenset({"seed", "tokens", "stop_type", "draft_n", "draft_n_accepted", "logprobs", "top"})
_REQUIRED = ("seed", "tokens", "draft_n", "draft_n_accepted")
MAX_SAMPLES, MAX_TOKENS, MAX_CANDIDATES, MAX_STOP_TYPE = 10_000, 4096, 64, 64


def _count(x: Any) -> bool:
    """A JSON integer of the schema's kind, 0 or more."""
    return type(x) is int and 0 <= x < MAX_INTEGER


def _logprob(x: Any) -> bool:
    """A JSON number of the schema's kind, at most 0."""
    if type(x) is int:
        return -MAX_INTEGER < x <= 0
    return type(x) is float and math.isfinite(x) and -MAX_NUMBER <= x <= 0


def _sample(s: Any) -> bool:
    if type(s) is not dict or not s.keys() <= _KEYS or any(k not in s for k in _REQUIRED):
        return False
    tokens, lps, top, stop = s["tokens"], s.get("logprobs"), s.get("top"), s.get("stop_type")
    if not (_count(s["seed"]) and _count(s["draft_n"]) and _count(s["draft_n_accepted"])):
        return False
    if type(tokens) is not list or len(tokens) > MAX_TOKENS or not all(map(_count, tokens)):
        return False
    if stop is not None and (type(stop) is not str or len(stop) > MAX_STOP_TYPE):
        return False
    if lps is not None and (type(lps) is not list or len(lps) > MAX_TOKENS or not all(map(_logprob, lps))):
        return False
    if "top" in s:
        if type(top) is not list or len(top) > MAX_TOKENS:
            return False
        for pos in top:
            if type(pos) is not list or len(pos) > MAX_CANDIDATES:
                return False
            for c in pos:
                if type(c) is not list or len(c) != 2 or not _count(c[0]) or not (c[1] is None or _logprob(c[1])):
                    return False
    return True


def samples_fit(samples: Any) -> bool:
    """Whether a batch's `samples` is a list the schema accepts (True), or may not be (False: let the schema say)."""
    return type(samples) is list and len(samples) <= MAX_SAMPLES and all(map(_sample, samples))
