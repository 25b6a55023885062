"""The honesty checks on measurement series and outputs constructed here."""

from __future__ import annotations

import pytest

from harness.analysis import checks


def test_baseline_above_roofline_is_flagged():
    # 17.5 GB of weights at 273 GB/s: 15.6 passes/s
    v = checks.physics(208.0, None, 273, 17_500_000_000, baseline=True)
    assert v.flagged
    assert v.sentence.startswith("physically impossible: implies 208.0 passes/s, ceiling 15.6")
    ok = checks.physics(11.54, None, 273, 17_500_000_000, baseline=True)
    assert not ok.flagged and ok.sentence.startswith("74% of the roofline")


def test_speculative_cell_uses_implied_passes():
    # 28.06 tok/s at 2.5 tokens per pass: 11.2 passes/s, possible
    assert not checks.physics(28.06, 2.5, 273, 17_500_000_000, baseline=False).flagged
    # 60 tok/s at 1.5 tokens per pass: 40 passes/s, impossible
    v = checks.physics(60.0, 1.5, 273, 17_500_000_000, baseline=False)
    assert v.flagged and "implies 40.0 passes/s" in v.sentence


def test_tokens_per_pass():
    assert checks.tokens_per_pass(512, 0) == 1.0
    assert checks.tokens_per_pass(512, 256) == 2.0
    assert checks.tokens_per_pass(10, 10) is None


def _out(tokens):
    import hashlib

    text = " ".join(map(str, tokens))
    return {"tokens": tokens, "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}


def test_divergence_located_with_margin_and_rank():
    base = [5, 9, 4, 7, 7, 3, 8, 2]
    margins = [2.1, 0.9, 0.5, 0.022, 0.01, 1.7, 0.3, 0.8]
    probs = {"positions": [{"id": t, "margin": m} for t, m in zip(base, margins, strict=True)]}
    other = [5, 9, 4, 6, 1, 1, 1, 1]
    v = checks.determinism(_out(base), _out(other), probs)
    assert v.flagged
    assert v.data["first_divergent_token"] == 3
    assert v.data["margin"] == pytest.approx(0.022)
    assert v.data["margin_rank"] == 2
    assert "diverges at token 3: baseline top-2 margin 0.022, the 2nd narrowest of 8" == v.sentence


def test_identical_outputs_are_not_flagged():
    v = checks.determinism(_out([1, 2, 3]), _out([1, 2, 3]), None)
    assert not v.flagged and v.data["identical"]


def test_prefix_divergence():
    assert checks.first_divergence([1, 2, 3], [1, 2]) == 2
    assert checks.first_divergence([1, 2], [1, 2]) is None
