"""Pre-flight checks of model files against a speculative type, from GGUF headers alone (`harness.models.gguf_facts`).

Each rule turns one mistake that llama-server b11434 would abort on (or, worse, run silently and mislabel) into
one line naming the model key, the file, what was found and what is expected. `check` runs every rule;
`supported_flavours` reads a llama.cpp source tree for the drafter flavours its loader knows, so a build can
record them (image labels) and the check can compare a file's flavour with the image's.

What the headers cannot tell: whether the draft's graph fits the scheduler at start-up (a DFlash2 file with a
large convolution kernel passes every rule here and still aborts in `ggml_new_object`), and anything about the
weights' values. A start-up smoke test covers the first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from harness import KitError
from harness.intake import spec_types
from harness.intake.spec_types import SpecType
from harness.models.gguf_facts import ModelFacts

#: Drafter architectures: a file of one of these is not a language model of its own.
DRAFTER_ARCHS = frozenset({"dflash", "eagle3"})
FLAVOURS = ("dflash1", "dflash2", "dspark", "eagle3", "mtp")

# Tensor names the b11434 loader creates for a drafter (the DeepSeek-V4 DSpark variant aside); "%d" is a layer.
_DFLASH_GLOBAL = {"token_embd.weight", "d2t", "fc.weight", "fc.scale", "enc.output_norm.weight",
                  "output_norm.weight", "output.weight", "rope_freqs.weight"}
_DFLASH_LAYER = {f"blk.%d.{n}" for n in (
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "attn_q_norm.weight", "attn_k_norm.weight", "post_attention_norm.weight", "post_ffw_norm.weight",
    "layer_output_scale.weight", "attn_sinks.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight",
    "ffn_up.weight")}
_FLAVOUR_GLOBAL = {"dflash2": {"selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight"},
                   "dspark": {"markov_w1.weight", "markov_w2.weight", "markov_w2.scale", "conf_proj.weight",
                              "conf_proj.bias"}}
_FLAVOUR_LAYER = {"dflash2": {f"blk.%d.{n}" for n in ("attn_conv_base", "attn_conv_proj.weight", "ffn_conv_base",
                                                        "ffn_conv_proj.weight")}}
_EAGLE3_GLOBAL = {"token_embd.weight", "d2t", "fc.weight", "enc.output_norm.weight", "output_norm.weight",
                  "output.weight"}
_EAGLE3_LAYER = {f"blk.%d.{n}" for n in (
    "attn_norm.weight", "attn_norm_2.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_down.weight", "ffn_up.weight",
    "rope_freqs.weight")}
#: Keys every drafter needs (`<arch>.` prefixed) and the tokenizer keys every model needs.
_DRAFTER_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
                 "attention.head_count", "attention.layer_norm_rms_epsilon")
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")
_FLAVOUR_KEYS = {"dflash1": ("target_layers",),
                 "dflash2": ("target_layers", "conv_kernel_size", "conv_group_size", "selector_rank",
                             "selector_top_k"),
                 "dspark": ("target_layers", "block_size"),
                 "eagle3": ("target_layers", "target_hidden_size")}


class _Ctx:
    """The two files under check, with their keys in the manifest, and the image's flavours."""

    def __init__(self, spec_type: str, target: ModelFacts, draft: ModelFacts | None, supported: set[str],
                 target_key: str, draft_key: str) -> None:
        self.spec_type, self.target, self.draft, self.supported = spec_type, target, draft, supported
        self.target_key, self.draft_key = target_key, draft_key
        self.spec: SpecType = spec_types.get(spec_type)

    def t(self, found: str, expected: str) -> str:
        return f"models.{self.target_key} ({self.target.source}): {found}; expected {expected}"

    def d(self, found: str, expected: str) -> str:
        assert self.draft is not None
        return f"models.{self.draft_key} ({self.draft.source}): {found}; expected {expected}"

    @property
    def drafter(self) -> ModelFacts | None:
        """The draft when it is a dflash/eagle3 file under the type that reads one (the rules on its fields)."""
        d = self.draft
        if d is None or d.architecture not in DRAFTER_ARCHS:
            return None
        return d if self.spec.drafter_arch is not None else None


def check(spec_type: str, target: ModelFacts, draft: ModelFacts | None,
          supported_flavours: Mapping[str, bool] | Iterable[str], *, target_key: str = "target",
          draft_key: str = "draft") -> list[str]:
    """Problems that would make `llama-server --spec-type <spec_type> -m target [-md draft]` abort or run
    as something else, one line each; empty when the files fit. supported_flavours: what the image's
    llama.cpp knows (a dict from `supported_flavours`, or the names of the supported ones)."""
    if isinstance(supported_flavours, Mapping):
        supported = {k for k, v in supported_flavours.items() if v}
    else:
        supported = set(supported_flavours)
    ctx = _Ctx(spec_type, target, draft, supported, target_key, draft_key)
    problems: list[str] = []
    for rule in RULES:
        problems.extend(rule(ctx))
    return problems


# ---------------------------------------------------------------- the rules


def _draft_given(c: _Ctx) -> list[str]:
    if c.spec.draft_file and c.draft is None:
        return [f"models.{c.draft_key}: no draft file given; spec type {c.spec_type} reads one (-md)"]
    if not c.spec.draft_file and c.draft is not None:
        return [c.d(f"a draft file under spec type {c.spec_type}", "none (it takes no -md file)")]
    return []


def _architecture(c: _Ctx) -> list[str]:
    out = []
    if c.target.architecture in DRAFTER_ARCHS:
        out.append(c.t(f"architecture {c.target.architecture} (a drafter)", "a language model as the target"))
    d = c.draft
    if d is not None:
        want = c.spec.drafter_arch
        if want and d.architecture != want:
            out.append(c.d(f"architecture {d.architecture}", f"a {want} drafter for spec type {c.spec_type}"))
        if c.spec.language_model_draft and d.architecture in DRAFTER_ARCHS:
            out.append(c.d(f"architecture {d.architecture} (a drafter that reads the target's states)",
                           f"a language model of its own for {c.spec_type} (or spec type "
                           f"{'/'.join(t.name for t in spec_types.reading(d.architecture))})"))
    if c.spec.mtp_target:
        if c.target.nextn_predict_layers <= 0:
            out.append(c.t(f"architecture {c.target.architecture} with no NextN layers "
                           f"({c.target.architecture}.nextn_predict_layers absent or 0)",
                           f"a target with MTP/NextN layers for {c.spec_type} (e.g. qwen35, glm4moe, deepseek2)"))
        elif not c.target.has_nextn_tensors:
            out.append(c.t(f"nextn_predict_layers {c.target.nextn_predict_layers} but no blk.N.nextn.* tensors",
                           "the NextN block's tensors (eh_proj, enorm, hnorm) in the file"))
    return out


def _flavour_supported(c: _Ctx) -> list[str]:
    out = []
    d = c.drafter
    if d is not None:
        flavour = _flavour(d)
        if flavour and flavour not in c.supported:
            created = loader_tensor_names(d, c.supported) or set()
            if created:  # the architecture loads, without this flavour's tensors
                then = (f"{d.tensor_count} tensors; this image's loader would create {len(created)}: "
                        f"'wrong number of tensors; expected {d.tensor_count}, got {len(created)}'")
            else:
                then = f"this image's loader says 'unknown model architecture: '{d.architecture}''"
            out.append(c.d(f"a {flavour} drafter ({then})", "a flavour this image's llama.cpp loads: "
                           f"{', '.join(f for f in FLAVOURS if f in c.supported) or 'none'}"))
    if not c.spec.draft_file and c.spec.flavours and not set(c.spec.flavours) & c.supported:
        out.append(c.t(f"a target for {c.spec_type}", f"an image whose llama.cpp has {c.spec_type}"))
    return out


def _flavour(d: ModelFacts) -> str | None:
    return d.dflash_flavour or ("eagle3" if d.architecture == "eagle3" else None)


def _flavour_matches_type(c: _Ctx) -> list[str]:
    d = c.draft
    # a file of the type's architecture but another flavour: the server runs it silently (the architecture rule
    # names a file of another architecture)
    if d is None or d.dflash_flavour is None or d.architecture != c.spec.drafter_arch:
        return []
    if d.dflash_flavour in c.spec.flavours:
        return []
    right = spec_types.for_flavour(d.dflash_flavour)
    return [c.d(f"a {d.dflash_flavour} file under spec type {c.spec_type} (the server runs it silently, "
                f"as {c.spec_type})", f"spec type {right.name if right else '?'} for a {d.dflash_flavour} file")]


def loader_tensor_names(facts: ModelFacts, supported: set[str]) -> set[str] | None:
    """The file's tensors that a loader with these flavours creates (None when the architecture's table is
    not known here): the file's count minus this is what the loader leaves over."""
    arch = facts.architecture
    if arch == "dflash":
        if "dflash1" not in supported:
            return set()
        glob, layer = set(_DFLASH_GLOBAL), set(_DFLASH_LAYER)
        for fl in ("dflash2", "dspark"):
            if fl in supported:
                glob |= _FLAVOUR_GLOBAL.get(fl, set())
                layer |= _FLAVOUR_LAYER.get(fl, set())
    elif arch == "eagle3":
        if "eagle3" not in supported:
            return set()
        glob, layer = set(_EAGLE3_GLOBAL), set(_EAGLE3_LAYER)
    else:
        return None
    n_layer = facts.block_count or 0
    known = set(glob)
    for i in range(n_layer):
        known |= {p.replace("%d", str(i)) for p in layer}
    # any weight may carry a per-tensor ".scale" (quantised exports); the loader asks for it by name
    known |= {n[: -len(".weight")] + ".scale" for n in known if n.endswith(".weight")}
    return {n for n in facts.tensors if n in known}


def _tensor_count(c: _Ctx) -> list[str]:
    d = c.drafter
    if d is None or _flavour(d) not in c.supported:
        return []  # an unsupported flavour is its own line, with the count it leads to
    created = loader_tensor_names(d, c.supported)
    if created is None or len(created) == d.tensor_count:
        return []
    left = sorted(set(d.tensors) - created)
    shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return [c.d(f"{d.tensor_count} tensors, of which the loader creates {len(created)} (it knows no {shown}): "
                f"'wrong number of tensors; expected {d.tensor_count}, got {len(created)}'",
                f"only tensors a {_flavour(d)} loader reads")]


def _widths(c: _Ctx) -> list[str]:
    d = c.drafter
    te = c.target.embedding_length
    if d is None or te is None:
        return []
    out = []
    de = d.embedding_length
    borrows = "token_embd.weight" not in d.tensors or "output.weight" not in d.tensors
    if d.architecture == "dflash" and de is not None and de != te:
        # the server hands DFlash n_target_layers x the target's width; the draft's fc expects its own width
        out.append(c.d(f"embedding_length {de}", f"the target's {te} (DFlash reads the target's states and "
                                                 f"{'borrows its embeddings/head' if borrows else 'fuses them'})"))
    if d.architecture == "eagle3":
        th = d.target_hidden_size
        if th is not None and th != te:
            out.append(c.d(f"eagle3.target_hidden_size {th}", f"the target's embedding_length {te}"))
        if borrows and de is not None and de != te:
            out.append(c.d(f"embedding_length {de} with no token_embd/output of its own",
                           f"the target's {te} (a drafter that borrows the target's embeddings and head)"))
    return out


def _target_layers(c: _Ctx) -> list[str]:
    d = c.drafter
    n = c.target.trunk_layers
    if d is None or n is None or d.target_layers is None:
        return []
    # DFlash reads layer inputs 0..n-1; EAGLE3 may also read n, the target's output state
    top = n - 1 if d.architecture == "dflash" else n
    bad = [i for i in d.target_layers if not 0 <= i <= top]
    if not bad:
        return []
    return [c.d(f"{d.architecture}.target_layers {d.target_layers} (ids {bad} outside the target)",
                f"ids 0..{top} (the target has {n} layers)")]


def _eagle3_three(c: _Ctx) -> list[str]:
    d = c.drafter
    if d is None or d.architecture != "eagle3" or d.target_layers is None or len(d.target_layers) == 3:
        return []
    return [c.d(f"{len(d.target_layers)} eagle3.target_layers {d.target_layers}", "exactly 3 target layers")]


def _mask_token(c: _Ctx) -> list[str]:
    d = c.drafter
    if d is None or d.architecture != "dflash":
        return []
    m = d.mask_token_id
    if m is None:
        return [c.d("no tokenizer.ggml.mask_token_id", "a mask token id (DFlash fills its block with it; without "
                                                       "one the first request aborts)")]
    if d.vocab_size is not None and not 0 <= m < d.vocab_size:
        return [c.d(f"tokenizer.ggml.mask_token_id {m}", f"an id below the vocabulary size {d.vocab_size}")]
    return []


def _vocabulary(c: _Ctx) -> list[str]:
    d = c.draft
    if d is None or not c.spec.draft_file:
        return []
    t = c.target
    if d.vocab_sha256 is None or t.vocab_sha256 is None:
        return []
    if d.vocab_sha256 == t.vocab_sha256 and d.tokenizer_model == t.tokenizer_model:
        return []
    return [c.d(f"a vocabulary of {d.vocab_size} tokens ({d.tokenizer_model}, sha256 {d.vocab_sha256[:12]})",
                f"the target's {t.vocab_size} tokens ({t.tokenizer_model}, sha256 {t.vocab_sha256[:12]}); token "
                "ids must mean the same in both")]


def _required_keys(c: _Ctx) -> list[str]:
    out = []
    for facts, line in ((c.target, c.t), (c.draft, c.d)):
        if facts is None or (facts is c.draft and not c.spec.draft_file):
            continue
        arch = facts.architecture
        if arch is None:
            out.append(line("no general.architecture", "the key naming the model's architecture"))
            continue
        need = [k for k in _TOKENIZER_KEYS if k not in facts.kv]
        if arch in DRAFTER_ARCHS:
            need += [f"{arch}.{k}" for k in _DRAFTER_KEYS if f"{arch}.{k}" not in facts.kv]
            flavour = facts.dflash_flavour or arch
            need += [f"{arch}.{k}" for k in _FLAVOUR_KEYS.get(flavour, ()) if f"{arch}.{k}" not in facts.kv]
        elif f"{arch}.embedding_length" not in facts.kv or f"{arch}.block_count" not in facts.kv:
            need += [f"{arch}.{k}" for k in ("embedding_length", "block_count") if f"{arch}.{k}" not in facts.kv]
        if need:
            out.append(line(f"missing {', '.join(need)}", "every key the loader requires of a "
                                                            f"{facts.dflash_flavour or arch} file"))
    return out


def _dflash2_geometry(c: _Ctx) -> list[str]:
    d = c.drafter
    if d is None or d.dflash_flavour != "dflash2" or d.embedding_length is None:
        return []
    e, g, k = d.embedding_length, d.arch_key("conv_group_size"), d.arch_key("selector_top_k")
    out = []
    if isinstance(g, int) and g > 0 and e % g:
        out.append(c.d(f"embedding_length {e} and dflash.conv_group_size {g}", "a width divisible by the group"))
    if isinstance(k, int) and k > 0 and e < k * (k + 1):
        out.append(c.d(f"dflash.selector_top_k {k} with embedding_length {e}",
                       f"a width of at least top_k*(top_k+1) = {k * (k + 1)}"))
    return out


RULES: tuple[Callable[[_Ctx], list[str]], ...] = (
    _draft_given, _architecture, _required_keys, _flavour_supported, _flavour_matches_type, _tensor_count,
    _widths, _target_layers, _eagle3_three, _mask_token, _vocabulary, _dflash2_geometry)


# ---------------------------------------------------------------- what a llama.cpp source tree supports

#: Per flavour: (files under the source root, a marker one of them must contain).
_MARKERS = {
    "dflash1": (("src/llama-arch.cpp",), '"dflash"'),
    "dflash2": (("src/models/dflash.cpp", "src/llama-model.cpp", "src/llama-arch.cpp"), "selector_hidden"),
    "dspark": (("src/models/dflash.cpp", "src/llama-model.cpp", "src/llama-arch.cpp"), "markov_w1"),
    "eagle3": (("src/llama-arch.cpp",), '"eagle3"'),
    "mtp": (("common/speculative.cpp",), '"draft-mtp"'),
}
_MAX_SOURCE_BYTES = 16 << 20


def supported_flavours(source_dir: Path) -> dict[str, bool]:
    """Which drafter flavours (dflash1, dflash2, dspark, eagle3, mtp) a llama.cpp source tree's loader and
    speculative code know, from markers in its sources (e.g. the selector_hidden tensor for DFlash2)."""
    root = Path(source_dir)
    if not (root / "src").is_dir():
        raise KitError(f"{root}: not a llama.cpp source tree (no src/ folder)")
    found: dict[str, bool] = {}
    for flavour, (files, marker) in _MARKERS.items():
        found[flavour] = any(marker in _read_source(root / f) for f in files)
    # DFlash2 and DSpark build on DFlash; a tree without the arch cannot load either
    found["dflash2"] = found["dflash2"] and found["dflash1"]
    found["dspark"] = found["dspark"] and found["dflash1"]
    return found


def flavour_label(flavours: Mapping[str, bool]) -> str:
    """The image label value: supported flavours, comma-separated in a fixed order."""
    return ",".join(f for f in FLAVOURS if flavours.get(f))


def _read_source(path: Path) -> str:
    try:
        if path.stat().st_size > _MAX_SOURCE_BYTES:
            return ""
        return path.read_text(errors="replace")
    except OSError:
        return ""


def check_strategies(strategies: Iterable[Any], facts_of: Callable[[str], ModelFacts | None],
                     supported: Mapping[str, bool] | Iterable[str] | None,
                     skipped: list[tuple[str, str]] | None = None) -> list[str]:
    """Every strategy's model files against its spec type, one line per problem (strategy named). `facts_of(key)`
    gives a model's header facts, None when the file is not there yet (that strategy is skipped, and
    (strategy id, missing model key) added to `skipped`); `supported` None means the image's flavours are
    unknown (every flavour is assumed, so only what no image could load is refused)."""
    problems: list[str] = []
    seen: set[tuple[str, str, str | None]] = set()
    for s in strategies:
        key = (s.spec_type, s.model, s.draft)
        if key in seen:
            continue
        seen.add(key)
        target = facts_of(s.model)
        draft = facts_of(s.draft) if s.draft else None
        if target is None or (s.draft and draft is None):
            if skipped is not None:
                skipped.append((s.id, s.model if target is None else s.draft))
            continue
        flavours = set(FLAVOURS) if supported is None else supported
        for p in check(s.spec_type, target, draft, flavours, target_key=s.model, draft_key=s.draft or "draft"):
            problems.append(f"strategies {s.id}: {p}")
    return problems
