"""A strategy's `breakeven:` block: the strategy measured at synthetic acceptance, to find the acceptance it needs
to pay on this machine (harness/analysis/breakeven.py).

llama-server b11434 has `--spec-synth-len L` (a mean acceptance length per verification step, the target's own
token included, within [1, n_max + 1]) and `--spec-synth-rates P0,P1,...` (exactly n_max per-position acceptance
probabilities, non-increasing, within [0, 1]); they exclude each other ("benchmarking only": the drafter runs and
costs what it costs, acceptance follows the given law, the output is not valid). A block gives lengths or rate
lists, not both; each value becomes a strategy of its own beside the entry, named `<id>[synth-len=1.5]` or
`<id>[synth-rates=0.9,0.8,0.7]`, measured in fresh containers in the same rounds as the baseline it pairs with,
like a sweep's combinations (harness/intake/sweep.py); the kit checks the values against the build's rules here,
before any container starts.

n_max is what the build's defaults and the strategy's arguments give (b11434 common/common.h, common/speculative.cpp
`common_speculative_n_max`): drafter types `--spec-draft-n-max` (3), ngram-simple / map-k / map-k4v their
`--spec-<type>-size-m` (48), ngram-mod `--spec-ngram-mod-n-max` (64), ngram-cache 8. An implementation may lower it
(DFlash to its block size - 1); the server then refuses a length above the lower n_max + 1 at start-up, and the
measurement records why."""

from __future__ import annotations

import math
from typing import Any

from harness.intake import flags, spec_types

SYNTH_FLAGS = spec_types.SYNTH_FLAGS
LENGTH_FLAG, RATES_FLAG = SYNTH_FLAGS
#: What every figure of a synthetic strategy is labelled with.
LABEL = "synthetic acceptance (benchmarking only)"

#: The pinned build's n_max per spec type: the flag that sets it and its default.
N_MAX: dict[str, tuple[str | None, int]] = {
    "draft-simple": ("--spec-draft-n-max", 3), "draft-eagle3": ("--spec-draft-n-max", 3),
    "draft-mtp": ("--spec-draft-n-max", 3), "draft-dflash": ("--spec-draft-n-max", 3),
    "draft-dspark": ("--spec-draft-n-max", 3),
    "ngram-simple": ("--spec-ngram-simple-size-m", 48), "ngram-map-k": ("--spec-ngram-map-k-size-m", 48),
    "ngram-map-k4v": ("--spec-ngram-map-k4v-size-m", 48), "ngram-mod": ("--spec-ngram-mod-n-max", 64),
    "ngram-cache": (None, 8),
}


class BreakevenError(ValueError):
    """A breakeven block that cannot be measured; `field` is the path below the strategy, the message one line."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def n_max(spec_type: str, args: tuple[str, ...], server_args: tuple[str, ...]) -> int:
    """The most tokens one draft call drafts, as the build reads the strategy's arguments (its own after the
    manifest's: llama-server keeps the last)."""
    flag, default = N_MAX.get(spec_type, (None, 0))
    if flag is None:
        return default
    canon = flags.canonical(list(server_args) + list(args))
    given = [canon[i + 1] for i in range(len(canon) - 1) if flags.option(canon[i]) == flag]
    if not given:
        return default
    text = given[-1]
    if not (text.isascii() and text.isdigit()):
        raise BreakevenError("breakeven", f"{flag} {text!r}: expected a whole number to bound synthetic acceptance")
    return int(text)


def number_text(x: float) -> str:
    """A value as it goes to llama-server and into the strategy's name: 2 -> '2', 1.5 -> '1.5'."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def values(raw: dict[str, Any], spec_type: str, args: tuple[str, ...],
           server_args: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (flag, value) of each synthetic strategy a schema-checked block asks for, in its order; BreakevenError on
    the first value the build would refuse."""
    if not spec_types.get(spec_type).speculative:
        raise BreakevenError("breakeven", "a baseline (spec_type none) drafts nothing; give breakeven on a "
                             "speculative strategy")
    if ("lengths" in raw) == ("rates" in raw):  # `at` (a swept entry's combination) is harness/intake/sweep.py's
        raise BreakevenError("breakeven", "expected exactly one of lengths or rates (llama-server takes "
                             f"{LENGTH_FLAG} or {RATES_FLAG}, not both)")
    n = n_max(spec_type, args, server_args)
    if n < 1:
        raise BreakevenError("breakeven", f"n_max is {n}: synthetic acceptance needs at least one drafted token")
    out: list[tuple[str, str]] = []
    if "lengths" in raw:
        for i, x in enumerate(raw["lengths"]):
            if not (isinstance(x, int | float) and math.isfinite(x) and 1 <= x <= n + 1):
                raise BreakevenError(f"breakeven.lengths[{i}]", f"{x!r} is outside [1, {n + 1}] (n_max {n} + 1, the "
                                     "target's token included)")
            out.append((LENGTH_FLAG, number_text(x)))
    else:
        for i, rates in enumerate(raw["rates"]):
            if len(rates) != n:
                raise BreakevenError(f"breakeven.rates[{i}]", f"{len(rates)} values; the build takes exactly n_max = "
                                     f"{n} (one per draft position)")
            for k, p in enumerate(rates):
                if not (isinstance(p, int | float) and math.isfinite(p) and 0 <= p <= 1):
                    raise BreakevenError(f"breakeven.rates[{i}][{k}]", f"{p!r} is outside [0, 1]")
                if k and p > rates[k - 1]:
                    raise BreakevenError(f"breakeven.rates[{i}][{k}]", f"{p!r} is above the position before it "
                                         f"({rates[k - 1]!r}); rates must be non-increasing")
            out.append((RATES_FLAG, ",".join(number_text(p) for p in rates)))
    texts = [v for _, v in out]
    dup = next((v for i, v in enumerate(texts) if v in texts[:i]), None)
    if dup is not None:
        raise BreakevenError("breakeven", f"{dup!r} is given twice")
    return out


def length_of(flag: str, value: str) -> float:
    """The mean acceptance length a synthetic setting asks for: the length itself, or from the rates (each rate the
    unconditional share of steps that accept at that position: 1 + their sum)."""
    if flag == LENGTH_FLAG:
        return float(value)
    return 1 + sum(float(p) for p in value.split(","))


def setting(args: tuple[str, ...] | list[str]) -> tuple[str, str] | None:
    """The synthetic setting (flag, value) a strategy's arguments carry, None for a real one."""
    for i, a in enumerate(args[:-1]):
        if a in SYNTH_FLAGS:
            return a, args[i + 1]
    return None
