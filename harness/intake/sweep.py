"""A manifest's strategy entries as strategies, sweeps and concurrency levels expanded: one entry with
`sweep: {flag: [values]}` and/or `parallel: [N, ...]` becomes one strategy per combination, each measured like any
other (fresh container each, rounds, pairing).

A combination is named by its values: `draft-simple[p-min=0.75,n-max=8]`. Of a list of concurrency levels, each
level above 1 adds `parallel=N` (`baseline[parallel=4]`) and level 1 keeps the plain name, so the single-stream
strategy is the one other strategies pair with; one level (`parallel: N`) keeps the plain name too. Only flags of
the allow-list (harness/intake/flags.py) that take one value may be swept; the schema bounds how many flags,
values and levels, and this module bounds the combinations."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from harness.intake import breakeven, flags, spec_types
from harness.intake.bounded_yaml import ManifestError

#: Combinations of one strategy's sweep (values multiplied), before concurrency levels.
MAX_COMBINATIONS = 32
#: Strategies of a whole manifest after expansion.
MAX_EXPANDED = 256
#: A combination's name (its family id, the values, the level) in characters.
MAX_ID_LENGTH = 200
#: The most server slots (concurrent clients) a strategy may have: the schema's bound on `parallel`.
MAX_SLOTS = 64


@dataclass(frozen=True)
class Expanded:
    """One strategy of an expanded entry: its id, the (flag, value) pairs it adds, and its concurrency level."""

    id: str
    sweep: tuple[tuple[str, str], ...]
    parallel: int
    #: Arguments it adds that are not a swept value: a synthetic acceptance setting (harness/intake/breakeven.py).
    extra: tuple[str, ...] = ()


class SweepError(ValueError):
    """A sweep that cannot be expanded; `field` is the field path below the strategy, `message` what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def value_text(value: Any) -> str:
    """A swept value as llama-server reads it: 8 -> '8', 0.75 -> '0.75', 'q8_0' -> 'q8_0'."""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def short_names(swept: list[str]) -> dict[str, str]:
    """Each flag's name inside a combination's id: its last two words (`--spec-draft-p-min` -> `p-min`), or the
    whole flag without dashes where two flags of the sweep would share the short name."""
    def short(flag: str) -> str:
        return "-".join(flag.lstrip("-").split("-")[-2:])
    shorts = [short(f) for f in swept]
    return {f: (s if shorts.count(s) == 1 else f.lstrip("-")) for f, s in zip(swept, shorts, strict=True)}


def check_flag(flag: str, args: tuple[str, ...], server_args: tuple[str, ...]) -> str | None:
    """Why a flag cannot be swept (None when it can): only allowed flags that take one value, not the slot count
    (that is `parallel`), and not one the strategy or the manifest already gives (which value would win?)."""
    name, inline = flags.normalise(flag)
    if inline is not None or name != flag:
        return f"{flag!r}: expected a flag as llama-server spells it (dashes, no value)"
    if name in flags.RESERVED:
        return f"{flag!r} cannot be swept: {flags.RESERVED[name]}"
    if flags.option(name) == "--parallel":
        return "give concurrency levels with parallel: [1, 2, 4], not as a swept flag"
    if flags.ALLOWED.get(name) != 1:
        return (f"{flag!r} is not an allowed llama-server flag that takes a value (see harness/intake/flags.py)"
                if name not in flags.ALLOWED else f"{flag!r} takes no value: nothing to sweep")
    for where, given in (("args", args), ("server_args", server_args)):
        same = [a for a in given if flags.option(a) == flags.option(name)]
        if same:
            spelt = "" if flags.normalise(same[0])[0] == name else f" (as {same[0]!r}, the same option)"
            return f"{flag!r} is also given in {where}{spelt}; sweep it or give it there, not both"
    return None


def value_key(text: str) -> object:
    """What makes two swept values one: the number a numeric text stands for ('0.5', '0.50' and '5e-1' are one
    value), else the text itself."""
    try:
        return float(text)
    except ValueError:
        return text


def slots(args: tuple[str, ...] | list[str]) -> str | None:
    """The slot count these arguments give (-np / --parallel, the last one, as llama-server reads them), or None."""
    canon = flags.canonical(args)
    at = [i + 1 for i in range(len(canon) - 1) if flags.option(canon[i]) == "--parallel"]
    return canon[at[-1]] if at else None


def levels(raw: Any) -> list[int]:
    """A strategy's concurrency levels: `parallel: N` or `parallel: [N, ...]` (default 1)."""
    if raw is None:
        return [1]
    return [int(raw)] if isinstance(raw, int) else [int(n) for n in raw]


def expand(sid: str, spec_type: str, raw_sweep: dict[str, list[Any]] | None, raw_parallel: Any,
           args: tuple[str, ...], server_args: tuple[str, ...]) -> list[Expanded]:
    """The strategies one manifest entry stands for, combinations outermost, levels innermost; SweepError on the
    first problem. Without a sweep and with one level it is the entry itself."""
    sweep = raw_sweep or {}
    if sweep and not spec_types.get(spec_type).speculative:
        raise SweepError("sweep", "a baseline (spec_type none) is the reference every combination pairs with; "
                         "sweep a speculative strategy")
    seen: dict[str, str] = {}
    for flag in sweep:
        problem = check_flag(flag, args, server_args)
        if problem is not None:
            raise SweepError(f"sweep.{flag}", problem)
        other = seen.setdefault(flags.option(flag), flag)
        if other != flag:
            raise SweepError(f"sweep.{flag}", f"{flag!r} and {other!r} are one llama-server option; sweep it once")
    combos = 1
    for values in sweep.values():
        combos *= len(values)
    if combos > MAX_COMBINATIONS:
        sizes = " x ".join(str(len(v)) for v in sweep.values())
        raise SweepError("sweep", f"{sizes} = {combos} combinations; at most {MAX_COMBINATIONS}")
    texts = {f: [value_text(v) for v in vs] for f, vs in sweep.items()}
    for f, vs in texts.items():
        for v in vs:
            refused = flags.check([f, v])
            if refused is not None:
                raise SweepError(f"sweep.{f}", refused.message)
        keys = [value_key(v) for v in vs]
        if len(set(keys)) != len(keys):
            a, b = next((x, y) for i, x in enumerate(vs) for y in vs[i + 1:] if value_key(x) == value_key(y))
            raise SweepError(f"sweep.{f}", f"values {a!r} and {b!r} are one value as llama-server reads them")
    ns = levels(raw_parallel)
    names = short_names(list(sweep))
    out = []
    for combo in itertools.product(*[[(f, v) for v in vs] for f, vs in texts.items()]):
        for n in ns:
            # one level (`parallel: N`, as before lists) keeps the plain name; of several, level 1 does
            parts = [f"{names[f]}={v}" for f, v in combo] + ([f"parallel={n}"] if n != 1 and len(ns) > 1 else [])
            eid = f"{sid}[{','.join(parts)}]" if parts else sid
            if len(eid) > MAX_ID_LENGTH:
                raise SweepError("sweep", f"the combination name {eid[:60]!r}... is longer than {MAX_ID_LENGTH} "
                                 "characters; shorter values or fewer flags")
            out.append(Expanded(eid, tuple(combo), n))
    return out


def entry(raw: dict[str, Any], args: tuple[str, ...], manifest: dict[str, Any], where: str,
          before: int, copies: int = 1) -> list[Expanded]:
    """One schema-checked strategy entry of a manifest (its `args` already allowed; `before` strategies expanded
    ahead of it) as the strategies it stands for; ManifestError naming `where` and the field below the entry on the
    first problem: an id given before, slots given in args beside levels, a `baseline` that is no baseline entry, a
    sweep that cannot be expanded, too many strategies in all."""
    try:
        ids = [e["id"] for e in manifest["strategies"]]
        if manifest["strategies"][ids.index(raw["id"])] is not raw:  # combinations are named after their entry
            raise SweepError("id", f"duplicate id {raw['id']!r} (also strategies[{ids.index(raw['id'])}])")
        if "parallel" in raw and slots(args) is not None:
            raise SweepError("args", "give the number of slots with parallel, not --parallel in args")
        level = default_level(args, tuple(manifest.get("server_args", ())))
        base = raw.get("baseline")
        kinds = {e["id"]: e["spec_type"] for e in manifest["strategies"]}
        if base is not None and base not in kinds:
            raise SweepError("baseline", f"{base!r} is not a strategy id (expected one of {sorted(kinds)})")
        if base is not None and spec_types.get(kinds[base]).speculative:
            raise SweepError("baseline", f"{base!r} is not a baseline (spec_type {kinds[base]!r}, expected 'none')")
        out = expand(raw["id"], raw["spec_type"], raw.get("sweep"), raw.get("parallel", level), args,
                     tuple(manifest.get("server_args", ())))
        if "breakeven" in raw:
            out += synthetic(raw, out, args, tuple(manifest.get("server_args", ())))
        if before + len(out) * copies > MAX_EXPANDED:  # copies: the entry once per build it runs on
            raise SweepError("id", f"{before + len(out) * copies} strategies once sweeps and levels are expanded"
                             f"{' on each build' if copies > 1 else ''}; at most {MAX_EXPANDED}")
    except SweepError as e:
        raise ManifestError(f"{where}.{e.field}: {e.message}") from None
    return out


def synthetic(raw: dict[str, Any], expanded: list[Expanded], args: tuple[str, ...],
              server_args: tuple[str, ...]) -> list[Expanded]:
    """The synthetic-acceptance strategies of an entry's `breakeven` block, one client each, named after the entry;
    SweepError where the block cannot be measured."""
    if not any(e.parallel == 1 for e in expanded):
        raise SweepError("breakeven", "synthetic acceptance is measured at one client: add 1 to parallel")
    block = raw["breakeven"]
    sweep, at = raw.get("sweep") or {}, block.get("at")
    if sweep and at is None:
        raise SweepError("breakeven", "a swept entry's curve is measured at one combination: give it as at: "
                         "{flag: value} (one value of each swept flag)")
    if at is not None and set(at) != set(sweep):
        raise SweepError("breakeven.at", f"expected one value of each swept flag {sorted(sweep)}, got {sorted(at)}")
    pairs: list[tuple[str, str]] = []
    for f in sweep:
        if value_key(value_text(at[f])) not in [value_key(value_text(v)) for v in sweep[f]]:
            raise SweepError(f"breakeven.at.{f}", f"{at[f]!r} is not one of the swept values {sweep[f]}")
        pairs.append((f, value_text(at[f])))
    try:
        settings = breakeven.values(block, raw["spec_type"], args + sweep_args(Expanded("", tuple(pairs), 1)),
                                    server_args)
    except breakeven.BreakevenError as e:
        raise SweepError(e.field, e.message) from None
    names = short_names(list(sweep))
    out = []
    for flag, value in settings:
        parts = [f"{names[f]}={v}" for f, v in pairs] + [f"{flag.removeprefix('--spec-')}={value}"]
        eid = f"{raw['id']}[{','.join(parts)}]"
        if len(eid) > MAX_ID_LENGTH:
            raise SweepError("breakeven", f"the name {eid[:60]!r}... is longer than {MAX_ID_LENGTH} characters")
        out.append(Expanded(eid, (), 1, sweep_args(Expanded("", tuple(pairs), 1)) + (flag, value)))
    return out


def default_level(args: tuple[str, ...], server_args: tuple[str, ...]) -> int:
    """The concurrency level of an entry without `parallel`: the slots its args give, else the manifest's
    server_args, else 1 (a server of N slots is measured with N clients, never one). SweepError when the count is
    not a whole number of slots within the schema's bound."""
    for where, given in (("args", args), ("server_args", server_args)):
        n = slots(given)
        if n is not None:
            if not (n.isascii() and n.isdigit() and 1 <= int(n) <= MAX_SLOTS):
                raise SweepError(where, f"--parallel {n!r}: expected a whole number of slots from 1 to {MAX_SLOTS}")
            return int(n)
    return 1


def at_level(strategies: list[Any], parallel: int) -> Any:
    """Of some strategies (of one entry, or the baselines of one target), the one at a concurrency level, else
    the first; None when there is none."""
    return next((s for s in strategies if s.parallel == parallel), strategies[0] if strategies else None)


def sweep_args(e: Expanded) -> tuple[str, ...]:
    """The llama-server arguments a combination adds to its strategy's own."""
    return tuple(x for pair in e.sweep for x in pair)
