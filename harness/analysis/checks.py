"""The checks that keep numbers honest. Each is a plain function returning a verdict and a sentence.
(Contamination is judged from evidence across a whole run: harness/analysis/stats.py.)

- physics: the memory-bandwidth roofline of target passes per second.
- determinism: byte match against the no-speculation baseline at temperature 0, and where it diverges.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from harness import formatter as fm
from harness.models import passbytes
from harness.store import result, shapes


@dataclass(frozen=True)
class Check:
    check: str
    flagged: bool
    sentence: str
    data: shapes.PhysicsData | shapes.DeterminismData

    def as_dict(self) -> shapes.Check:
        return shapes.Check(**asdict(self))


def roofline_passes_per_s(bandwidth_gbs: float, bytes_per_pass: float) -> float:
    """Target forward passes per second the memory bandwidth allows, when every pass reads `bytes_per_pass`."""
    return bandwidth_gbs * 1e9 / bytes_per_pass


def tokens_per_pass(predicted_n: int, draft_n_accepted: int) -> float | None:
    """Tokens produced per target forward pass: each pass yields one token plus the drafts it accepted."""
    passes = predicted_n - draft_n_accepted
    return predicted_n / passes if passes > 0 else None


def physics(tok_s: float, tpp: float | None, bandwidth_gbs: float, weight_bytes: float, baseline: bool,
            bandwidth_source: str = "published", pass_bytes: passbytes.PassBytesJson | None = None,
            rule: str | None = None) -> Check:
    """Is a throughput possible? Implied target passes per second (tok/s over tokens per pass) above bandwidth /
    bytes per pass is not. `pass_bytes` (harness/models/passbytes.py: weights, KV at depth, draft) refines the bytes
    when the headers were read; else the file's weight bytes stand for them."""
    total = float(pass_bytes["total"]) if pass_bytes and pass_bytes.get("total") else float(weight_bytes)
    ceiling = roofline_passes_per_s(bandwidth_gbs, total)
    per_pass = 1.0 if baseline or not tpp else tpp
    implied = tok_s / per_pass
    fraction = implied / ceiling
    rule = rule or f"{fm.num(weight_bytes / 1e6, 2)} MB of weights per target pass"
    data: shapes.PhysicsData = {"tok_s": tok_s, "tokens_per_pass": per_pass, "implied_passes_s": round(implied, 3),
            "ceiling_passes_s": round(ceiling, 3), "fraction": round(fraction, 4), "bandwidth_gbs": bandwidth_gbs,
            "bandwidth_source": bandwidth_source, "weight_bytes": weight_bytes, "bytes_per_pass": round(total),
            "pass_bytes": pass_bytes, "rule": rule}
    if implied > ceiling:
        return Check("physics", True, f"physically impossible: implies {fm.num(implied, 1)} passes/s, ceiling "
                       f"{fm.num(ceiling, 1)} ({fm.plain(bandwidth_gbs)} GB/s {bandwidth_source} / {rule})", data)
    what = "of the roofline" if baseline else "of the roofline in target passes"
    return Check("physics", False,
                   f"{fm.pct(fraction)} {what} ({fm.num(implied, 1)} of {fm.num(ceiling, 1)} passes/s; {rule})", data)


def margin_rank(margins: list[float | None], index: int) -> int | None:
    """Rank of margins[index] among the sequence's margins, 1 = the narrowest."""
    m = margins[index] if 0 <= index < len(margins) else None
    if m is None:
        return None
    return 1 + sum(1 for x in margins if x is not None and x < m)


def first_divergence(baseline_tokens: list[int], tokens: list[int]) -> int | None:
    """Index of the first differing token, or None when one sequence is the other (or equal)."""
    for i, (a, b) in enumerate(zip(baseline_tokens, tokens, strict=False)):
        if a != b:
            return i
    if len(baseline_tokens) != len(tokens):
        return min(len(baseline_tokens), len(tokens))
    return None


def determinism(baseline: result.Output, other: result.Output, probs: result.Probs | None) -> Check:
    """Byte match of one strategy's output against the baseline's at temperature 0; where it diverges, the
    first divergent token, the baseline's top-2 logprob margin there and its rank among the narrowest."""
    same = baseline["sha256"] == other["sha256"]
    data: shapes.DeterminismData = {"identical": same}
    if same:
        return Check("determinism", False, "byte-identical to the baseline", data)
    idx = first_divergence(baseline.get("tokens") or [], other.get("tokens") or [])
    data["first_divergent_token"] = idx
    if idx is None:
        return Check("determinism", True, "output differs from the baseline (no token ids to locate it)", data)
    positions = (probs or {}).get("positions") or []
    margins = [p.get("margin") for p in positions]
    ids_match = [p.get("id") for p in positions][: len(baseline.get("tokens") or [])] == \
        (baseline.get("tokens") or [])[: len(positions)]
    data["baseline_token"] = positions[idx].get("token") if idx < len(positions) else None
    data["other_token_id"] = (other.get("tokens") or [None] * (idx + 1))[idx] if idx < len(other.get("tokens") or []) \
        else None
    if idx < len(margins) and margins[idx] is not None and ids_match:
        rank = margin_rank(margins, idx)
        data.update(margin=margins[idx], margin_rank=rank, positions=len(margins))
        return Check("determinism", True, f"diverges at token {idx}: baseline top-2 margin "
                       f"{fm.fixed(margins[idx], 3)}, the {_ordinal(rank)} narrowest of {len(margins)}", data)
    return Check("determinism", True, f"diverges at token {idx} (no baseline margin recorded there)", data)


def _ordinal(n: int | None) -> str:
    if n is None:
        return "?"
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
