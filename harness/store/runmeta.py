"""run.json: what a run measured and how, written once at the start (typed, normalised from the manifest) and
read back by the stages after the run (summary, report, bundle, compare), which never parse the manifest again.

Format 1 (before strategies and tasks were normalised into run.json) is upgraded on read from the manifest text
it carries."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from pathlib import PurePosixPath
from typing import Any, TypedDict

from harness import KitError, schema
from harness.formatter import console
from harness.intake import spec_types
from harness.intake.bounded_yaml import parse_yaml
from harness.intake.manifest import Distribution, Hardware, Sampling
from harness.models.passbytes import ModelReads
from harness.store.buildrecord import BuildRecord

#: A run makes at most this many measurements, planned rounds, rounds --until adds and confirmation rounds
#: together (a run of a few seconds per measurement would take weeks); a run folder that lists more is refused.
MAX_MEASUREMENTS = 100_000


@dataclass(frozen=True)
class StrategyMeta(spec_types.StrategyFields):
    id: str
    spec_type: str
    draft: str | None
    model: str
    baseline: str | None  # the strategy this one's speedup is against (resolved), None for a baseline itself
    args: tuple[str, ...] = ()
    label: str | None = None
    parallel: int = 1
    family: str | None = None  # the manifest entry a sweep or a list of levels expanded it from
    sweep: tuple[tuple[str, str], ...] = ()  # this combination's (flag, value) pairs
    build: str | None = None  # the build it ran on (a key of RunMeta.builds; None: the run's one build)


@dataclass(frozen=True)
class PromptMeta:
    id: str
    file: str  # relative to the manifest's folder
    sha256: str


@dataclass(frozen=True)
class TaskMeta:
    id: str
    n_predict: int
    prompts: tuple[PromptMeta, ...]
    perturbation: bool = False
    depth: int = 0  # tokens of filler before the prompt (harness/run/filler.py)
    dims: tuple[tuple[str, int], ...] = ()  # the dimensions listed on its entry (harness/intake/dimensions.py)


#: The purpose of the rounds that confirm a sweep's best combinations.
CONFIRM = "confirm"


@dataclass(frozen=True)
class AddedRound:
    """A round added after the planned ones with the cells it measures ([host, strategy, task]): by --until
    (purpose None), or one of the confirmation rounds after a sweep (purpose "confirm", naming the combinations it
    confirms)."""

    round: int
    cells: tuple[tuple[str, str, str], ...]
    purpose: str | None = None
    combinations: tuple[str, ...] | None = None

    @property
    def confirms(self) -> bool:
        return self.purpose == CONFIRM

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"round": self.round, "cells": [list(c) for c in self.cells]}
        if self.purpose is not None:
            out["purpose"] = self.purpose
        if self.combinations is not None:
            out["combinations"] = list(self.combinations)
        return out

    @classmethod
    def from_json(cls, x: dict[str, Any], where: str) -> AddedRound:
        """One entry of plan.extra_rounds, its round and cells checked by the schema."""
        purpose, combos = x.get("purpose"), x.get("combinations")
        if purpose is not None and purpose != CONFIRM:
            raise KitError(f"{where}.purpose: {console(repr(purpose), 80)}, expected {CONFIRM!r} or none")
        if combos is not None and not (isinstance(combos, list) and all(isinstance(c, str) for c in combos)):
            raise KitError(f"{where}.combinations: expected a list of strategy ids")
        return cls(x["round"], tuple((h, s, t) for h, s, t in x["cells"]), purpose,
                   None if combos is None else tuple(combos))


@dataclass(frozen=True)
class PlanMeta:
    strategies: list[str]
    tasks: list[str]
    runs: int
    shuffle_seed: int
    hosts: list[str]
    measurements: int
    aa_control: bool = False
    until: float | None = None  # target relative half-width of every speedup interval (invoke run --until)
    max_rounds: int | None = None
    #: At most this many disturbed measurements are measured again (None: a run made before retakes; none).
    retake_cap: int | None = None
    #: Rounds added after the planned ones, each with the cells it runs ([host, strategy, task]), in order: by
    #: --until, or (with "purpose": "confirm") the confirmation of a sweep's best two combinations.
    extra_rounds: list[AddedRound] = field(default_factory=list)
    #: Confirmation rounds after a sweep (0: none).
    confirm_rounds: int = 0
    #: Before each timed request, wait at most this long for other work on the host to fall below the disturbance
    #: threshold (None: no wait; harness/run/interference.py).
    quiet_wait_s: float | None = None
    #: The sampling study (harness/run/sampling.py `Study.as_meta`): settings and arms; None without one.
    distribution: StudyMeta | None = None

    def confirm_from(self) -> int | None:
        """The first confirmation round, None when none was added."""
        return next((x.round for x in self.extra_rounds if x.confirms), None)


@dataclass(frozen=True)
class ArmMeta:
    """One arm of the sampling study: a strategy's server sampled at a temperature and top-k from a first seed; a
    baseline arm is its own `baseline`, every other arm is compared with one."""

    id: str
    strategy: str
    role: str  # baseline, reference (the baseline with other seeds), control (at other settings), strategy
    temperature: float
    top_k: int | None
    first_seed: int
    baseline: str


@dataclass(frozen=True)
class StudyMeta:
    """The sampling study a run planned (run.json plan.distribution; harness/run/study.py): its settings (the
    manifest's record: temperature, samples, tokens, prompts, control, ...), its arms, and the batches and requests
    they make. The file holds the settings and the rest side by side."""

    settings: Distribution
    arms: tuple[ArmMeta, ...]
    batches: int | None = None
    requests: int | None = None

    @property
    def rounds(self) -> int:
        """Batches per arm, prompt and host."""
        return -(-self.settings.samples // self.settings.batch)

    def arm(self, arm_id: str) -> ArmMeta | None:
        return next((a for a in self.arms if a.id == arm_id), None)

    def to_json(self) -> dict[str, Any]:
        d = self.settings
        out = {"temperature": d.temperature, "top_k": d.top_k, "samples": d.samples, "tokens": d.tokens,
               "prefix": d.prefix, "batch": d.batch, "seed": d.seed, "control": {d.control[0]: d.control[1]},
               "prompts": [list(p) for p in d.prompts], "arms": [asdict(a) for a in self.arms],
               "batches": self.batches, "requests": self.requests}
        return {k: v for k, v in out.items() if not (k in ("batches", "requests") and v is None)}

    @classmethod
    def from_json(cls, x: dict[str, Any]) -> StudyMeta:
        """From run.json (its types checked by the schema); the strategies sampled are those of its arms."""
        arms = tuple(_known(ArmMeta, a) for a in x["arms"])
        kind, value = next(iter(x["control"].items()))
        settings = Distribution(x["temperature"], x.get("top_k"), x["samples"], x["tokens"], x["prefix"], x["batch"],
                                x["seed"], tuple((t, p) for t, p in x["prompts"]),
                                tuple(a.strategy for a in arms if a.role == "strategy"), (kind, value))
        return cls(settings, arms, x.get("batches"), x.get("requests"))


@dataclass(frozen=True)
class ManifestMeta:
    """The manifest a run was made from: its name, the path it was read at (as recorded), its hash, its text."""

    name: str
    path: str
    sha256: str
    text: str


class HubFile(TypedDict):
    repo: str
    file: str
    revision: str | None


class ModelSource(TypedDict, total=False):
    """Where a model file came from: one of a Hugging Face file, the kit's generator (its kind, seed and shape
    keywords) or the manifest's own file name."""

    hf: HubFile
    generate: dict[str, int | float | str | None]
    file: str


class _HardwareRequired(TypedDict):
    name: str
    memory_bandwidth_gbs: float
    bandwidth_source: str
    memory_gb: float | None


class HardwareJson(_HardwareRequired, total=False):
    """The manifest's hardware as run.json and summary.json keep it (software_device only where it is set)."""

    software_device: bool


@dataclass(frozen=True)
class ModelMeta:
    """A model file as run.json records it: name, hash, size, where it came from (never a local path) and what one
    pass reads (None for a file that is not GGUF)."""

    file: str
    sha256: str
    size_bytes: int
    quantization: str | None = None
    source: ModelSource = field(default_factory=lambda: ModelSource())
    reads: ModelReads | None = None

    @classmethod
    def from_json(cls, x: dict[str, Any]) -> ModelMeta:
        reads = x.get("reads")
        return cls(x["file"], x["sha256"], x["size_bytes"], x.get("quantization"), x.get("source") or {},
                   ModelReads(**reads) if reads else None)


class GpuFacts(TypedDict):
    """A GPU as nvidia-smi reports it on the host."""

    name: str
    driver: str
    memory_mib: float | None  # None on unified-memory parts (the GB10 says [N/A])
    utilization_pct: float | None


class _ImageFactsRequired(TypedDict):
    tag: str
    id: str | None


class ImageFacts(_ImageFactsRequired, total=False):
    """The image the run measured with, as the host's engine has it (id None: the engine did not have it)."""

    labels: dict[str, str]


@dataclass(frozen=True)
class HostFacts:
    """One host as the run found it (harness/hosts/environment.py `facts`): machine, Docker engine, GPUs, the
    image, and for a GPU backend its devices (harness/hosts/devices.py `Setup.facts`)."""

    host: str | None = None
    hostname: str | None = None
    kernel: str | None = None
    os: str | None = None
    architecture: str | None = None
    cpu_model: str | None = None
    cpus: int | None = None
    memory_bytes: int | None = None
    docker_version: str | None = None
    docker_api_version: str | None = None
    cgroup_version: str | None = None
    runtimes: list[str] = field(default_factory=list)
    gpus: list[GpuFacts] = field(default_factory=list)
    image: ImageFacts | None = None
    devices: dict[str, Any] | None = None  # a GPU backend's: the access, what the image saw, the chosen index

    def gpu_names(self) -> list[str]:
        return [str(g["name"]) for g in self.gpus]

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not (k in ("image", "devices") and v is None)}


@dataclass(frozen=True)
class MeasuredBandwidth:
    """A memory bandwidth `invoke probe` measured on a host (the physics check uses it instead of the manifest's)."""

    gbs: float | None = None
    kind: str | None = None  # cpu-stream, cuda-copy, ggml-copy
    host: str | None = None
    measured_at: str | None = None
    device: str | None = None  # the device llama.cpp's backend measured, where it says

    def on(self, host: str) -> bool:
        """Whether this measurement holds for `host`."""
        return bool(self.gbs) and self.host in (None, host)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Interruption:
    """A run stopped before its end: when, after how many measurements (and sampling batches)."""

    at: str
    done: int
    batches: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class RunMeta:
    run_id: str
    created_at: str
    status: str
    protocol: str
    kit_version: str
    manifest: ManifestMeta
    hardware: Hardware  # the manifest's record, as it was when the run was made
    sampling: Sampling
    endpoint: str
    strategies: list[StrategyMeta]
    tasks: list[TaskMeta]
    models: dict[str, ModelMeta]
    build: BuildRecord
    environment: dict[str, HostFacts]
    plan: PlanMeta
    bandwidth: MeasuredBandwidth | None = None
    interruptions: list[Interruption] = field(default_factory=list)
    updated_at: str | None = None
    format_version: int = schema.FORMAT_VERSIONS["run"]
    #: A run of several builds: each build's record by name (`build` is the first's); empty for one build.
    builds: dict[str, BuildRecord] = field(default_factory=dict)
    #: `turns: all`: what run.json says of answers.json (harness/store/answers.py); None without one.
    answers: dict[str, Any] | None = None

    # -- lookups
    def strategy(self, sid: str) -> StrategyMeta:
        return next(s for s in self.strategies if s.id == sid)

    def task(self, tid: str) -> TaskMeta:
        return next(t for t in self.tasks if t.id == tid)

    def planned_strategies(self) -> list[StrategyMeta]:
        return [self.strategy(s) for s in self.plan.strategies]

    def planned_tasks(self) -> list[TaskMeta]:
        return [self.task(t) for t in self.plan.tasks]

    def build_records(self) -> dict[str | None, BuildRecord]:
        """Each build's record by name ({None: build} for a run of one build)."""
        return dict(self.builds) or {None: self.build}

    def baselines(self) -> list[str]:
        """Ids of the planned strategies that are a baseline (no speculation)."""
        return [s.id for s in self.planned_strategies() if not s.speculative]

    # -- the file
    def hardware_json(self) -> HardwareJson:
        """The hardware record as run.json and summary.json hold it."""
        out = HardwareJson(**asdict(self.hardware))
        if not self.hardware.software_device:  # a run on a real device keeps the file it always had
            del out["software_device"]
        return out

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["hardware"] = self.hardware_json()
        out["build"] = self.build.to_json()
        out["environment"] = {h: e.to_json() for h, e in self.environment.items()}
        out["bandwidth"] = self.bandwidth.to_json() if self.bandwidth else None
        out["builds"] = {name: r.to_json() for name, r in self.builds.items()}
        out["interruptions"] = [x.to_json() for x in self.interruptions]
        for s in out["strategies"]:
            s["args"] = list(s["args"])
            s["sweep"] = [list(pair) for pair in s["sweep"]]
            if s["build"] is None:  # a run of one build reads as before
                del s["build"]
        if not out["builds"]:
            del out["builds"]
        if out["answers"] is None:  # a run without a suite's later turns keeps the file it always had
            del out["answers"]
        for t in out["tasks"]:
            t["prompts"] = list(t["prompts"])
            for k in ("depth", "dims"):  # a task without dimensions reads as before
                if not t[k]:
                    del t[k]
            if "dims" in t:
                t["dims"] = [list(pair) for pair in t["dims"]]
        out["plan"]["extra_rounds"] = [x.to_json() for x in self.plan.extra_rounds]
        if self.plan.distribution is None:  # a run without a sampling study keeps the file it always had
            del out["plan"]["distribution"]
        else:
            out["plan"]["distribution"] = self.plan.distribution.to_json()
        order = ["format_version", "run_id", "created_at", "updated_at", "status", "protocol", "kit_version"]
        return {k: out[k] for k in order if out[k] is not None} | {k: v for k, v in out.items() if k not in order}

    @classmethod
    def from_json(cls, obj: dict[str, Any], where: str) -> RunMeta:
        obj = schema.read("run", obj, where)
        check_references(obj, where)
        return cls(
            run_id=obj["run_id"], created_at=obj["created_at"], status=obj["status"], protocol=obj["protocol"],
            kit_version=obj.get("kit_version", "?"), manifest=_known(ManifestMeta, obj["manifest"]),
            hardware=_known(Hardware, obj["hardware"]), sampling=_known(Sampling, obj.get("sampling", {})),
            endpoint=obj.get("endpoint", "completion"),
            strategies=[StrategyMeta(**{**s, "args": tuple(s.get("args", ())),
                                        "sweep": tuple(tuple(x) for x in s.get("sweep", ()))})
                        for s in obj["strategies"]],
            tasks=[TaskMeta(t["id"], t["n_predict"], tuple(PromptMeta(**p) for p in t["prompts"]),
                            bool(t.get("perturbation", t.get("probe", False))), int(t.get("depth", 0)),
                            tuple((str(k), int(v)) for k, v in t.get("dims", ()))) for t in obj["tasks"]],
            models={k: ModelMeta.from_json(m) for k, m in obj["models"].items()},
            build=BuildRecord.from_json(obj["build"], f"{where}: build"),
            environment={h: _known(HostFacts, e) for h, e in obj["environment"].items()},
            plan=PlanMeta(**{k: obj["plan"][k] for k in ("strategies", "tasks", "runs", "shuffle_seed", "hosts")},
                          measurements=obj["plan"].get("measurements", 0),
                          aa_control=obj["plan"].get("aa_control", False), until=obj["plan"].get("until"),
                          max_rounds=obj["plan"].get("max_rounds"), retake_cap=obj["plan"].get("retake_cap"),
                          extra_rounds=[AddedRound.from_json(x, f"{where}: plan.extra_rounds[{k}]")
                                        for k, x in enumerate(obj["plan"].get("extra_rounds", []))],
                          confirm_rounds=obj["plan"].get("confirm_rounds", 0),
                          quiet_wait_s=obj["plan"].get("quiet_wait_s"),
                          distribution=StudyMeta.from_json(obj["plan"]["distribution"])
                          if obj["plan"].get("distribution") else None),
            bandwidth=_known(MeasuredBandwidth, obj["bandwidth"]) if obj.get("bandwidth") else None,
            interruptions=[_known(Interruption, x) for x in obj.get("interruptions", [])],
            updated_at=obj.get("updated_at"),
            builds={n: BuildRecord.from_json(r, f"{where}: builds.{n}") for n, r in obj.get("builds", {}).items()},
            answers=obj.get("answers"))


def _known(cls: Any, x: dict[str, Any]) -> Any:
    """A record of run.json (its types checked by the schema) as its dataclass; keys the kit does not know are
    left out (a later kit's additions, or someone's)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in x.items() if k in names})


def check_references(obj: dict[str, Any], where: str) -> None:
    """What a schema cannot say about a run.json that may come from someone else: every name it uses is one it
    defines (strategies, tasks, models), and its build record is one. One line on the first problem."""
    schema.check("build", obj["build"], f"{where}: build")
    for name, record in (obj.get("builds") or {}).items():
        schema.check("build", record, f"{where}: builds.{name}")
    strategies = [s["id"] for s in obj["strategies"]]
    tasks = [t["id"] for t in obj["tasks"]]
    for kind, ids in (("strategies", strategies), ("tasks", tasks)):
        dup = next((x for x in ids if ids.count(x) > 1), None)
        if dup is not None:
            raise KitError(f"{where}: {kind}: the id {dup!r} appears twice")
        unknown = [x for x in obj["plan"][kind] if x not in ids]
        if unknown:
            raise KitError(f"{where}: plan.{kind}: {unknown[0]!r} is not one of the run's {kind}")
    study = obj["plan"].get("distribution") or {}
    for i, arm in enumerate(study.get("arms", [])):
        if arm["strategy"] not in strategies:
            raise KitError(f"{where}: plan.distribution.arms[{i}].strategy: {arm['strategy']!r} is not a strategy id")
    prompts = {(t["id"], p["id"]) for t in obj["tasks"] for p in t["prompts"]}
    for i, pair in enumerate(study.get("prompts", [])):
        if tuple(pair) not in prompts:
            raise KitError(f"{where}: plan.distribution.prompts[{i}]: {'/'.join(pair)!r} is not a prompt of the "
                           "run's tasks")
    for i, s in enumerate(obj["strategies"]):
        for key in ("model", "draft"):
            if s[key] is not None and s[key] not in obj["models"]:
                raise KitError(f"{where}: strategies[{i}].{key}: {s[key]!r} is not a key of models")
        if s["baseline"] is not None and s["baseline"] not in strategies:
            raise KitError(f"{where}: strategies[{i}].baseline: {s['baseline']!r} is not a strategy id")
        if s.get("build") is not None and s["build"] not in (obj.get("builds") or {}):
            raise KitError(f"{where}: strategies[{i}].build: {s['build']!r} is not a key of builds")


@schema.upgrade("run", 1)
def _from_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """Format 1 kept only the manifest's text: normalise strategies, tasks, hardware from it."""
    obj = copy.deepcopy(obj)
    raw = parse_yaml(obj["manifest"]["text"], "run.json manifest.text")
    prompts = obj["manifest"].pop("prompts", {})
    first_none = next((s["id"] for s in raw["strategies"] if not spec_types.is_speculative(s["spec_type"])), None)
    obj["strategies"] = [{"id": s["id"], "spec_type": s["spec_type"], "draft": s.get("draft"), "model": "target",
                          "baseline": first_none if spec_types.is_speculative(s["spec_type"]) else None,
                          "args": list(s.get("args", [])), "label": s.get("label"),
                          "parallel": int(s.get("parallel", 1))} for s in raw["strategies"]]
    obj["tasks"] = [{"id": t["id"], "n_predict": t["n_predict"],
                     "prompts": [{"id": t["id"], "file": PurePosixPath(t["prompt_file"]).as_posix(),
                                  "sha256": prompts.get(t["id"], t.get("sha256") or "")}]} for t in raw["tasks"]]
    hw = raw["hardware"]
    obj["hardware"] = {"name": hw["name"], "memory_bandwidth_gbs": hw["memory_bandwidth_gbs"],
                       "bandwidth_source": hw["bandwidth_source"], "memory_gb": hw.get("memory_gb")}
    sp = raw.get("sampling", {})
    obj["sampling"] = {"temperature": sp.get("temperature", 0.0), "seed": sp.get("seed", 42),
                       "top_k": sp.get("top_k")}
    obj["endpoint"] = raw.get("endpoint", "completion")
    for m in obj.get("models", {}).values():
        m.setdefault("quantization", None)
        m.setdefault("source", {})
        if "path" in m["source"]:
            m["source"] = {"file": m["file"]}
    obj["format_version"] = 2
    return obj


@schema.upgrade("result", 1)
def _result_from_v1(rec: dict[str, Any]) -> dict[str, Any]:
    """Format 1 records had one prompt per task and one target: name them."""
    rec = dict(rec)
    rec.setdefault("model", "target")
    rec.setdefault("prompt", rec.get("task"))  # a record without a task is named by the schema check
    if isinstance(rec.get("quiet"), dict):
        q = dict(rec["quiet"])
        q["warnings"] = [{"kind": "busy", "sentence": w} if isinstance(w, str) else w for w in q.get("warnings", [])]
        rec["quiet"] = q
    rec["format_version"] = 2
    return rec
