"""Lossless in distribution at a temperature above 0: the sampling study (harness/run/sampling.py) judged.

Every speculative method claims that at any temperature its output has the target's distribution. Two stages:

- Stage 1, seeded equality: each of the strategy's samples against the baseline's with the same seed. A build that
  verifies drafts by exact match (b11434's default: drafts taken greedily, each checked against the token the
  target samples itself) should reproduce the baseline token for token; where it does, that is the strictest
  evidence there is. Where a sample does not, the first divergent position is named, with the baseline's rank of
  the token the strategy took there. A strategy that samples by rejection (b11434: `--spec-draft-sampling
  probabilistic` on draft-simple or draft-mtp) spends its random numbers differently: seeded equality is not
  expected of it, and stage 2 decides.
- Stage 2, two-sample tests: the strategy's samples against the baseline's drawn with other seeds (independent of
  the strategy's), per strategy and prompt: the first token's distribution and the first m tokens as sequences
  (categories rarer than MIN_CATEGORY pooled; chi-square statistic), every position at once (a kernel two-sample
  test with the Hamming kernel: the share of positions where two samples agree), and, where log-probabilities
  under the target are known, each sample's total log-probability (Kolmogorov-Smirnov statistic). Every p-value is
  a permutation p-value (exact in level whatever the sample sizes and ties). The first token is sampled before any
  draft exists: it can only show a difference in how the server samples, not in how it drafts.
- One family: every test of a run's table is judged at once with Holm's procedure (all verdicts of a table are
  right in 95% of tables). The positive control (the baseline at another temperature or top-k) must come out as
  "differs"; where it does not, the table says the study had no power. The A/A row (the baseline with the same
  seeds as the strategies against the reference) shows what "no difference" looks like.
- Size: the total-variation distance between the two samples' first m tokens (pooled categories) with a basic
  bootstrap interval, and the smallest distance these samples could detect between those categories: the least
  detectable departures of that distance (mass moved between two halves of the outcomes, at the first token and at
  later ones), found with 80% power at the family's strictest level in a simulation on the reference's own
  outcomes (`detectable_tv`). Mass moved among outcomes too rare to be told apart is not in that distance.

Pure functions of run.json's study and the run folder's samples.jsonl; bench/distribution_calibration.py checks the
family's error on A/A copies, the control's detection rate and the stated distance with the permutation tests."""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import sparse
from scipy import stats as sps

from harness.analysis import inference as inf
from harness.intake import spec_types
from harness.store import result, shapes
from harness.store.runmeta import StudyMeta

ALPHA = inf.ALPHA
#: Label permutations per test: p-values resolve to 1/(PERMUTATIONS + 1), far below a family's strictest level.
PERMUTATIONS = 4999
#: The table's permutation work at most (relabellings x samples squared, summed over its rows: the Hamming kernel
#: test's cost); a larger study draws fewer relabellings per test, and its report says how many (a few seconds of CPU).
PERMUTATION_WORK = 5 * 10**10
#: Never fewer relabellings than this per test, however large the study (p-values resolve to 1/(count + 1)).
MIN_PERMUTATIONS = 199
BOOTSTRAPS = 2000
#: Up to this many samples in a row, the kernel test counts shared positions pair by pair; above, sparsely.
DENSE_KERNEL = 64
#: Categories seen fewer times than this in both samples together are pooled into one.
MIN_CATEGORY = 5
POWER = 0.8
#: Tests in the order a row lists them.
TESTS = ("first token", "first tokens", "every position", "log-probability")


@dataclass(frozen=True)
class Sample:
    seed: int
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    top: tuple[tuple[tuple[int, float | None], ...], ...] | None
    drafted: int

    @property
    def logprob(self) -> float | None:
        """The sample's total log-probability under the target, where known."""
        return None if self.logprobs is None else float(sum(self.logprobs))


#: (host, arm, task, prompt) -> that arm's batch records on that prompt, in file order.
BatchIndex = Mapping[tuple[str, str, str, str], Sequence[result.BatchRecord]]


def batch_index(records: Sequence[result.BatchRecord]) -> dict[tuple[str, str, str, str], list[result.BatchRecord]]:
    """The records by host, arm, task and prompt: read once, so the table's cost is linear in its rows."""
    out: dict[tuple[str, str, str, str], list[result.BatchRecord]] = {}
    for r in records:
        out.setdefault((r["host"], r["arm"], r["task"], r["prompt"]), []).append(r)
    return out


def arm_samples(records: Sequence[result.BatchRecord] | BatchIndex, host: str, arm: str, task: str,
                prompt: str) -> dict[int, Sample]:
    """One arm's samples on one prompt by seed, from its complete batches (a failed batch's samples are left out);
    `records` a list, or their batch_index."""
    out: dict[int, Sample] = {}
    key = (host, arm, task, prompt)
    mine = records.get(key, ()) if isinstance(records, Mapping) else records
    for r in mine:
        if (r["host"], r["arm"], r["task"], r["prompt"]) != key or r["status"] != "ok":
            continue
        for s in r["samples"]:
            lps = s.get("logprobs")
            top = s.get("top")
            out.setdefault(s["seed"], Sample(s["seed"], tuple(s["tokens"]), tuple(lps) if lps is not None else None,
                                             tuple(tuple((int(c), lp) for c, lp in pos) for pos in top)
                                             if top is not None else None, int(s["draft_n"])))
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- stage 1


def verification(spec_type: str, args: Sequence[str]) -> str:
    """How a strategy's drafts are verified at temperature > 0 in b11434: "rejection" where its type's row honours
    `--spec-draft-sampling probabilistic` (harness/intake/spec_types.py) and the strategy passes it, else "exact
    match"."""
    flat = [a for x in args for a in (x.split("=", 1) if x.startswith("--") and "=" in x else [x])]
    probabilistic = any(a == "--spec-draft-sampling" and b == "probabilistic" for a, b in zip(flat, flat[1:],
                                                                                              strict=False))
    row = spec_types.find(spec_type)
    return "rejection" if probabilistic and row is not None and row.rejection else "exact match"


def _divergence(base: Sample, other: Sample) -> shapes.Divergence:
    """Where a sample leaves the baseline's with the same seed: the position, both tokens with the baseline's rank
    of each (1 = its likeliest; None: not among the candidates recorded) and both log-probabilities."""
    pos = next((i for i, (x, y) in enumerate(zip(base.tokens, other.tokens, strict=False)) if x != y),
               min(len(base.tokens), len(other.tokens)))
    cands = list(base.top[pos]) if base.top is not None and pos < len(base.top) else []
    ranked = sorted(cands, key=lambda c: -(c[1] if c[1] is not None else -1e9))
    token = other.tokens[pos] if pos < len(other.tokens) else None
    base_token = base.tokens[pos] if pos < len(base.tokens) else None
    rank = next((i + 1 for i, (c, _) in enumerate(ranked) if c == token), None)
    base_rank = next((i + 1 for i, (c, _) in enumerate(ranked) if c == base_token), None)
    return {"seed": base.seed, "position": pos, "baseline_token": base_token, "baseline_rank": base_rank,
            "token": token, "rank": rank,
            "baseline_logprob": base.logprobs[pos] if base.logprobs is not None and pos < len(base.logprobs)
            else None, "logprob": next((lp for c, lp in cands if c == token), None)}


def seeded_equality(base: Mapping[int, Sample], other: Mapping[int, Sample]) -> shapes.SeededEquality:
    """Stage 1: the strategy's samples against the baseline's with the same seeds."""
    seeds = sorted(base.keys() & other.keys())
    divergent = [_divergence(base[s], other[s]) for s in seeds if base[s].tokens != other[s].tokens]
    return {"paired": len(seeds), "identical": len(seeds) - len(divergent), "divergent": divergent}


# ---------------------------------------------------------------- stage 2: the statistics


def pooled_codes(values_a: Sequence[Any], values_b: Sequence[Any]) -> tuple[np.ndarray, int, int]:
    """Both samples' outcomes as category codes over the two together, categories seen fewer than MIN_CATEGORY
    times pooled into one; the number of categories, and of outcomes kept apart."""
    counts = Counter([*values_a, *values_b])
    kept = sorted((v for v, n in counts.items() if n >= MIN_CATEGORY), key=lambda v: (-counts[v], repr(v)))
    code = {v: i for i, v in enumerate(kept)}
    other = len(kept)
    codes = np.array([code.get(v, other) for v in [*values_a, *values_b]], dtype=np.int64)
    return codes, int(codes.max()) + 1 if len(codes) else 0, len(kept)


def permutations(n_a: int, n_b: int, rng: np.random.Generator, count: int = PERMUTATIONS) -> np.ndarray:
    """Label matrices, first row the observed labelling (the first n_a values are sample A's), then `count`
    random relabellings; True marks sample A. Where the samples have no more distinct labellings than that, every
    other one once instead (the exact permutation test, and cheap: 2 samples against 2 have 6)."""
    labels = np.zeros(n_a + n_b, dtype=bool)
    labels[:n_a] = True
    if math.comb(n_a + n_b, n_a) <= count + 1:
        every = [c for c in itertools.combinations(range(n_a + n_b), n_a) if c != tuple(range(n_a))]
        rest = np.zeros((len(every), n_a + n_b), dtype=bool)
        for i, c in enumerate(every):
            rest[i, list(c)] = True
        return np.vstack([labels, rest])
    perms = rng.permuted(np.tile(labels, (count, 1)), axis=1)
    return np.vstack([labels, perms])


def permutation_count(sizes: Sequence[int]) -> int:
    """Relabellings per test for a table whose rows compare this many samples each (a row's and its reference's
    together): PERMUTATIONS, or fewer where the table's work would pass PERMUTATION_WORK (never below
    MIN_PERMUTATIONS)."""
    work = sum(n * n for n in sizes)
    if work * PERMUTATIONS <= PERMUTATION_WORK:
        return PERMUTATIONS
    return max(MIN_PERMUTATIONS, int(PERMUTATION_WORK // work))


def chi_square(codes: np.ndarray, k: int) -> Callable[[np.ndarray], np.ndarray]:
    """The chi-square statistic of the 2 x k table each labelling makes of `codes`."""
    onehot = np.eye(k)[codes]
    totals = onehot.sum(axis=0)

    def stat(m: np.ndarray) -> np.ndarray:
        n_a = m[0].sum()
        n_b = m.shape[1] - n_a
        a = m.astype(float) @ onehot
        b = totals - a
        ea, eb = totals * n_a / m.shape[1], totals * n_b / m.shape[1]
        return ((a - ea) ** 2 / ea + (b - eb) ** 2 / eb).sum(axis=1)
    return stat


def hamming_mmd(tokens: Sequence[Sequence[int]]) -> Callable[[np.ndarray], np.ndarray]:
    """The (biased) squared maximum mean discrepancy with the Hamming kernel: k(x, y) = the share of positions
    where x and y hold the same token (a sample that ended holds none)."""
    length = max((len(t) for t in tokens), default=0) or 1
    n = len(tokens)
    # past its end a sample holds a value of its own (-1 - i): it matches no other sample, only itself
    grid = np.repeat(-1 - np.arange(n, dtype=np.int64)[:, None], length, axis=1)
    for i, t in enumerate(tokens):
        grid[i, :len(t)] = t
    if n <= DENSE_KERNEL:
        same = np.zeros((n, n), dtype=np.int64)
        for j in range(length):
            same += grid[:, j, None] == grid[None, :, j]
        same[np.diag_indices(n)] -= np.array([length - len(t) for t in tokens], dtype=same.dtype)
        return _mmd(same / length)
    # samples x (position, token) incidence: its product with itself counts the positions two samples share
    # (sparse: the cost follows the pairs that match, not every pair at every position)
    span = int(grid.max()) + n + 2
    _, codes = np.unique(np.arange(length)[None, :] * span + grid + n + 1, return_inverse=True)
    incidence = sparse.csr_matrix((np.ones(n * length, dtype=np.int32),
                                   (np.repeat(np.arange(n), length), codes.ravel())))
    same = (incidence @ incidence.T).toarray()
    same[np.diag_indices(n)] -= np.array([length - len(t) for t in tokens], dtype=same.dtype)
    return _mmd(same / length)


def _mmd(kernel: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    def stat(m: np.ndarray) -> np.ndarray:
        n_a = m[0].sum()
        s = np.where(m, 1.0 / n_a, -1.0 / (m.shape[1] - n_a))
        return ((s @ kernel) * s).sum(axis=1)
    return stat


def kolmogorov_smirnov(values: Sequence[float]) -> Callable[[np.ndarray], np.ndarray]:
    """The two-sample Kolmogorov-Smirnov statistic, ties counted together."""
    x = np.asarray(values, dtype=float)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    ends = np.flatnonzero(np.append(xs[1:] != xs[:-1], True))

    def stat(m: np.ndarray) -> np.ndarray:
        n_a = m[0].sum()
        n_b = m.shape[1] - n_a
        in_a = np.cumsum(m[:, order], axis=1, dtype=np.int32)[:, ends]
        return np.abs(in_a / n_a - (ends + 1 - in_a) / n_b).max(axis=1)
    return stat


def p_value(stats: np.ndarray) -> float:
    """The permutation p-value of the first (observed) statistic among the rest."""
    observed = stats[0]
    return float((1 + np.sum(stats[1:] >= observed - 1e-12 * max(1.0, abs(observed)))) / len(stats))


def total_variation(codes: np.ndarray, k: int, n_a: int, rng: np.random.Generator) -> shapes.TotalVariation:
    """The plug-in total-variation distance between the two samples' pooled categories, with a basic bootstrap
    95% interval (each sample resampled on its own; the plug-in is biased upward, the basic interval corrects
    for it and is clipped to [0, 1])."""
    a, b = codes[:n_a], codes[n_a:]

    def shares(x: np.ndarray) -> np.ndarray:  # per row of x, the share of each category
        rows = x.reshape(-1, x.shape[-1])
        flat = (rows + k * np.arange(len(rows))[:, None]).ravel()
        return np.bincount(flat, minlength=k * len(rows)).reshape(len(rows), k) / x.shape[-1]

    def tv(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return 0.5 * np.abs(shares(x) - shares(y)).sum(axis=-1)

    est = float(tv(a, b)[0])
    boot = tv(rng.choice(a, (BOOTSTRAPS, len(a))), rng.choice(b, (BOOTSTRAPS, len(b))))
    lo, hi = np.quantile(boot, [ALPHA / 2, 1 - ALPHA / 2])
    return {"estimate": round(est, 4), "low": round(float(max(0.0, 2 * est - hi)), 4),
            "high": round(float(min(1.0, 2 * est - lo)), 4), "categories": k}


def halves(masses: Mapping[Any, float]) -> tuple[set[Any], float, float]:
    """Two halves of the outcomes as balanced as their masses allow: the heavier half's members, its mass and the
    lighter half's."""
    heavy: set[Any] = set()
    m_heavy = m_light = 0.0
    for key, m in sorted(masses.items(), key=lambda kv: (-kv[1], repr(kv[0]))):
        if m_heavy <= m_light:
            heavy.add(key)
            m_heavy += m
        else:
            m_light += m
    if m_light > m_heavy:
        heavy = set(masses) - heavy
        m_heavy, m_light = m_light, m_heavy
    return heavy, m_heavy, m_light


POOLED = ("pooled",)


def departure(outcomes: Sequence[tuple[int, ...]], tv: float, where: str,
              drawn: int) -> tuple[np.ndarray | None, float]:
    """Weights over `outcomes` (one sample's first m tokens each, drawn alike) that move the distribution of their
    categories (those the test keeps when it sees `drawn` samples: expected count at least MIN_CATEGORY, the rest
    pooled) by `tv`, the least detectable way: mass moved proportionally from the heavier of two balanced halves to
    the lighter, at the first token (halves of whole first tokens) or at the later ones (each first token's
    continuations split; the first token's distribution unchanged). (None, the largest distance such a departure
    reaches among these outcomes) where `tv` is beyond it."""
    n = len(outcomes)
    seen = Counter(outcomes)
    cat = [c if seen[c] * drawn / n >= MIN_CATEGORY else POOLED for c in outcomes]
    mass: Counter = Counter()
    for c in cat:
        mass[c] += 1 / n

    def group(c: tuple) -> tuple:
        return c if c == POOLED else c[:1]
    scale: dict[Any, float] = {}
    if where == "first":
        groups: Counter = Counter()
        for c, m in mass.items():
            groups[group(c)] += m
        if len(groups) < 2:
            return None, 0.0
        heavy, m_heavy, m_light = halves(groups)
        if tv > m_heavy:
            return None, m_heavy
        scale = {c: 1 - tv / m_heavy if group(c) in heavy else 1 + tv / m_light for c in mass}
    else:
        within: dict[Any, dict[Any, float]] = {}
        for c, m in mass.items():
            within.setdefault(group(c), {})[c] = m
        splits = {g: halves(d) for g, d in within.items() if len(d) >= 2}
        reach = sum(m_heavy for _, m_heavy, _ in splits.values())
        if not splits or tv > reach:
            return None, reach
        for g, (heavy, m_heavy, m_light) in splits.items():
            share = tv * m_heavy / reach
            for c in within[g]:
                scale[c] = 1 - share / m_heavy if c in heavy else 1 + share / m_light
    w = np.array([scale.get(c, 1.0) for c in cat])
    return w / w.sum(), tv


def _chi_square_power(codes: np.ndarray, weights: np.ndarray, n_a: int, n_b: int, level: float,
                      u_a: np.ndarray, idx_b: np.ndarray) -> float:
    """The share of draws (one per row of u_a, idx_b: common random numbers) in which the first-tokens test, its
    rare categories pooled as the kit pools them, rejects at `level` (the chi-square distribution's p-value)."""
    c = int(codes.max()) + 1
    draws = len(u_a)
    idx_a = np.minimum(np.searchsorted(np.cumsum(weights), u_a), len(weights) - 1)

    def counts(idx: np.ndarray) -> np.ndarray:
        flat = (codes[idx] + c * np.arange(draws)[:, None]).ravel()
        return np.bincount(flat, minlength=c * draws).reshape(draws, c).astype(float)
    a, b = counts(idx_a), counts(idx_b)
    kept = (a + b) >= MIN_CATEGORY
    a = np.concatenate([np.where(kept, a, 0), (a * ~kept).sum(axis=1, keepdims=True)], axis=1)
    b = np.concatenate([np.where(kept, b, 0), (b * ~kept).sum(axis=1, keepdims=True)], axis=1)
    totals = a + b
    present = totals > 0
    k = present.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ea, eb = totals * n_a / (n_a + n_b), totals * n_b / (n_a + n_b)
        stat = np.where(present, (a - ea) ** 2 / ea + (b - eb) ** 2 / eb, 0.0).sum(axis=1)
    p = sps.chi2.sf(stat, np.maximum(k - 1, 1))
    return float(np.mean((k >= 2) & (p <= level)))


#: Draws per distance when the detectable distance is simulated (the power found to about ±1.3 points).
DETECT_DRAWS = 1000


def _two_halves_tv(n_a: int, n_b: int, family: int) -> float:
    """The two-proportion bound: mass moved between two equal halves, found with POWER at alpha / family."""
    z = sps.norm.ppf(1 - ALPHA / (2 * max(1, family))) + sps.norm.ppf(POWER)
    return round(float(min(1.0, z * np.sqrt(0.25 * (1 / n_a + 1 / n_b)))), 4)


@functools.lru_cache(maxsize=1024)
def detectable_tv(outcomes: tuple[tuple[int, ...], ...], n_a: int, family: int) -> float:
    """The smallest total-variation distance between the categories the first-tokens test tells apart that n_a
    samples against these reference `outcomes` (each sample's first m tokens) detect with POWER at the family's
    strictest level (Holm's first step, alpha / tests), for both least detectable departures (`departure`: at the
    first token and at later ones; the larger figure). Simulated: DETECT_DRAWS draws from the reference reweighted
    (and from the reference itself), pooled and tested as the kit tests them; where one departure is found less often
    than that even at the largest distance these outcomes allow it, just above that distance (none farther exists
    of its shape). Reference outcomes all alike leave no halves: the two-proportion bound (mass moved onto other
    outcomes, two categories). Seeded by the outcomes: the same samples give the same figure.
    bench/distribution_calibration.py checks it with the kit's permutation tests."""
    n_b = len(outcomes)
    level = ALPHA / max(1, family)
    distinct = {c: i for i, c in enumerate(sorted(set(outcomes)))}
    codes = np.array([distinct[c] for c in outcomes], dtype=np.int64)
    rng = row_rng("detectable", repr(outcomes), str(n_a))
    u_a = rng.random((DETECT_DRAWS, n_a))
    idx_b = rng.integers(0, n_b, (DETECT_DRAWS, n_b))
    found = []
    for where in ("first", "later"):
        _, reach = departure(outcomes, 1.0, where, n_a + n_b)
        if reach <= 0:
            continue

        def power(tv: float, where: str = where) -> float:
            w, _ = departure(outcomes, tv, where, n_a + n_b)
            return 0.0 if w is None else _chi_square_power(codes, w, n_a, n_b, level, u_a, idx_b)
        if power(reach) < POWER:  # found less often than POWER however far it goes: none farther exists
            found.append(round(reach, 4) + 1e-4)
            continue
        lo, hi = 0.0, reach
        for _ in range(14):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if power(mid) >= POWER else (mid, hi)
        found.append(hi)
    if not found:
        return _two_halves_tv(n_a, n_b, family)
    return round(float(min(1.0, max(found))), 4)


def row_rng(*key: str) -> np.random.Generator:
    """A generator seeded by what is being compared: the same run folder gives the same p-values every time."""
    return np.random.default_rng(int.from_bytes(hashlib.sha256("\0".join(key).encode()).digest()[:8], "big"))


@dataclass
class Comparison:
    """One row's stage 2 before the family is judged: its tests (name, statistic, p or None and why)."""

    tests: list[shapes.TwoSampleTest] = field(default_factory=list)
    tv: shapes.TotalVariation | None = None


def two_sample(a: Sequence[Sample], b: Sequence[Sample], prefix: int, rng: np.random.Generator,
               logprobs_a: Sequence[float | None] | None = None, count: int = PERMUTATIONS,
               labellings: np.ndarray | None = None) -> Comparison:
    """Stage 2 for one row: sample A (a strategy, the control, the baseline's A/A arm) against the reference, with
    `count` relabellings (or the `labellings` given: those drawn from the same generator for another row)."""
    n_a = len(a)
    m = permutations(n_a, len(b), rng, count) if labellings is None else labellings
    out = Comparison()
    firsts = [s.tokens[:1] for s in [*a, *b]]
    prefixes = [s.tokens[:prefix] for s in [*a, *b]]
    for name, values in (("first token", firsts), ("first tokens", prefixes)):
        codes, k, kept = pooled_codes(values[:n_a], values[n_a:])
        p = p_value(chi_square(codes, k)(m)) if k > 1 else 1.0
        out.tests.append({"name": name, "p": p, "categories": k, "note": None if k > 1 else
                          "one category: every sample the same or too rare to tell apart"})
        if name == "first tokens":
            out.tv = total_variation(codes, k, n_a, rng)
    out.tests.append({"name": "every position", "p": p_value(hamming_mmd([s.tokens for s in [*a, *b]])(m)),
                      "categories": None, "note": None})
    lps_a = list(logprobs_a) if logprobs_a is not None else [s.logprob for s in a]
    lps_b = [s.logprob for s in b]
    if None in lps_a or None in lps_b:
        out.tests.append({"name": "log-probability", "p": None, "categories": None, "note": None})
    else:
        out.tests.append({"name": "log-probability", "p": p_value(kolmogorov_smirnov([*lps_a, *lps_b])(m)),
                          "categories": None, "note": None})
    return out


# ---------------------------------------------------------------- the table


def _rows(study: StudyMeta, records: BatchIndex, host: str, task: str, prompt: str,
          args: Mapping[str, tuple[str, Sequence[str]]], count: int) -> list[shapes.StudyRow]:
    """The rows of one prompt on one host before the family is judged: each strategy against its baseline, the
    baseline's A/A row and its control, for every baseline of the study; `count` relabellings per test."""
    arms = study.arms
    by_base: dict[str, list] = {}
    for a in arms:
        by_base.setdefault(a.baseline, []).append(a)
    rows = []
    drawn: dict[tuple[int, int], tuple[np.ndarray, dict]] = {}  # (n_a, n_b) -> relabellings, generator after them
    for base in [a for a in arms if a.role == "baseline"]:
        mine = by_base.get(base.id, [])
        got = {a.id: arm_samples(records, host, a.id, task, prompt) for a in mine}
        ref_id = next((a.id for a in mine if a.role == "reference"), None)
        if ref_id is None:  # refused with run.json (harness/store/plan_check.py); never a traceback here
            continue
        ref = list(got[ref_id].values())
        others = [a for a in mine if a.role == "strategy"] + [base] + [a for a in mine if a.role == "control"]
        for a in others:
            samples = list(got[a.id].values())
            kind = {"strategy": "strategy", "baseline": "aa", "control": "control"}[a.role]
            row: shapes.StudyRow = {"host": host, "task": task, "prompt": prompt, "arm": a.id,
                                   "strategy": a.strategy, "kind": kind, "vs": ref_id, "baseline": base.id,
                                   "samples": len(samples), "reference_samples": len(ref), "stage1": None,
                                   "verification": None, "drafted": None}
            lps = None
            if kind == "strategy":
                spec_type, strategy_args = args[a.strategy]
                row["verification"] = verification(spec_type, strategy_args)
                row["spec_type"] = spec_type
                row["drafted"] = sum(s.drafted for s in samples)
                row["stage1"] = seeded_equality(got[base.id], got[a.id])
                paired = got[base.id]
                lps = [paired[s.seed].logprob if s.seed in paired and paired[s.seed].tokens == s.tokens else None
                       for s in samples]
            if len(samples) >= 2 and len(ref) >= 2:
                # the same relabellings for every row of a prompt: identical samples give identical p-values
                # the same relabellings for every row of a prompt: drawn once per sample sizes, the generator then
                # where the row's first draw would leave it
                rng = row_rng(host, task, prompt)
                size = (len(samples), len(ref))
                if size not in drawn:
                    drawn[size] = (permutations(*size, rng, count), rng.bit_generator.state)
                rng.bit_generator.state = drawn[size][1]
                cmp = two_sample(samples, ref, study.settings.prefix, rng, lps, count, drawn[size][0])
                row["tests"], row["tv"] = cmp.tests, cmp.tv
                data = _fingerprint(host, task, prompt, ref_id, samples, lps)
                for test in cmp.tests:
                    test["data"] = f"{data}:{test['name']}"
                if kind == "strategy" and None in lps:
                    left = sum(x is None for x in lps)
                    cmp.tests[-1]["note"] = (f"{left} of {len(lps)} samples left the baseline's path: not run, as no "
                                             "server can score them (a drafting server reports no "
                                             "log-probabilities, and llama-server scores no given tokens: its "
                                             "/v1/completions refuses echo)")
            else:
                row["tests"], row["tv"] = [], None
            rows.append(row)
    return rows


def _row_sizes(study: StudyMeta, index: BatchIndex, hosts: Sequence[str]) -> list[int]:
    """How many samples each row of the table compares (its own and its reference's), from the ok batches."""
    drawn = {k: sum(len(r["samples"]) for r in recs if r["status"] == "ok") for k, recs in index.items()}
    sizes = []
    for host in hosts:
        for task, prompt in study.settings.prompts:
            for a in study.arms:
                if a.role != "reference":
                    ref = f"{a.baseline}@reference"
                    sizes.append(drawn.get((host, a.id, task, prompt), 0) + drawn.get((host, ref, task, prompt), 0))
    return sizes


def _fingerprint(host: str, task: str, prompt: str, ref: str, samples: Sequence[Sample],
                 logprobs: Sequence[float | None] | None) -> str:
    """What a row's tests compare: its samples (tokens, and the log-probabilities it is judged with) against a
    reference. Rows with the same fingerprint (a strategy whose every sample is the baseline's) run the same tests
    on the same data: the family counts them once."""
    lps = list(logprobs) if logprobs is not None else [s.logprob for s in samples]
    blob = repr((host, task, prompt, ref, [s.tokens for s in samples], lps))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _judge(rows: list[shapes.StudyRow],
           references: Mapping[tuple[str, str, str, str], tuple[tuple[int, ...], ...]]) -> int:
    """Holm's procedure over the table's distinct tests (rows that compare the same samples with the same reference
    share theirs); each row's verdict and detectable distance (against its reference's outcomes: `references`, by
    host, task, prompt and reference arm, each sample's first m tokens). Returns the family's size."""
    tests = [t for r in rows for t in r["tests"] if t["p"] is not None]
    distinct: dict[str, float] = {}
    for t in tests:
        distinct.setdefault(t["data"], t["p"])
    adjusted = dict(zip(distinct, inf.holm_adjusted(list(distinct.values())), strict=True))
    for t in tests:
        t["p_adjusted"] = round(adjusted[t["data"]], 6)
        t["rejected"] = adjusted[t["data"]] <= ALPHA
        t["p"] = round(t["p"], 6)
    for r in rows:
        for t in r["tests"]:
            t.pop("data", None)
    for r in rows:
        judged = [t for t in r["tests"] if t["p"] is not None]
        for t in r["tests"]:
            t.setdefault("p_adjusted", None)
            t.setdefault("rejected", None)
        r["p_adjusted"] = min((t["p_adjusted"] for t in judged), default=None)
        differs = any(t["rejected"] for t in judged)
        r["verdict"] = "not tested" if not judged else "differs" if differs else "no difference detected"
        outcomes = references.get((r["host"], r["task"], r["prompt"], r["vs"]))
        r["detectable_tv"] = (detectable_tv(outcomes, r["samples"], len(distinct))
                              if judged and outcomes else None)
    return len(distinct)


def summary(study: StudyMeta | None, records: Sequence[result.BatchRecord], hosts: Sequence[str],
            args: Mapping[str, tuple[str, Sequence[str]]]) -> shapes.StudySummary | None:
    """The study's table: per host, prompt and strategy the two stages, the A/A and control rows, judged as one
    family; None for a run without a sampling study. `args` gives each strategy's spec type and flags."""
    if not study:
        return None
    index = batch_index(records)
    count = permutation_count(_row_sizes(study, index, hosts))
    rows = [r for host in hosts for task, prompt in study.settings.prompts
            for r in _rows(study, index, host, task, prompt, args, count)]
    m = study.settings.prefix
    references = {(host, task, prompt, ref): tuple(x.tokens[:m] for x in arm_samples(index, host, ref, task,
                                                                                      prompt).values())
                  for host, task, prompt, ref in {(r["host"], r["task"], r["prompt"], r["vs"]) for r in rows}}
    family = _judge(rows, references)
    controls = [r for r in rows if r["kind"] == "control" and r["verdict"] != "not tested"]
    ok = [r for r in records if r["status"] == "ok"]
    recorded = study.to_json()
    settings = shapes.StudySettings(temperature=recorded["temperature"], top_k=recorded["top_k"],
                                    samples=recorded["samples"], tokens=recorded["tokens"], prefix=recorded["prefix"],
                                    batch=recorded["batch"], seed=recorded["seed"], control=recorded["control"])
    return {"settings": settings,
            "rows": rows, "family": {"tests": family, "method": "holm", "alpha": ALPHA,
                                     "permutations": count},
            "power": all(r["verdict"] == "differs" for r in controls) if controls else None,
            "batches": {"planned": study.batches, "ok": len(ok), "failed": len(records) - len(ok)},
            "samples": sum(len(r["samples"]) for r in ok),
            "tokens": sum(len(s["tokens"]) for r in ok for s in r["samples"])}


def compare(a: shapes.StudySummary | None, b: shapes.StudySummary | None,
            to_a: Mapping[str, str]) -> shapes.StudyComparison | None:
    """Two runs' distribution verdicts row by row (B's hosts named as A's by `to_a`): which stayed, which changed.
    None when neither run drew a sampling study."""
    if not a and not b:
        return None
    if not a or not b:
        return {"only": "A" if a else "B", "rows": [], "changed": 0, "same": 0}
    rows_a = {(r["host"], r["task"], r["prompt"], r["arm"]): r for r in a["rows"]}
    rows = []
    missing: list[shapes.OneSideRow] = []
    matched: set[tuple[str, str, str, str]] = set()
    for r in b["rows"]:
        key = (to_a.get(r["host"], r["host"]), r["task"], r["prompt"], r["arm"])
        ra = rows_a.get(key)
        if ra is not None:
            matched.add(key)
            rows.append({"host": ra["host"], "task": r["task"], "prompt": r["prompt"], "arm": r["arm"],
                         "kind": r["kind"], "a": ra["verdict"], "b": r["verdict"], "p_adjusted_b": r["p_adjusted"],
                         "changed": ra["verdict"] != r["verdict"]})
        else:
            missing.append({"side": "B", "host": r["host"], "task": r["task"], "prompt": r["prompt"],
                            "arm": r["arm"], "verdict": r["verdict"]})
    missing[:0] = [{"side": "A", "host": k[0], "task": k[1], "prompt": k[2], "arm": k[3], "verdict": r["verdict"]}
                   for k, r in rows_a.items() if k not in matched]
    return {"only": None, "settings_a": a["settings"], "settings_b": b["settings"], "rows": rows,
            "changed": sum(r["changed"] for r in rows), "same": sum(not r["changed"] for r in rows),
            "missing": missing}
