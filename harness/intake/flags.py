"""llama-server flags a manifest may pass (`server_args`, a strategy's `args`): an allow-list of the flags that
shape a measurement. Everything else is refused: flags the kit sets itself (model, draft, spec type, address),
and flags that read or write files, open listeners or reach other hosts.

llama-server turns `_` into `-` in long flags and keeps the last of repeated flags (`--spec-type` accumulates), so
flags are normalised before they are checked."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.intake import spec_types

#: Flags the kit sets for each strategy; a manifest names the models and the type instead.
RESERVED: dict[str, str] = {
    flag: why
    for why, flags in {
        "the kit sets the target model (models / a strategy's model)": ("-m", "--model", "-mu", "--model-url",
                                                                        "-hf", "-hfr", "--hf-repo", "-hff",
                                                                        "--hf-file"),
        "the kit sets the draft model (a strategy's draft)": ("-md", "--model-draft", "--spec-draft-model",
                                                              "--spec-draft-hf", "-hfd", "-hfrd",
                                                              "--hf-repo-draft"),
        "the kit sets the speculative type (a strategy's spec_type)": (
            "--spec-type", *(f for t in spec_types.SPEC_TYPES for f in t.selecting_flags)),
        "the kit binds the server to 127.0.0.1 on a port of its choosing": ("--host", "--port", "--reuse-port"),
        "the kit sets synthetic acceptance from a strategy's breakeven block (benchmarking only)":
            spec_types.SYNTH_FLAGS,
    }.items()
    for flag in flags
}

#: Allowed flags: name -> number of values it takes (0 or 1). Aliases listed as their own entries.
_ALLOWED_GROUPS: dict[int, tuple[str, ...]] = {
    1: (
        # threads and scheduling
        "-t", "--threads", "-tb", "--threads-batch", "-C", "--cpu-mask", "-Cr", "--cpu-range", "--prio", "--poll",
        "-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch", "--prio-batch", "--poll-batch", "--numa",
        "--threads-http",
        # context, batches, slots, KV cache
        "-c", "--ctx-size", "-b", "--batch-size", "-ub", "--ubatch-size", "--keep", "-np", "--parallel",
        "-ctk", "--cache-type-k", "-ctv", "--cache-type-v", "-dt", "--defrag-thold", "-fa", "--flash-attn",
        "-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", "-cms", "--checkpoint-min-step", "-cram",
        "--cache-ram", "--cache-reuse", "-sps", "--slot-prompt-similarity",
        # placement on devices
        "-ngl", "--gpu-layers", "--n-gpu-layers", "-sm", "--split-mode", "-ts", "--tensor-split", "-mg",
        "--main-gpu", "-dev", "--device", "-ot", "--override-tensor", "-ncmoe", "--n-cpu-moe", "-ncffn",
        "--n-cpu-ffn", "-lm", "--load-mode", "-fit", "--fit", "-fitt", "--fit-target", "-fitc", "--fit-ctx",
        # rope (changes what the model computes, so it is part of the measurement)
        "--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx",
        "--yarn-ext-factor", "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast",
        # sampling defaults (the kit's requests set temperature and seed themselves)
        "-s", "--seed", "--temp", "--temperature", "--top-k", "--top-p", "--min-p", "--samplers",
        "--repeat-last-n", "--repeat-penalty",
        # chat
        "--chat-template", "--reasoning-format", "-rea", "--reasoning", "--reasoning-budget",
        # speculative decoding: the draft's placement and the drafting parameters
        "--spec-draft-threads", "-td", "--threads-draft", "--spec-draft-threads-batch", "-tbd",
        "--threads-batch-draft", "--spec-draft-type-k", "-ctkd", "--cache-type-k-draft", "--spec-draft-type-v",
        "-ctvd", "--cache-type-v-draft", "--spec-draft-override-tensor", "-otd", "--override-tensor-draft",
        "--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft", "--spec-draft-n-max",
        "--spec-draft-n-min", "--spec-draft-p-split", "--draft-p-split", "--spec-draft-p-min", "--draft-p-min",
        "--spec-draft-device", "-devd", "--device-draft", "--spec-draft-ngl", "-ngld", "--gpu-layers-draft",
        "--n-gpu-layers-draft", "--spec-draft-sampling", "--draft", "--draft-n", "--draft-max", "--draft-min",
        "--draft-n-min", "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits",
        # each spec type's own parameters (harness/intake/spec_types.py)
        *(f for t in spec_types.SPEC_TYPES for f in t.tuning_flags),
        # strict CPU placement: `<0|1>` in the pinned build's help (b11434 common/arg.cpp), a value, not a switch
        "--cpu-strict", "--cpu-strict-batch", "--spec-draft-cpu-strict", "--cpu-strict-draft",
        "--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft",
    ),
    0: (
        "--swa-full", "-kvu", "--kv-unified", "-no-kvu", "--no-kv-unified",
        "--cache-idle-slots", "--no-cache-idle-slots", "--context-shift", "--no-context-shift", "--warmup",
        "--no-warmup", "-cb", "--cont-batching", "-nocb", "--no-cont-batching", "-kvo", "--kv-offload", "-nkvo",
        "--no-kv-offload", "--repack", "-nr", "--no-repack", "--no-host", "-cmoe", "--cpu-moe", "--op-offload",
        "--no-op-offload", "--check-tensors", "--jinja", "--no-jinja", "--metrics", "--no-ui", "--no-webui",
        "--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft",
        "--spec-draft-backend-sampling", "--no-spec-draft-backend-sampling", "--perf", "--no-perf",
        "--cache-prompt", "--no-cache-prompt", "--slots", "--no-slots", "--props",
    ),
}
ALLOWED: dict[str, int] = {flag: n for n, flags in _ALLOWED_GROUPS.items() for flag in flags}

#: Flags whose value is `0|1` in the pinned build's help.
_ZERO_OR_ONE = frozenset({"--cpu-strict", "--cpu-strict-batch", "--spec-draft-cpu-strict", "--cpu-strict-draft",
                          "--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"})

#: Flags whose values are themselves flag-like or free text: anything else must not start with '-' unless numeric.
_FREE_VALUES = frozenset({"--samplers", "-ot", "--override-tensor", "-otd", "--override-tensor-draft",
                          "--spec-draft-override-tensor"})
MAX_ARGS = 128
MAX_ARG_LEN = 256


@dataclass(frozen=True)
class FlagError:
    index: int
    message: str


def normalise(token: str) -> tuple[str, str | None]:
    """('--spec_type', None) -> ('--spec-type', None); '--ctx-size=4096' -> ('--ctx-size', '4096')."""
    value = None
    if token.startswith("--") and "=" in token:
        token, value = token.split("=", 1)
    if token.startswith("--"):
        token = token.replace("_", "-")
    return token, value


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def check(args: list[str] | tuple[str, ...]) -> FlagError | None:
    """The first problem of a list of llama-server arguments, or None when every flag is allowed."""
    if len(args) > MAX_ARGS:
        return FlagError(MAX_ARGS, f"{len(args)} arguments; at most {MAX_ARGS}")
    i = 0
    while i < len(args):
        raw = args[i]
        if not isinstance(raw, str) or len(raw) > MAX_ARG_LEN or any(ord(ch) < 32 for ch in raw):
            return FlagError(i, f"{str(raw)[:40]!r}: expected a flag of at most {MAX_ARG_LEN} printable characters")
        flag, inline = normalise(raw)
        if not flag.startswith("-") or _is_number(flag):
            return FlagError(i, f"{raw!r} is not a flag (a value without its flag?)")
        if flag in RESERVED:
            return FlagError(i, f"{raw!r} is not allowed: {RESERVED[flag]}")
        if flag not in ALLOWED:
            return FlagError(i, f"{raw!r} is not an allowed llama-server flag (the kit passes only flags that shape "
                                "the measurement; see harness/intake/flags.py)")
        takes = ALLOWED[flag]
        if takes == 0:
            if inline is not None:
                return FlagError(i, f"{raw!r}: {flag} takes no value")
            i += 1
            continue
        if inline is None:
            if i + 1 >= len(args):
                return FlagError(i, f"{raw!r} expects a value")
            value = args[i + 1]
            step = 2
        else:
            value, step = inline, 1
        if not isinstance(value, str) or len(value) > MAX_ARG_LEN or any(ord(ch) < 32 for ch in value):
            return FlagError(i, f"{raw!r}: its value must be at most {MAX_ARG_LEN} printable characters")
        if value.startswith("-") and not _is_number(value) and flag not in _FREE_VALUES:
            return FlagError(i, f"{raw!r} expects a value, got the flag {value!r}")
        if _is_number(value) and not math.isfinite(float(value)):
            return FlagError(i, f"{raw!r}: {value!r} is not a finite number")
        if flag in _ZERO_OR_ONE and value not in ("0", "1"):
            return FlagError(i, f"{raw!r} takes 0 or 1, got {value!r}")
        i += step
    return None


def canonical(args: list[str] | tuple[str, ...]) -> list[str]:
    """Arguments as llama-server will read them: `_` -> `-` in long flags, `--flag=value` split."""
    out: list[str] = []
    expect_value = False
    for a in args:
        if expect_value:
            out.append(a)
            expect_value = False
            continue
        flag, inline = normalise(a)
        out.append(flag)
        if inline is not None:
            out.append(inline)
        else:
            expect_value = ALLOWED.get(flag, 0) == 1
    return out


def remove(args: list[str], names: tuple[str, ...]) -> list[str]:
    """Drop the named flags (and their values) from canonical arguments."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in names:
            i += 1 + ALLOWED.get(args[i], 0)
            continue
        out.append(args[i])
        i += 1
    return out


# ---------------------------------------------------------------- one option, several spellings

#: Spellings of one llama-server option among the allowed flags, as b11434's common/arg.cpp groups them: `-t`
#: swept beside `--threads`, or swept and also given under another spelling, is one option given twice.
_SPELLINGS: tuple[tuple[str, ...], ...] = (
    ("-t", "--threads"), ("-tb", "--threads-batch"), ("-C", "--cpu-mask"), ("-Cr", "--cpu-range"),
    ("-Cb", "--cpu-mask-batch"), ("-Crb", "--cpu-range-batch"), ("-c", "--ctx-size"), ("-b", "--batch-size"),
    ("-ub", "--ubatch-size"), ("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"), ("-cms", "--checkpoint-min-step"),
    ("-cram", "--cache-ram"), ("-kvu", "--kv-unified"), ("-no-kvu", "--no-kv-unified"), ("-fa", "--flash-attn"),
    ("-s", "--seed"), ("--temp", "--temperature"), ("-kvo", "--kv-offload"), ("-nkvo", "--no-kv-offload"),
    ("-nr", "--no-repack"), ("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v"), ("-dt", "--defrag-thold"),
    ("-np", "--parallel"), ("-cb", "--cont-batching"), ("-nocb", "--no-cont-batching"), ("-lm", "--load-mode"),
    ("-dev", "--device"), ("-ot", "--override-tensor"), ("-cmoe", "--cpu-moe"), ("-ncmoe", "--n-cpu-moe"),
    ("-ncffn", "--n-cpu-ffn"), ("-ngl", "--gpu-layers", "--n-gpu-layers"), ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"), ("-mg", "--main-gpu"), ("-fit", "--fit"), ("-fitt", "--fit-target"),
    ("-fitc", "--fit-ctx"), ("--no-ui", "--no-webui"), ("-rea", "--reasoning"), ("-sps", "--slot-prompt-similarity"),
    ("--spec-draft-threads", "-td", "--threads-draft"),
    ("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"),
    ("--spec-draft-cpu-strict", "--cpu-strict-draft"), ("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"),
    ("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"), ("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"),
    ("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"),
    ("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"),
    ("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"),
    ("--spec-draft-p-split", "--draft-p-split"), ("--spec-draft-p-min", "--draft-p-min"),
    ("--spec-draft-device", "-devd", "--device-draft"),
    ("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
    ("--draft", "--draft-n", "--draft-max"), ("--draft-min", "--draft-n-min"),
)
_OPTION = {name: next(n for n in group if n.startswith("--")) for group in _SPELLINGS for name in group}


def option(flag: str) -> str:
    """The option a flag spells, by its first long spelling: `-t` -> `--threads`, `--temp` -> `--temp`; a flag with
    one spelling is itself (normalised: `_` -> `-`)."""
    name = normalise(flag)[0]
    return _OPTION.get(name, name)
