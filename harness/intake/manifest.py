"""Manifests: load a YAML file, validate it against schemas/manifest.schema.json, return typed dataclasses.

Every error is one line: `<file>: <field path>: <what was expected>`. A manifest is untrusted input: its YAML is
parsed with bounds (size, aliases, nesting), its paths stay inside its own folder or the models folder, and its
llama-server flags pass an allow-list (harness/intake/flags.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from harness import KitError, schema
from harness import formatter as fm
from harness.files import display_path, file_sha256
from harness.intake import builds as bl
from harness.intake import cmake_flags, dimensions, flags, spec_types
from harness.intake import load as load_block
from harness.intake import suites as suite_files
from harness.intake import sweep as expansion
from harness.intake.bounded_yaml import ManifestError, parse_yaml
from harness.intake.model_paths import model_location
from harness.intake.urls import redact_url, url_problem

DEFAULT_LOAD_TIMEOUT_S = 600.0
#: The most context one server is asked for (its slots' -c together): 8 slots of 32k.
MAX_SERVER_CONTEXT = 262_144
DEFAULT_REQUEST_TIMEOUT_S = 900.0
MAX_MANIFEST_BYTES = 1 << 20
MAX_PROMPT_BYTES = 4 << 20


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bandwidth_gbs: float
    bandwidth_source: str
    memory_gb: float | None = None
    software_device: bool = False  # a software Vulkan device (lavapipe) on purpose: harness/hosts/devices.py


@dataclass(frozen=True)
class GitSource:
    repo: str
    ref: str
    commit: str | None = None


@dataclass(frozen=True)
class SdistSource:
    package: str
    version: str
    sha256: str
    subdir: str = "llama.cpp"
    index_url: str = "https://pypi.org/simple"


@dataclass(frozen=True)
class LlamaCppSource:
    git: GitSource | None
    sdist: SdistSource | None
    path: Path | None
    build_number: int | None
    commit: str | None
    prefer: str | None

    def kinds(self) -> list[str]:
        """The source kinds given, the preferred one first."""
        given = [k for k in ("sdist", "git", "path") if getattr(self, k) is not None]
        if self.prefer in given:
            given.remove(self.prefer)
            given.insert(0, self.prefer)
        return given


@dataclass(frozen=True)
class BuildConfig:
    backend: str
    cuda_architectures: str = "121"
    cmake_args: tuple[str, ...] = ()
    base_image: str | None = None
    runtime_image: str | None = None


@dataclass(frozen=True)
class Build:
    """One named llama.cpp build of a manifest with several (harness/intake/builds.py): its source and flags."""

    name: str
    llama_cpp: LlamaCppSource
    build: BuildConfig


@dataclass(frozen=True)
class HfRef:
    repo: str
    file: str
    revision: str | None = None


#: Generator fields that shape a generated model, as `write_tiny` keywords.
SHAPE_KEYS = ("embed", "ff", "layers")


@dataclass(frozen=True)
class Generator:
    kind: str
    seed: int = 0
    alpha: float | None = None
    embed: int | None = None
    ff: int | None = None
    layers: int | None = None

    def shape(self) -> dict[str, int]:
        """The shape keywords given (embed, ff, layers); the generator's defaults stand for the others."""
        return {k: getattr(self, k) for k in SHAPE_KEYS if getattr(self, k)}


@dataclass(frozen=True)
class Derivation:
    """A model made from another model of the manifest: its first `layer_skip` blocks (self-speculation)."""

    parent: str
    layer_skip: int


@dataclass(frozen=True)
class PypiModel:
    """A manifest's `models.<key>.pypi` block: where on a package index the model's chunk packages are."""

    package: str
    version: str
    #: Chunk packages, as `name` or `name==version`; empty: the main package's `Requires-Dist: x==v` pins.
    parts: tuple[str, ...] = ()
    #: The model file's name inside the packages (pieces are `<file>.partNN`); default: the package's
    #: data/SHA256SUMS entry, else the manifest's `file`.
    file: str | None = None
    #: A simple-API index (https://, http:// or file://); default: PIP_INDEX_URL, pip's index-url, else PyPI.
    index_url: str | None = None

    @classmethod
    def from_manifest(cls, raw: Mapping[str, Any]) -> PypiModel:
        """Build from the schema-checked mapping of a manifest's `pypi` block."""
        return cls(str(raw["package"]), str(raw["version"]), tuple(str(p) for p in raw.get("parts", ())),
                   raw.get("file"), raw.get("index_url"))


@dataclass(frozen=True)
class ModelFile:
    key: str
    file: str
    path: Path | None  # set when `file` has a slash: a path inside the manifest's folder
    hf: HfRef | None
    generate: Generator | None
    sha256: str | None
    size_bytes: int | None
    quantization: str | None = None
    pypi: PypiModel | None = None
    derive: Derivation | None = None

    def local_path(self, models_dir: Path) -> Path:
        """Where the file is (or will be) on this machine."""
        return self.path if self.path is not None else Path(models_dir) / self.file


@dataclass(frozen=True)
class Strategy(spec_types.StrategyFields):
    id: str
    spec_type: str
    draft: str | None = None
    args: tuple[str, ...] = ()
    label: str | None = None
    parallel: int = 1
    model: str = "target"  # the models key of this strategy's target
    baseline: str | None = None  # the strategy its speedup is against (default: the baseline of its target)
    family: str | None = None  # the manifest entry a sweep or a list of levels expanded it from
    sweep: tuple[tuple[str, str], ...] = ()  # this combination's (flag, value) pairs, already in args
    build: str | None = None  # the build it runs on (a key of the manifest's builds; None: the one build)

    @property
    def entry_id(self) -> str:
        """The manifest entry's id: the same for every combination, level and build of one entry."""
        return bl.across(self.family_id, self.build)

    def model_keys(self) -> list[str]:
        return [self.model] + ([self.draft] if self.draft else [])


@dataclass(frozen=True)
class Prompt:
    id: str
    path: Path
    sha256: str | None = None
    #: A suite's question (harness/intake/suites.py): its text, and how run.json names it (`<file>#<question_id>`);
    #: `path` is then the suite file.
    content: str | None = None
    source: str | None = None

    def text(self) -> str:
        return self.content if self.content is not None else self.path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Task:
    id: str
    prompts: tuple[Prompt, ...]
    n_predict: int
    #: A perturbation task: prompts[0] is the reference, the others its variants (a phrase added or removed).
    perturbation: bool = False
    #: Tokens of filler before the prompt (harness/run/filler.py); 0: the prompt alone.
    depth: int = 0
    #: The dimensions given as lists on its entry, with this task's values (harness/intake/dimensions.py).
    dims: tuple[tuple[str, int], ...] = ()
    #: The index of its entry in the manifest's `tasks:` (a suite's or an expanded entry's tasks share one).
    entry: int = 0

    @property
    def family(self) -> str:
        """The manifest entry's id: the same for every length and depth of one entry."""
        return dimensions.family(self.id, self.dims)

    @property
    def family_id(self) -> str:
        """The entry id by the name `--tasks` selects with (as a strategy's): every length and depth of it."""
        return self.family

    def prompt(self, prompt_id: str | None = None) -> str:
        return self.get_prompt(prompt_id).text()

    def get_prompt(self, prompt_id: str | None = None) -> Prompt:
        if prompt_id is None:
            return self.prompts[0]
        for p in self.prompts:
            if p.id == prompt_id:
                return p
        raise KeyError(prompt_id)


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of every timed request."""

    temperature: float = 0.0
    seed: int = 42
    top_k: int | None = None

    def words(self) -> str:
        """The settings as `k=v` pairs in name order (what tells two runs' requests apart)."""
        return ",".join(f"{k}={v}" for k, v in sorted(asdict(self).items()))


#: The sampling study's defaults: samples per strategy and prompt (and per arm of its baseline), tokens per sample,
#: the first tokens compared as sequences, samples per fresh server, the first seed, and the control's offset from
#: the study's temperature.
STUDY_SAMPLES, STUDY_TOKENS, STUDY_PREFIX, STUDY_BATCH, STUDY_SEED = 24, 16, 3, 8, 1
STUDY_TEMPERATURE, STUDY_CONTROL_OFFSET = 0.8, 0.4
#: The schemas' bounds of a study: temperature at most 10, at most 500 samples per arm (the kernel test compares
#: every pair of samples).
MAX_TEMPERATURE, MAX_STUDY_SAMPLES = 10.0, 500


@dataclass(frozen=True)
class Distribution:
    """The sampling study of a manifest (`distribution:`, or `invoke run --distribution N`): samples drawn at a
    temperature above 0, each one request with its own seed, for each strategy and prompt named (resolved here:
    strategy ids at one client, (task, prompt) ids), the baseline with the same seeds and with other seeds, and the
    positive control: the baseline at `control` = (temperature or top_k, value)."""

    temperature: float
    top_k: int | None
    samples: int
    tokens: int
    prefix: int
    batch: int
    seed: int
    prompts: tuple[tuple[str, str], ...]
    strategies: tuple[str, ...]
    control: tuple[str, float | int]


def study(block: Mapping[str, Any], strategies: tuple[Strategy, ...], tasks: tuple[Task, ...],
          where: str) -> Distribution:
    """A `distribution:` block (schema-checked) resolved against the manifest's strategies and tasks; an unknown or
    unfit name is one line naming `distribution.<field>[i]`."""
    def fail(fp: str, message: str) -> ManifestError:
        return ManifestError(f"{where}: distribution.{fp}: {message}")

    prompts: list[tuple[str, str]] = []
    for i, entry in enumerate(block.get("tasks") or [t.id for t in tasks]):
        tid, _, pid = entry.partition("/")
        task = next((t for t in tasks if t.id == tid), None)
        if task is None:
            raise fail(f"tasks[{i}]", f"{entry!r}: no task {tid!r} (expected one of {[t.id for t in tasks]})")
        if pid and pid not in {p.id for p in task.prompts}:
            raise fail(f"tasks[{i}]", f"{entry!r}: task {tid!r} has no prompt {pid!r} (expected one of "
                       f"{[p.id for p in task.prompts]})")
        if (tid, pid or task.prompts[0].id) not in prompts:
            prompts.append((tid, pid or task.prompts[0].id))
    eligible = [s for s in strategies if s.speculative and s.parallel == 1]
    firsts: dict[str, str] = {}  # a sweep by its first combination
    for s in eligible:
        firsts.setdefault(s.family_id, s.id)
    given = list(block.get("strategies") or firsts.values())
    names: list[str] = []
    for i, sid in enumerate(given):
        # a strategy by its id; one entry on several builds by its name without the build (every build's)
        picked = [s.id for s in eligible if s.id == sid] or [s.id for s in eligible if bl.across(s.id, s.build) == sid]
        if not picked:
            known = [s.id for s in eligible]
            raise fail(f"strategies[{i}]", f"{sid!r} is not a speculative strategy at one client (expected one of "
                       f"{known[:40]})")
        names += picked
    sp = block["sampling"]
    temperature = float(sp["temperature"])
    # the default control a step warmer, or cooler where warmer would pass the schema's highest temperature
    warmer = temperature + STUDY_CONTROL_OFFSET
    default = warmer if warmer <= MAX_TEMPERATURE else temperature - STUDY_CONTROL_OFFSET
    control = dict(block.get("control") or {"temperature": round(default, 6)})
    kind, value = next(iter(control.items()))
    if (kind, value) in (("temperature", temperature), ("top_k", sp.get("top_k"))):
        raise fail(f"control.{kind}", f"{value} is the study's own setting; the control must differ from it")
    tokens = int(block.get("tokens", STUDY_TOKENS))
    return Distribution(temperature, sp.get("top_k"), int(block.get("samples", STUDY_SAMPLES)), tokens,
                        min(int(block.get("prefix", STUDY_PREFIX)), tokens), int(block.get("batch", STUDY_BATCH)),
                        int(block.get("seed", STUDY_SEED)), tuple(prompts), tuple(dict.fromkeys(names)),
                        (kind, int(value) if kind == "top_k" else float(value)))


@dataclass(frozen=True)
class Manifest:
    path: Path
    name: str
    description: str
    hardware: Hardware
    llama_cpp: LlamaCppSource
    build: BuildConfig
    models: dict[str, ModelFile]
    server_args: tuple[str, ...]
    sampling: Sampling
    endpoint: str
    strategies: tuple[Strategy, ...]
    tasks: tuple[Task, ...]
    runs: int
    load_timeout_s: float
    request_timeout_s: float
    text: str = field(repr=False, compare=False, default="")
    confirm_rounds: int | None = None  # after a sweep: rounds of its best two combinations (None: the run's runs)
    #: At most this many disturbed measurements are measured again per run (None: the kit's share of the plan).
    retakes: int | None = None
    #: The sampling study (`distribution:`), None without one.
    distribution: Distribution | None = None
    #: The named builds (harness/intake/builds.py); empty: llama_cpp and build above are the one build.
    builds: tuple[Build, ...] = ()
    #: The prompt suites its tasks were drawn from (harness/intake/suites.py), in task order.
    suites: tuple[suite_files.Drawn, ...] = ()
    #: The load study (`load:`, harness/intake/load.py), None without one.
    load: load_block.LoadStudy | None = None

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def target(self) -> ModelFile:
        return self.models["target"]

    def strategy(self, sid: str) -> Strategy:
        for s in self.strategies:
            if s.id == sid:
                return s
        raise KeyError(sid)

    def task(self, tid: str) -> Task:
        for t in self.tasks:
            if t.id == tid:
                return t
        raise KeyError(tid)

    def baseline(self, model: str = "target", parallel: int = 1, build: str | None = None) -> Strategy | None:
        """The no-speculation control of a target on a build: the first baseline on that model and build at that
        level, else its first."""
        return expansion.at_level([s for s in self.strategies if not s.speculative and s.model == model
                                   and s.build == build], parallel)

    def baseline_for(self, strategy: Strategy) -> Strategy | None:
        """Its speedup's control, on its own build: its `baseline` entry at its level (else that entry's first),
        else its target's."""
        b = strategy.baseline
        return expansion.at_level([s for s in self.strategies if b in (s.entry_id, s.family_id, s.id)
                                   and s.build == strategy.build], strategy.parallel) if b \
            else self.baseline(strategy.model, strategy.parallel, strategy.build)

    def build_names(self) -> list[str | None]:
        """The builds' names in order ([None]: the one build of a manifest without builds)."""
        return [b.name for b in self.builds] or [None]

    def for_build(self, name: str | None) -> Manifest:
        """The manifest as its build `name` sees it: that build's llama_cpp and build at the top (what the image
        code reads); itself for None or a manifest without builds."""
        if name is None or not self.builds:
            return self
        b = next((x for x in self.builds if x.name == name), None)
        if b is None:
            raise KitError(f"{display_path(self.path)}: no build {name!r} (builds: {[x.name for x in self.builds]})")
        return replace(self, llama_cpp=b.llama_cpp, build=b.build)

    def models_used(self, strategy_ids: Iterable[str] | None = None) -> list[ModelFile]:
        """The models the strategies use (all of them, or those named), targets and drafts, each once."""
        only = None if strategy_ids is None else set(strategy_ids)
        used = [k for s in self.strategies if only is None or s.id in only for k in s.model_keys()]
        return [self.models[k] for k in dict.fromkeys(used)]


def load(path: str | Path, *, check_files: bool = True) -> Manifest:
    """Load and validate a manifest; raise ManifestError with a one-line message on the first problem.

    With check_files, prompt files must exist and pinned sha256s of prompts must match."""
    path = Path(path)
    where = display_path(path)
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{where}: {fm.count(path.stat().st_size)} bytes; a manifest is at most "
                                f"{fm.count(MAX_MANIFEST_BYTES)}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{where}: no such manifest file") from None
    except IsADirectoryError:
        raise ManifestError(f"{where}: is a folder, expected a manifest YAML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{where}: cannot read: {e}") from None
    return loads(text, path, check_files=check_files)


def loads(text: str, path: Path, *, check_files: bool = True) -> Manifest:
    """A manifest from its text; `path` says where it lives (prompts are relative to its folder)."""
    where = display_path(path)
    raw = parse_yaml(text, where)
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        schema.check("manifest", raw, where)
    except KitError as e:
        raise ManifestError(str(e)) from None
    return _Builder(Path(path).resolve(), where, raw).build(text, check_files)


class _Builder:
    """The checks a schema cannot express, field by field, while building the dataclasses.

    Long by design: one short method per manifest section, each naming its own field paths in errors."""

    def __init__(self, path: Path, where: str, raw: dict[str, Any]):
        self.path, self.where, self.raw = path, where, raw
        self.folder = path.parent

    def fail(self, field_path: str, message: str) -> ManifestError:
        return ManifestError(f"{self.where}: {field_path}: {message}")

    def build(self, text: str, check_files: bool) -> Manifest:
        raw = self.raw
        hw = raw["hardware"]
        server_args = tuple(raw.get("server_args", ()))
        self.check_flags("server_args", server_args)
        slots = expansion.slots(server_args)  # the level of every entry that gives no `parallel`
        if slots is not None and not (slots.isascii() and slots.isdigit() and 1 <= int(slots) <= expansion.MAX_SLOTS):
            raise self.fail("server_args", f"--parallel {slots!r}: expected a whole number of slots from 1 to "
                            f"{expansion.MAX_SLOTS}")
        models = self.models()
        builds = self.builds()
        strategies = self.strategies(models)
        sp = raw.get("sampling", {})
        timeouts = raw.get("timeouts", {})
        drawn: list[suite_files.Drawn] = []
        tasks = self.tasks(check_files, drawn)
        self.check_depths(tasks, strategies, server_args)
        return Manifest(
            path=self.path, name=raw["name"], description=raw.get("description", ""),
            hardware=Hardware(hw["name"], float(hw["memory_bandwidth_gbs"]), hw["bandwidth_source"],
                              hw.get("memory_gb"), bool(hw.get("software_device"))),
            llama_cpp=builds[0].llama_cpp, build=builds[0].build, models=models,
            server_args=server_args,
            sampling=Sampling(float(sp.get("temperature", 0.0)), int(sp.get("seed", 42)), sp.get("top_k")),
            endpoint=raw.get("endpoint", "completion"), strategies=strategies, tasks=tasks,
            runs=int(raw["runs"]), load_timeout_s=float(timeouts.get("load_s", DEFAULT_LOAD_TIMEOUT_S)),
            request_timeout_s=float(timeouts.get("request_s", DEFAULT_REQUEST_TIMEOUT_S)), text=text,
            confirm_rounds=raw.get("confirm_rounds"), retakes=raw.get("retakes"),
            distribution=study(raw["distribution"], strategies, tasks, self.where) if "distribution" in raw else None,
            builds=tuple(b for b in builds if b.name), suites=tuple(drawn),
            load=load_block.parse(raw["load"], strategies, tasks, int(raw["runs"]), self.where) if "load" in raw
            else None)

    def builds(self) -> list[Build]:
        """The named builds (each entry's llama_cpp and build, else the top-level ones), or the one top-level
        build unnamed; every build has a source and a backend, and all share the backend."""
        names = bl.named(self.raw)
        out = []
        for name in names or [""]:
            at = f"builds.{name}." if name else ""
            lc, b = bl.entry(self.raw, name, "llama_cpp"), bl.entry(self.raw, name, "build")
            for key, given in (("llama_cpp", lc), ("build", b)):
                if given is None:
                    raise self.fail(f"{at}{key}" if name else key, "required: give it at the top level, or in "
                                    "every entry of builds")
            lc_at = f"builds.{name}.llama_cpp" if name and "llama_cpp" in self.raw["builds"][name] else "llama_cpp"
            b_at = f"builds.{name}.build" if name and "build" in self.raw["builds"][name] else "build"
            out.append(Build(name, self.source(lc, lc_at), self.build_config(b, b_at)))
        clash = bl.backend_problem({b.name: b.build.backend for b in out})
        if clash is not None:
            raise self.fail(f"builds.{clash[0]}.build.backend", clash[1])
        if self.raw["hardware"].get("software_device") and out[0].build.backend != "vulkan":
            raise self.fail("hardware.software_device", "a software device is a Vulkan one: every build's backend "
                            "must be vulkan")
        return out

    def source(self, lc: dict[str, Any], at: str = "llama_cpp") -> LlamaCppSource:
        git = GitSource(**lc["git"]) if "git" in lc else None
        sdist = SdistSource(**lc["sdist"]) if "sdist" in lc else None
        if git is not None:
            self.check_url(f"{at}.git.repo", git.repo, local_ok=True)
        if sdist is not None:
            self.check_url(f"{at}.sdist.index_url", sdist.index_url)
            sub = PurePosixPath(sdist.subdir)
            if sub.is_absolute() or ".." in sub.parts or sdist.subdir in ("", "."):
                raise self.fail(f"{at}.sdist.subdir", f"{sdist.subdir!r}: expected a folder name inside the "
                                "sdist (such as llama.cpp)")
        src_path = (self.folder / lc["path"]).resolve() if "path" in lc else None
        ident = lc.get("identity", {})
        if lc.get("prefer") and lc["prefer"] not in lc:
            raise self.fail(f"{at}.prefer", f"{lc['prefer']!r} is preferred but {at}.{lc['prefer']} is not "
                            "given")
        if not any(k in lc for k in ("git", "sdist", "path")):
            raise self.fail(at, "expected at least one of git, sdist, path")
        return LlamaCppSource(git, sdist, src_path, ident.get("build_number"), ident.get("commit"), lc.get("prefer"))

    def check_url(self, field_path: str, url: str, local_ok: bool = False) -> None:
        """One rule for every URL a manifest names (harness/intake/urls.py); the manifest's text goes into run.json
        and bundles, so a token in it would travel with them, and it is never echoed."""
        problem = url_problem(url, local_ok=local_ok)
        if problem:
            raise self.fail(field_path, f"{redact_url(url)[:200]!r} {problem}")

    def build_config(self, b: dict[str, Any], at: str = "build") -> BuildConfig:
        for i, arg in enumerate(b.get("cmake_args", ())):
            problem = cmake_flags.refusal(arg)
            if problem:
                raise self.fail(f"{at}.cmake_args[{i}]", problem)
        return BuildConfig(backend=b["backend"], cuda_architectures=b.get("cuda_architectures", "121"),
                           cmake_args=tuple(b.get("cmake_args", ())), base_image=b.get("base_image"),
                           runtime_image=b.get("runtime_image"))

    def models(self) -> dict[str, ModelFile]:
        models: dict[str, ModelFile] = {}
        for key, m in self.raw["models"].items():
            fp = f"models.{key}"
            given = [k for k in ("hf", "generate", "pypi", "derive") if k in m]
            if len(given) > 1:
                raise self.fail(fp, f"give one of hf, generate, pypi, derive (or none, for a local file), not "
                                f"{given}")
            if "pypi" in m and not m.get("sha256"):
                raise self.fail(f"{fp}.sha256", "a model assembled from PyPI packages must pin its sha256")
            parent = m.get("derive", {}).get("from")
            if parent is not None and (parent not in self.raw["models"] or "derive" in self.raw["models"][parent]):
                raise self.fail(f"{fp}.derive.from", f"expected one of the models that is not itself derived, got "
                                f"{parent!r}")
            mpath = self.model_path(f"{fp}.file", m["file"])
            hf = HfRef(m["hf"]["repo"], m["hf"]["file"], m["hf"].get("revision")) if "hf" in m else None
            if hf is not None and (PurePosixPath(hf.file).is_absolute() or ".." in PurePosixPath(hf.file).parts
                                   or "\\" in hf.file or any(ord(ch) < 32 for ch in hf.file)):
                raise self.fail(f"{fp}.hf.file", f"{hf.file!r}: expected a path inside the repository")
            gen = Generator(**m["generate"]) if "generate" in m else None
            if "pypi" in m and m["pypi"].get("index_url") is not None:
                self.check_url(f"{fp}.pypi.index_url", m["pypi"]["index_url"])
            models[key] = ModelFile(key, m["file"], mpath, hf, gen, m.get("sha256"), m.get("size_bytes"),
                                    m.get("quantization"),
                                    PypiModel.from_manifest(m["pypi"]) if "pypi" in m else None,
                                    Derivation(m["derive"]["from"], m["derive"]["layer_skip"]) if "derive" in m
                                    else None)
        self.check_one_file_per_key(models)
        return models

    def check_one_file_per_key(self, models: dict[str, ModelFile]) -> None:
        """Two keys may not name one file name: a host's models folder holds one file of each name."""
        seen: dict[str, ModelFile] = {}
        for key, m in models.items():
            o = seen.setdefault(PurePosixPath(m.file).name, m)
            if o is not m:
                same = f"is models.{o.key}.file too" if o.file == m.file else \
                    f"and models.{o.key}.file {o.file!r} have one file name {PurePosixPath(m.file).name!r}"
                raise self.fail(f"models.{key}.file", f"{m.file!r} {same}; a host's models folder holds one file "
                                "of each name, so one model would be measured with the other's bytes: give each "
                                "model a file name of its own")

    def model_path(self, field_path: str, file: str) -> Path | None:
        """A file name in the models folder (None), or a path inside the manifest's folder."""
        p = PurePosixPath(file)
        if p.is_absolute() or ".." in p.parts or "\\" in file:
            raise self.fail(field_path, f"{file!r}: expected a file name in the models folder, or a relative path "
                            "inside the manifest's folder (no '..', not absolute)")
        if "/" not in file:
            if file.startswith("."):
                raise self.fail(field_path, f"{file!r}: expected a file name that does not start with '.' (the kit "
                                "keeps its own files in the models folder under such names)")
            return None
        try:
            resolved = (self.folder / file).resolve()
        except (OSError, RuntimeError):
            raise self.fail(field_path, f"{file!r} cannot be resolved (a symlink loop?)") from None
        if not resolved.is_relative_to(self.folder):
            raise self.fail(field_path, f"{file!r} resolves outside the manifest's folder {self.folder}")
        return resolved

    def strategies(self, models: dict[str, ModelFile]) -> tuple[Strategy, ...]:
        out: list[Strategy] = []
        names = bl.named(self.raw)
        for i, s in enumerate(self.raw["strategies"]):
            self.check_models(fp := f"strategies[{i}]", s, models)
            self.check_flags(f"{fp}.args", args := tuple(s.get("args", ())))
            on, say = bl.of_strategy(s, names, f"{self.where}: {fp}")
            # sweeps and levels expanded, each on every build of the entry (the build's name last)
            expanded = expansion.entry(s, args, self.raw, f"{self.where}: {fp}", len(out), len(on))
            for b in on:
                family = bl.name_on(s["id"], b) if say else s["id"]
                for e in expanded:
                    sid = bl.name_on(e.id, b) if say else e.id
                    if len(sid) > expansion.MAX_ID_LENGTH:
                        raise self.fail(f"{fp}.builds", f"the name {sid[:60]!r}... is longer than "
                                        f"{expansion.MAX_ID_LENGTH} characters; a shorter build name")
                    self.check_context(f"{fp}.parallel", e.parallel)
                    out.append(Strategy(sid, s["spec_type"], s.get("draft"), args + expansion.sweep_args(e) + e.extra,
                                        s.get("label"), e.parallel, s.get("model", "target"), s.get("baseline"),
                                        family, e.sweep, b))
        self.check_baselines(out)
        return tuple(out)

    def check_context(self, field_path: str, parallel: int) -> None:
        """N slots ask llama-server for N times server_args' -c (harness/run/server.py): bounded before any engine
        is asked, as a single -c is by the model it loads."""
        common = flags.canonical(tuple(self.raw.get("server_args", ())))
        at = [i + 1 for i in range(len(common) - 1) if common[i] in ("-c", "--ctx-size")]
        ctx = common[at[-1]] if at else ""
        if parallel > 1 and ctx.isascii() and ctx.isdigit() and int(ctx) * parallel > MAX_SERVER_CONTEXT:
            raise self.fail(field_path, f"{parallel} slots of server_args' -c {ctx} ask llama-server for a context "
                            f"of {fm.count(int(ctx) * parallel)} tokens; at most {fm.count(MAX_SERVER_CONTEXT)} (a "
                            "smaller -c or fewer slots)")

    def check_baselines(self, strategies: list[Strategy]) -> None:
        """With several builds, a speculative strategy's speedup is against a baseline of its own build: one must
        exist (a speedup across builds would mix the build's effect into the strategy's)."""
        if not bl.named(self.raw):
            return
        ids = [s["id"] for s in self.raw["strategies"]]
        for s in strategies:
            if not s.speculative:
                continue
            given = [b for b in strategies if s.baseline in (b.entry_id, b.id)] if s.baseline else \
                [b for b in strategies if not b.speculative and b.model == s.model]
            if given and not any(b.build == s.build for b in given):
                fp = f"strategies[{ids.index(s.entry_id)}]"
                raise self.fail(fp, f"{s.id} runs on build {s.build!r}, but no baseline"
                                + (f" {s.baseline!r}" if s.baseline else f" on {s.model!r}") + " does: add "
                                f"{s.build!r} to that baseline's builds (each build's speedups are against its own "
                                "baseline)")

    def check_models(self, fp: str, s: dict[str, Any], models: dict[str, ModelFile]) -> None:
        draft, model = s.get("draft"), s.get("model", "target")
        if model not in models:
            raise self.fail(f"{fp}.model", f"{model!r} is not a key of models (expected one of {sorted(models)})")
        draft_file = spec_types.get(s["spec_type"]).draft_file
        if draft_file and not draft:
            raise self.fail(fp, f"spec_type {s['spec_type']!r} needs a draft model: set draft to one of "
                            f"{sorted(models)}")
        if draft is not None:
            if not draft_file:
                raise self.fail(f"{fp}.draft", f"spec_type {s['spec_type']!r} takes no draft model")
            if draft not in models:
                raise self.fail(f"{fp}.draft", f"{draft!r} is not a key of models (expected one of {sorted(models)})")
            if draft == model:
                raise self.fail(f"{fp}.draft", "the draft cannot be the strategy's target model itself")

    def check_flags(self, field_path: str, args: tuple[str, ...]) -> None:
        problem = flags.check(args)
        if problem is not None:
            raise self.fail(f"{field_path}[{problem.index}]", problem.message)

    def tasks(self, check_files: bool, drawn: list[suite_files.Drawn]) -> tuple[Task, ...]:
        out: list[Task] = []
        seen: dict[str, int] = {}
        for i, t in enumerate(self.raw["tasks"]):
            fp = f"tasks[{i}]"
            if "suite" in t:
                out += [replace(x, entry=i) for x in self.suite_tasks(i, t, check_files, seen, drawn)]
                continue
            for key in ("id", "n_predict"):
                if key not in t:
                    raise self.fail(fp, f"{key} is required (or give a suite)")
            if t["id"] in seen:
                raise self.fail(f"{fp}.id", f"duplicate id {t['id']!r} (also tasks[{seen[t['id']]}])")
            seen[t["id"]] = i
            entries = self.prompt_entries(fp, t)
            prompts = tuple(self.prompt(f"{fpp}", e, check_files) for fpp, e in entries)
            ids = [p.id for p in prompts]
            if len(set(ids)) != len(ids):
                dup = next(x for x in ids if ids.count(x) > 1)
                raise self.fail(f"{fp}.prompts", f"two prompts have the id {dup!r}; give each an id")
            key = "perturbation" if "perturbation" in t else "probe"  # `probe` is the key's older name
            if "perturbation" in t and "probe" in t and bool(t["probe"]) != bool(t["perturbation"]):
                raise self.fail(f"{fp}.probe", "the older name of perturbation says otherwise: give one of them")
            if t.get(key) and len(prompts) < 2:
                raise self.fail(f"{fp}.{key}", "a perturbation task compares variants with its first prompt: give at "
                                "least two prompts")
            out += [Task(p.id, prompts, p.n_predict, bool(t.get(key, False)), p.depth, p.dims, i)
                    for p in dimensions.entry(t, f"{self.where}: {fp}", len(out))]
        return tuple(out)

    def suite_tasks(self, i: int, t: dict[str, Any], check_files: bool, seen: dict[str, int],
                    drawn: list[suite_files.Drawn]) -> list[Task]:
        """The suite entry tasks[i]'s tasks, one per category (harness/intake/suites.py); none while its file is
        not there and need not be."""
        fp = f"tasks[{i}]"
        for key in ("prompt_file", "prompts", "sha256", "perturbation", "probe"):
            if key in t:
                raise self.fail(f"{fp}.{key}", "a suite's questions are its prompts: give the suite alone")
        got = suite_files.load(suite_files.entry(t, fp, self.folder, self.where), check_files)
        if got is None:
            return []
        if got.suite.turns == "all" and self.raw.get("endpoint", "completion") != "chat":
            raise self.fail(f"{fp}.suite.turns", "'all' sends each later turn as a conversation (the earlier turns "
                            "and the target's own answers): it needs `endpoint: chat`")
        drawn.append(got)
        out = []
        for c in got.categories:
            for turn, questions in suite_files.turns_of(c, got.suite.turns):
                task_id = suite_files.turn_task(c.task_id, turn)
                if task_id in seen:
                    raise self.fail(fp, f"the suite's task {task_id!r} is also tasks[{seen[task_id]}]")
                seen[task_id] = i
                prompts = []
                for q in questions:
                    text = suite_files.prompt_text(q, turn)
                    prompts.append(Prompt(q.prompt_id, got.suite.path, suite_files.text_sha256(text), text,
                                          suite_files.record_name(got.suite, q)))
                lengths = list(got.suite.lengths or (got.suite.n_predict,))
                try:  # a list of lengths or depths: the category at each (named like any task's dimensions)
                    points = dimensions.points(task_id, lengths if len(lengths) > 1 else lengths[0],
                                               list(got.suite.depths) if len(got.suite.depths) > 1
                                               else got.suite.depths[0])
                except dimensions.DimensionError as e:
                    raise self.fail(f"{fp}.{e.field}", e.message) from None
                out += [Task(p.id, tuple(prompts), p.n_predict, False, p.depth, p.dims) for p in points]
        if len(out) > dimensions.MAX_TASKS:
            raise self.fail(fp, f"{len(out)} tasks once the suite's categories, lengths and depths are expanded; at "
                            f"most {dimensions.MAX_TASKS}")
        return out

    def check_depths(self, tasks: tuple[Task, ...], strategies: tuple[Strategy, ...],
                     server_args: tuple[str, ...]) -> None:
        """A task's filler and output fit every strategy's context (before any container starts)."""
        for t in tasks:
            for s in strategies:
                problem = dimensions.check_context(t.depth, t.n_predict, dimensions.context_size(
                    list(server_args) + list(s.args)), s.parallel)
                if problem is not None:
                    raise self.fail(f"tasks[{t.entry}].depth", f"{t.id} on {s.id}: {problem}")

    def prompt_entries(self, fp: str, t: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        if ("prompt_file" in t) == ("prompts" in t):
            raise self.fail(fp, "give prompt_file (one prompt) or prompts (a list of prompt files), not both")
        if "prompt_file" in t:
            # One prompt: its id is the task's (measurement ids and reports then need no prompt part).
            return [(f"{fp}.prompt_file", {"file": t["prompt_file"], "sha256": t.get("sha256"), "id": t["id"]})]
        if "sha256" in t:
            raise self.fail(f"{fp}.sha256", "with prompts, pin each prompt's sha256 in its own entry")
        return [(f"{fp}.prompts[{j}]", e if isinstance(e, dict) else {"file": e}) for j, e in enumerate(t["prompts"])]

    def prompt(self, fp: str, entry: dict[str, Any], check_files: bool) -> Prompt:
        rel = entry["file"]
        try:
            prompt = (self.folder / rel).resolve()
        except (OSError, RuntimeError):
            raise self.fail(fp, f"{rel!r} cannot be resolved (a symlink loop?)") from None
        if PurePosixPath(rel).is_absolute() or not prompt.is_relative_to(self.folder):
            raise self.fail(fp, f"{rel!r} lies outside the manifest's folder {self.folder}")
        pid = entry.get("id") or PurePosixPath(rel).stem
        if check_files:
            if not prompt.is_file():
                what = "is not a regular file" if prompt.exists() else "does not exist"
                raise self.fail(fp, f"{rel!r} {what} (looked at {display_path(prompt)})")
            if prompt.stat().st_size > MAX_PROMPT_BYTES:
                raise self.fail(fp, f"{rel!r} is {fm.count(prompt.stat().st_size)} bytes; a prompt is at most "
                                f"{fm.count(MAX_PROMPT_BYTES)}")
            if entry.get("sha256"):
                actual = file_sha256(prompt)
                if actual != entry["sha256"]:
                    field_name = fp.rsplit(".prompt_file", 1)[0] + ".sha256" if fp.endswith(".prompt_file") \
                        else f"{fp}.sha256"
                    raise self.fail(field_name, f"{rel} has sha256 {actual}, expected {entry['sha256']}")
        return Prompt(pid, prompt, entry.get("sha256"))


def check_model_files(manifest: Manifest, models_dir: Path) -> list[str]:
    """Compare present model files with their pinned sha256: one line per mismatch (absent files are fine)."""
    problems = []
    where = display_path(manifest.path)
    for m in manifest.models.values():
        try:
            p = model_location(manifest, m, models_dir)
        except KitError as e:
            problems.append(str(e))
            continue
        if m.sha256 and p.is_file():
            actual = file_sha256(p)
            if actual != m.sha256:
                problems.append(f"{where}: models.{m.key}.sha256: {display_path(p)} has sha256 {actual}, expected "
                                f"{m.sha256}")
    return problems


def unpinned(manifest: Manifest) -> list[str]:
    """Fields that must be pinned before a manifest is shared for reproduction, one line each."""
    where = display_path(manifest.path)
    out = []
    for name in manifest.build_names():  # every build's source
        src, at = manifest.for_build(name).llama_cpp, f"builds.{name}.llama_cpp" if name else "llama_cpp"
        if src.sdist is None and not (src.git and src.git.commit):
            out.append(f"{where}: {at}: pin a source: an sdist with sha256, or git.commit (a ref can move)")
        if src.path is not None and src.sdist is None and src.git is None:
            out.append(f"{where}: {at}.path: a local folder cannot be reproduced elsewhere")
    for m in manifest.models.values():
        if not m.sha256:
            out.append(f"{where}: models.{m.key}.sha256: not pinned")
        if m.hf and not m.hf.revision:
            out.append(f"{where}: models.{m.key}.hf.revision: not pinned (a branch can move)")
    out += [f"{d.suite.field}.sha256: not pinned (the suite file {d.suite.file})" for d in manifest.suites
            if not d.suite.sha256]
    firsts: dict[int, Task] = {}
    for t in manifest.tasks:  # an expanded entry's prompts once
        firsts.setdefault(t.entry, t)
    for i, t in firsts.items():
        for j, p in enumerate(t.prompts):
            if p.source is not None:
                continue  # a suite's question: its file is pinned (or named above), its text's sha256 is recorded
            if not p.sha256:
                at = f"tasks[{i}].sha256" if len(t.prompts) == 1 else f"tasks[{i}].prompts[{j}].sha256"
                out.append(f"{where}: {at}: not pinned ({t.family}" + (f"/{p.id})" if len(t.prompts) > 1 else ")"))
    return out
