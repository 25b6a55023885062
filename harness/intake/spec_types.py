"""Every `llama-server --spec-type` the kit measures, one row each: whether it reads a drafter file and of what
architecture and flavours, how its drafter runs (sequential or block), whether it needs an MTP target, which
llama-server flags select or tune it. Every rule that depends on the type reads its row: the manifest check
(a draft model or none), the allowed flags (harness/intake/flags.py), the pre-flight (harness/models/preflight.py),
the bytes one pass reads (harness/models/passbytes.py), the plan and the summary.

A new spec type: one row here and its name in the `spec_type` enum of schemas/manifest.schema.json (a test holds
the two together)."""

from __future__ import annotations

from dataclasses import dataclass

from harness import KitError

#: llama-server's synthetic acceptance flags (harness/intake/breakeven.py).
SYNTH_FLAGS = ("--spec-synth-len", "--spec-synth-rates")

#: How a drafter runs, for the bytes one target pass reads: once per drafted token, or once per draft call.
SEQUENTIAL, BLOCK = "sequential", "block"


@dataclass(frozen=True)
class SpecType:
    """One `--spec-type` and what the kit asks of it."""

    name: str
    #: It speculates: a strategy of it pairs with a baseline (the one type that does not is `none`).
    speculative: bool = True
    #: It reads a drafter file (`-md`); the others take none.
    draft_file: bool = False
    #: The drafter file's architecture when it reads the target's hidden states (dflash, eagle3); None for a
    #: drafter that is a language model of its own (draft-simple), or no file.
    drafter_arch: str | None = None
    #: The loader flavours it runs (harness/models/preflight.py FLAVOURS): its drafter file's, or, without a file,
    #: what the image's llama.cpp must know for it.
    flavours: tuple[str, ...] = ()
    #: How its drafter runs (SEQUENTIAL: per drafted token; BLOCK: per draft call); None where no model drafts.
    drafting: str | None = None
    #: It drafts with the target's own NextN (MTP) block: the target must have one, and a pass reads that block.
    mtp_target: bool = False
    #: llama-server flags that select this type themselves (reserved: the kit sets the type).
    selecting_flags: tuple[str, ...] = ()
    #: llama-server flags (one value each) that tune only this type; a manifest may pass and sweep them.
    tuning_flags: tuple[str, ...] = ()
    #: With `--spec-draft-sampling probabilistic` its drafts are sampled and verified by rejection sampling at a
    #: temperature above 0 (else taken greedily and verified by exact match): the sampling study's stage 1.
    rejection: bool = False

    @property
    def language_model_draft(self) -> bool:
        """Its drafter is a language model of its own (not a file that reads the target's states)."""
        return self.draft_file and self.drafter_arch is None


def _ngram(name: str, *params: str, selecting: tuple[str, ...] = ()) -> SpecType:
    return SpecType(name, selecting_flags=selecting, tuning_flags=tuple(f"--spec-{name}-{p}" for p in params))


#: In the order of the schema's enum.
SPEC_TYPES: tuple[SpecType, ...] = (
    SpecType("none", speculative=False),
    SpecType("draft-simple", draft_file=True, drafting=SEQUENTIAL, rejection=True),
    SpecType("draft-eagle3", draft_file=True, drafter_arch="eagle3", flavours=("eagle3",), drafting=SEQUENTIAL,
             selecting_flags=("--eagle3",)),
    SpecType("draft-mtp", flavours=("mtp",), drafting=SEQUENTIAL, mtp_target=True, selecting_flags=("--mtp",),
             rejection=True),
    SpecType("draft-dflash", draft_file=True, drafter_arch="dflash", flavours=("dflash1", "dflash2"),
             drafting=BLOCK, selecting_flags=("--dflash",)),
    SpecType("draft-dspark", draft_file=True, drafter_arch="dflash", flavours=("dspark",), drafting=BLOCK),
    _ngram("ngram-simple", "size-n", "size-m", "min-hits"),
    _ngram("ngram-map-k", "size-n", "size-m", "min-hits"),
    _ngram("ngram-map-k4v", "size-n", "size-m", "min-hits"),
    # --spec-default turns on ngram-mod with its default sizes
    _ngram("ngram-mod", "n-min", "n-max", "n-match", selecting=("--spec-default",)),
    SpecType("ngram-cache"),
)


def names() -> list[str]:
    return [t.name for t in SPEC_TYPES]


def find(name: str) -> SpecType | None:
    """The row of a spec type, None for one this kit does not know (a run folder may come from a later kit)."""
    return next((t for t in SPEC_TYPES if t.name == name), None)


def get(name: str) -> SpecType:
    """The row of a spec type; a KitError for a name that is none (the schema refuses those first)."""
    row = find(name)
    if row is None:
        raise KitError(f"spec type {name!r} is not one of {names()}")
    return row


def is_speculative(name: str) -> bool:
    """Whether a strategy of this type speculates; one this kit does not know is taken to."""
    row = find(name)
    return row.speculative if row is not None else True


def for_flavour(flavour: str) -> SpecType | None:
    """The type that runs a drafter of this flavour (the first in the table's order)."""
    return next((t for t in SPEC_TYPES if flavour in t.flavours), None)


def reading(arch: str) -> list[SpecType]:
    """The types whose drafter file has this architecture."""
    return [t for t in SPEC_TYPES if t.drafter_arch == arch]


class StrategyFields:
    """What a strategy's fields say, whichever side holds them: the manifest's `Strategy` and run.json's
    `StrategyMeta` (harness/store/runmeta.py) both have an id, a spec type and the entry they were expanded from."""

    id: str
    spec_type: str
    family: str | None
    args: tuple[str, ...]

    @property
    def speculative(self) -> bool:
        return is_speculative(self.spec_type)

    @property
    def synthetic(self) -> bool:
        """It runs at synthetic acceptance (`--spec-synth-len` / `--spec-synth-rates`, benchmarking only: its output
        is not valid): a point of its entry's break-even curve, never a speedup, a geometric mean or a lossless
        check."""
        return any(a in SYNTH_FLAGS for a in self.args)

    @property
    def family_id(self) -> str:
        """The manifest entry's id: the same for every combination and level of a sweep."""
        return self.family or self.id
