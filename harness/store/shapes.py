"""The shape of summary.json and compare.json: what harness/analysis writes and harness/report reads, the run's
summary, its cells and the figures in them (schemas/summary.schema.json is the contract; tests/test_analysis.py
holds these keys against it, against the summaries of the committed runs and against their comparisons).

Section by section: the cells, the sampling study's table (harness/analysis/lossless.py), why a speedup is what it
is, sweeps and serving curves, the builds compared, the printed table's family, compare.json."""

from typing import Any, NotRequired, TypedDict

from harness.models.passbytes import PassBytesJson
from harness.store.runmeta import HardwareJson


class Described(TypedDict):
    """A list of figures described (`summary.describe`): the schema's `stats`."""

    n: int
    median: float | None
    min: float | None
    max: float | None
    spread_pct: float | None
    stdev: float | None


class IntervalJson(TypedDict):
    """An interval as summary.json and compare.json keep it (`inference.Interval`, rounded, with its note)."""

    low: float | None
    high: float | None
    n: int
    method: str
    df: float | None
    moderated: bool
    note: str
    scope: NotRequired[str]  # a geometric mean's interval over tasks like these


class BoundsJson(TypedDict):
    """An interval's ends at a stated confidence (a family-level interval beside the 95% one)."""

    low: float | None
    high: float | None
    confidence: float | None


class VerdictJson(TypedDict):
    """A cell's or a geometric mean's verdict: its kind, the rule in words and the tests' figures;
    `family_interval` its interval at the family's first Holm step (None where not judged)."""

    kind: str
    rule: str
    p_differs: float | None
    p_within: float | None
    p_adjusted: float | None
    family: int
    smallest_marked: float | None
    family_interval: BoundsJson | None


class Failure(TypedDict):
    """A failed measurement of a cell."""

    run_index: int
    prompt: int
    reason: str


class DisturbedEvidence(TypedDict):
    """Other work disturbed some of a cell's runs: which, whether the host was kept busy, what was retaken."""

    runs: list[int]
    kept: bool
    busy: list[str] | None
    retaken: int
    others_cores: list[float | None]


class FewRoundsEvidence(TypedDict):
    rounds: int
    needed: int


class DispersionEvidence(TypedDict):
    cv: float
    normalised_cv: float
    runs: int
    series: list[float]


class OutlierEvidence(TypedDict):
    """A run (the first, or another) far from the unit's other runs, against the host's pooled noise."""

    run: int
    order: int
    tok_s: float
    deviation: float
    z: float | None
    pooled_sd: float
    series: list[float]


#: What a stability warning rests on, by its kind (harness/analysis/stability.py).
Evidence = DisturbedEvidence | FewRoundsEvidence | DispersionEvidence | OutlierEvidence


class CellWarning(TypedDict):
    """A warning on a cell (`stats.Warning`): its kind, the sentence and the figures behind it."""

    kind: str
    sentence: str
    evidence: Evidence


class FingerprintJson(TypedDict):
    """What must not change between identical requests at temperature 0: draft counts and output hashes."""

    drafts: list[list[int]]
    outputs: list[str]
    identical: bool
    output_changed_at: int | None


class TrendJson(TypedDict):
    n: int
    tau: float | None
    p: float | None
    change: float | None
    noise: float | None
    testable: bool
    p_holm: float | None


class ContaminationEvidence(TypedDict):
    """What a unit's contamination verdict rests on (harness/analysis/contamination.py)."""

    protocol: str
    fingerprint: FingerprintJson
    acceptance: list[float | None]
    series: list[float]
    normalised: list[float]
    round_factors: list[float]
    order: list[int]
    normalised_cv: float | None
    trend: TrendJson
    noise_p_holm: float | None
    family: int
    prompt: NotRequired[str]


class ContaminationData(ContaminationEvidence):
    kind: str


class PhysicsData(TypedDict):
    """The roofline check's figures: implied target passes per second against what the bandwidth allows."""

    tok_s: float
    tokens_per_pass: float
    implied_passes_s: float
    ceiling_passes_s: float
    fraction: float
    bandwidth_gbs: float
    bandwidth_source: str
    weight_bytes: float
    bytes_per_pass: int
    pass_bytes: PassBytesJson | None
    rule: str


class DeterminismData(TypedDict):
    """Byte match against the baseline; where it diverges, the token and the baseline's margin there."""

    identical: bool
    first_divergent_token: NotRequired[int | None]
    baseline_token: NotRequired[str | None]
    other_token_id: NotRequired[int | None]
    margin: NotRequired[float]
    margin_rank: NotRequired[int | None]
    positions: NotRequired[int]
    runs_identical: NotRequired[int]  # a cell's runs
    runs: NotRequired[int]
    baseline: NotRequired[str]


class SpeculationData(TypedDict):
    """Whether a speculative strategy's server drafted at all."""

    drafted: int
    runs: int
    implementations: list[str]


class Check(TypedDict):
    """One check's outcome on a cell (contamination, physics, determinism, speculation)."""

    check: str
    flagged: bool
    sentence: str
    data: ContaminationData | PhysicsData | DeterminismData | SpeculationData


class DeviceUse(TypedDict):
    """Where a cell's measurements ran (GPU backends): the devices, the layers offloaded, device memory."""

    devices: list[str]
    target_layers: str | None
    draft_layers: str | None
    device_mib: Described
    runs: int
    runs_without_device: int


class CellSummary(TypedDict):
    """One (host, strategy, task) cell of a run's summary."""

    host: str
    strategy: str
    spec_type: str
    model: str
    task: str
    baseline: str | None
    runs_ok: int
    runs_used: int
    runs_failed: int
    retakes: int
    failures: list[Failure]
    decode_tok_s: Described
    decode_tok_s_interval: IntervalJson | None
    server_decode_tok_s: Described
    prefill_tok_s: Described
    ttft_s: Described
    load_s: Described
    memory_peak_mb: Described
    draft_n: int
    draft_n_accepted: int
    acceptance: float | None
    tokens_per_pass: Described
    series: list[float | None]
    streams: int
    aggregate_tok_s: Described
    per_stream_tok_s: Described
    speedup: float | None
    speedup_interval: IntervalJson | None
    verdict: VerdictJson | None
    paired_rounds: dict[str, float | None]
    warnings: list[CellWarning]
    checks: dict[str, Check]
    server_mean_len: Described
    device: NotRequired[DeviceUse]  # GPU backends


class Missing(TypedDict):
    """A cell with fewer measurements than planned."""

    host: str
    strategy: str
    task: str
    recorded: int
    expected: int


class Geomean(TypedDict):
    """A strategy's geometric-mean speedup over the tasks, on one host: its interval for these prompts (what the
    mark judges) and, beside it, for tasks like these."""

    host: str
    strategy: str
    estimate: float | None
    interval: IntervalJson | None
    interval_scope: str
    between_tasks: IntervalJson | None  # with its scope and note
    verdict: VerdictJson
    tasks: list[str]
    left_out: list[str]


class ManifestRef(TypedDict):
    name: str
    sha256: str


class StrategyRef(TypedDict):
    id: str
    spec_type: str
    model: str
    baseline: str | None
    build: NotRequired[str]


class Counts(TypedDict):
    """How many measurements the run folder holds, of which kinds, against the plan."""

    recorded: int
    ok: int
    failed: int
    retakes: int
    retake_pairs: int
    planned: int
    torn_last_line: bool
    torn_samples_line: NotRequired[bool]


class HostInterference(TypedDict):
    """Per host: how many measurements other work disturbed, how much it used, and how many were retaken."""

    measured: int
    disturbed: int
    kept: bool
    retaken: int
    others_cores_median: float | None
    others_cores_max: float | None
    disturbed_ids: list[str]


class CheckRan(TypedDict):
    """One check, whether it found anything or not."""

    check: str
    found: int
    sentence: str


class DeterminismTotal(TypedDict):
    """A speculative strategy on a host: in how many tasks its outputs matched its baseline's."""

    host: str
    strategy: str
    identical: int
    tasks: int


class QuietWaitSummary(TypedDict):
    """A run that waited for a quiet host before its measurements (--quiet-wait)."""

    bound_s: float
    measurements: int
    waited_median_s: float | None
    waited_max_s: float | None
    bound_reached: int


# ----------------------------------------------------------- the sampling study (harness/analysis/lossless.py)


class Divergence(TypedDict):
    """Where a sample leaves the baseline's with the same seed (see `_divergence`)."""

    seed: int
    position: int
    baseline_token: int | None
    baseline_rank: int | None
    token: int | None
    rank: int | None
    baseline_logprob: float | None
    logprob: float | None


class SeededEquality(TypedDict):
    """Stage 1 of a strategy's row."""

    paired: int
    identical: int
    divergent: list[Divergence]


class TwoSampleTest(TypedDict):
    """One test of stage 2: its p-value (None: not run, `note` says why), Holm-adjusted in the family."""

    name: str
    p: float | None
    categories: int | None
    note: str | None
    data: NotRequired[str]  # what it compares, while the family is judged
    p_adjusted: NotRequired[float | None]  # set when the family is judged
    rejected: NotRequired[bool | None]


class TotalVariation(TypedDict):
    """The plug-in total-variation distance over the pooled categories, with its basic bootstrap interval."""

    estimate: float
    low: float
    high: float
    categories: int


class StudyRow(TypedDict):
    """One row of the study's table: an arm (a strategy, the baseline's A/A arm, the control) on one prompt."""

    host: str
    task: str
    prompt: str
    arm: str
    strategy: str | None
    kind: str  # "strategy", "aa" or "control"
    vs: str
    baseline: str
    samples: int
    reference_samples: int
    stage1: SeededEquality | None
    verification: str | None
    drafted: int | None
    spec_type: NotRequired[str]
    tests: list[TwoSampleTest]
    tv: TotalVariation | None
    # set when the family is judged
    p_adjusted: NotRequired[float | None]
    verdict: NotRequired[str]
    detectable_tv: NotRequired[float | None]


class StudyFamily(TypedDict):
    tests: int
    method: str
    alpha: float
    permutations: int


class BatchCounts(TypedDict):
    planned: int
    ok: int
    failed: int


class StudySettings(TypedDict):
    """The manifest's distribution settings the study drew with (intake/manifest.py `Distribution`)."""

    temperature: float
    top_k: int | None
    samples: int
    tokens: int
    prefix: int
    batch: int
    seed: int
    control: dict[str, float | int]  # the positive control's one changed setting


class StudySummary(TypedDict):
    """The study's table as summary.json keeps it."""

    settings: StudySettings
    rows: list[StudyRow]
    family: StudyFamily
    power: bool | None  # every control row found its difference; None without a judged control
    batches: BatchCounts
    samples: int
    tokens: int


class ComparedRow(TypedDict):
    """A row both runs judged: its verdict in each."""

    host: str
    task: str
    prompt: str
    arm: str
    kind: str
    a: str
    b: str
    p_adjusted_b: float | None
    changed: bool


class OneSideRow(TypedDict):
    """A row only one run judged (its arm, task or prompt absent from the other): named, never compared."""

    side: str
    host: str
    task: str
    prompt: str
    arm: str
    verdict: str


class StudyComparison(TypedDict):
    """Two runs' distribution verdicts row by row (`compare`)."""

    only: str | None
    rows: list[ComparedRow]
    changed: int
    same: int
    missing: NotRequired[list[OneSideRow]]
    settings_a: NotRequired[StudySettings]
    settings_b: NotRequired[StudySettings]


# ------------------------------------------------------- why faster or slower (harness/analysis/explanation.py)


class FactorJson(TypedDict):
    """A factor of the speedup (tokens per pass, pass rate) with its interval."""

    estimate: float
    low: float | None
    high: float | None
    n: int


class DecompositionJson(TypedDict):
    """A cell's speedup as tokens per pass x pass rate, and the cause that decides it (decomposition.py)."""

    host: str
    strategy: str
    task: str
    speedup: float
    tokens_per_pass: FactorJson
    pass_rate: FactorJson
    rounds: int
    cause: str
    acceptance: float | None
    offered_tokens_per_pass: float
    step_cost_passes: float
    draft_share: float | None
    verify_pass_ms: float | None
    baseline_pass_ms: float | None


class MeanLen(TypedDict):
    n: int
    median: float | None
    min: float | None
    max: float | None


class PositionCounts(TypedDict):
    """Acceptance by draft position (acceptance.py `Positions`)."""

    calls: int
    shares: list[float]
    accepted_hist: list[int]
    requests: int
    requests_without: int
    sources: list[str]
    mean_len: MeanLen


class PositionFigures(PositionCounts):
    """A strategy's acceptance by draft position over its tasks."""

    host: str
    strategy: str


class CellPositions(PositionFigures):
    task: str


class PositionsJson(TypedDict):
    cells: list[CellPositions]
    strategies: list[PositionFigures]  # a strategy over its tasks
    requests_without: int
    note: str | None


class RequestFigures(TypedDict):
    """Median draft counts and tok/s of some requests."""

    drafted: float | None
    accepted: float | None
    acceptance: float | None
    tok_s: float | None
    drafted_range: list[int] | None


class ServerRequest(RequestFigures):
    """A reused server's request, by its index in the server."""

    server: int
    host: str
    strategy: str
    index: int
    task: str
    prompt: str
    ok: bool


class PromptFigures(RequestFigures):
    """A speculative strategy's prompt over the runs that count."""

    host: str
    strategy: str
    task: str
    prompt: str
    runs: int


class RequestsJson(TypedDict):
    servers: list[ServerRequest]
    prompts: list[PromptFigures]


class Explanation(TypedDict):
    """The summary's `decomposition`, `positions` and `requests` parts."""

    decomposition: list[DecompositionJson]
    positions: PositionsJson
    requests: RequestsJson


# ---------------------------------------------------------------- sweeps and serving (harness/analysis/tuning.py)


class FigureJson(TypedDict):
    """A positive figure with its 95% interval over `rounds` rounds (`inference.Figure`)."""

    estimate: float | None
    low: float | None
    high: float | None
    rounds: int


class CandidateJson(TypedDict):
    """A swept combination against the best of its scope."""

    combination: str
    figure: FigureJson
    vs_best: FigureJson
    p: float | None
    p_holm: float | None
    distinguishable: bool


class SelectionJson(TypedDict):
    """The best combination of a scope (a task, or all: task None) and every combination against it."""

    task: str | None
    best: str
    tied: list[str]
    candidates: list[CandidateJson]


class ConfirmationJson(TypedDict):
    """The best two in the rounds after the sweep."""

    rounds: list[int]
    winner: str
    runner_up: str | None
    winner_figure: FigureJson
    runner_up_figure: FigureJson
    winner_tasks: dict[str, FigureJson]
    runner_up_tasks: dict[str, FigureJson]
    winner_vs_runner_up: FigureJson


class SweepJson(TypedDict):
    """A swept entry (`sweep.SweepResult`), with each combination's flag values."""

    family: str
    host: str
    combinations: list[str]
    overall: SelectionJson | None
    tasks: list[SelectionJson]
    confirmation: ConfirmationJson | None
    winner: str | None
    decided_by: str | None
    best_two: list[str | None] | None
    values: NotRequired[dict[str, list[list[str | int | float]]]]


class PointJson(TypedDict):
    """A strategy at N clients (`serving.Point`)."""

    strategy: str
    streams: int
    aggregate_tok_s: FigureJson
    per_stream_tok_s: float | None
    tpot_ms: float | None
    ttft_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    speculating: bool | None
    measurements: int


class LevelJson(TypedDict):
    streams: int
    speculative_streams: int | None
    ratio: FigureJson


class CrossoverJson(TypedDict):
    """Where batching overtakes one speculative strategy (`serving.Crossover`)."""

    strategy: str
    baseline: str
    levels: list[LevelJson]
    overtaken_at: int | None
    estimate_below_at: int | None
    ahead_at: list[int]
    not_shown_at: list[int]


class ServingJson(TypedDict):
    """One host's serving curves and crossovers."""

    host: str
    curves: dict[str, list[PointJson]]
    crossovers: list[CrossoverJson]
    confirmation_rounds: dict[str, list[int]]


class DimensionPoint(TypedDict):
    """One value of a length or depth curve: its task's speedup cell (harness/analysis/dimensions.py)."""

    value: int
    task: str
    speedup: float | None
    low: float | None
    high: float | None
    mark: int  # +1 marked faster, -1 slower, 0 neither
    verdict: str | None
    rounds: int


class DimensionCrossover(TypedDict):
    """Where a curve's marks say it crosses 1 (`dimensions.Crossover`)."""

    kind: str  # none | one | several
    low: int | None
    high: int | None
    estimate: float | None
    rising: bool | None


class DimensionCurve(TypedDict):
    """A strategy's speedup on one manifest entry along output length or context depth."""

    host: str
    strategy: str
    task: str
    dimension: str  # n_predict | depth
    fixed: dict[str, int]
    points: list[DimensionPoint]
    crossover: DimensionCrossover


class Dimensions(TypedDict, total=False):
    """The summary's `dimensions` part: present only for a run with lengths or depths listed."""

    dimensions: list[DimensionCurve]
    rules_dimensions: str


class Tuning(TypedDict, total=False):
    """The summary's `sweeps` and `serving` parts: present only for a run with a sweep or several levels."""

    sweeps: list[SweepJson]
    rules_sweep: str
    confirmation_rounds: list[int]
    selection_rounds: list[int]
    serving: list[ServingJson]
    rules_serving: str


# ---------------------------------------------------------------- builds (harness/analysis/builds.py)


class BuildVerdict(TypedDict):
    kind: str
    p_differs: float | None
    p_within: float | None
    p_adjusted: float | None
    family: int
    family_interval: BoundsJson | None


class BuildFigure(TypedDict):
    """B/A of one strategy and task (task None: over the tasks) between two builds."""

    host: str
    strategy: str
    a: str
    b: str
    task: str | None
    estimate: float | None
    rounds: int
    interval: IntervalJson
    verdict: BuildVerdict
    tasks: NotRequired[list[str]]  # a geometric mean's tasks
    left_out: NotRequired[list[str]]


class BuildPower(TypedDict):
    """What a builds table's rounds could mark: the B/A below which a cell of median noise is marked ▼ about half
    the time."""

    rounds: int
    cells_below: float | None
    sentence: str


class TableFamily(TypedDict):
    cells: int
    geomeans: int
    tests: int
    method: str
    alpha: float
    power: NotRequired[BuildPower]


class BuildTable(TypedDict):
    cells: list[BuildFigure]
    geomeans: list[BuildFigure]
    family: TableFamily


class BuildDivergence(TypedDict):
    """Where B's output leaves A's, and A's top-2 margin there when its record has one."""

    first_divergent_token: int | None
    margin: float | None
    margin_rank: int | None
    sentence: str


class ChangedOutput(BuildDivergence):
    task: str
    prompt: str
    tokens: int | None


class OutputRow(TypedDict):
    """A strategy's outputs prompt by prompt on two builds."""

    host: str
    strategy: str
    speculative: bool
    prompts: int
    outputs_identical: int
    drafts_identical: int
    changed: list[ChangedOutput]


class OutputChanges(TypedDict):
    rows: list[OutputRow]
    greedy_changed: int
    greedy_compared: int
    sentence: str


class BuildComparison(TypedDict):
    """A later build against the first."""

    build: str
    against: str
    tok_s: BuildTable
    speedup: BuildTable
    output: OutputChanges


class BuildEntry(TypedDict):
    name: str
    tag: str
    image_id: str | None
    source: str
    cmake_args: list[str]
    strategies: list[str]


class BuildsJson(TypedDict):
    """The summary's `builds`: a run of several builds."""

    reference: str
    builds: list[BuildEntry]
    comparisons: list[BuildComparison]
    rule: str


# ---------------------------------------------------------------- the printed table's family and the run's extras


class PriorJson(TypedDict):
    """A variance prior the cells' variances were moderated with (`inference.Prior`)."""

    d0: float | None
    sd: float | None
    cells: int


class HostPriors(TypedDict):
    strategy: PriorJson
    baseline: PriorJson
    paired: PriorJson


class PowerJson(TypedDict):
    """What the table's rounds could mark (`speedups.Power`)."""

    family: int
    rounds: int
    cells: float | None
    noisiest_quarter: float | None
    geomeans: float | None
    rounds_for: dict[str, int | None]
    rounds_range: dict[str, list[int | None]]  # the rounds at the bounds of the median noise
    noise: float | None  # the median per-round variance of the paired log ratios the projection uses
    sentence: str


class ReachJson(TypedDict):
    """What a reproduction of the run can confirm (harness/analysis/reach.py): margins at best and with a B of the
    run's rounds, B's rounds for the default margins (None: out of reach), and the command that tightens them."""

    geomeans_best: float | None
    cells_best: float | None
    geomeans_same_rounds: float | None
    cells_same_rounds: float | None
    rounds: int
    margin: float
    cell_margin: float
    rounds_for_margin: int | None
    rounds_for_cell_margin: int | None
    command: str
    sentence: str


class FamilyJson(TypedDict):
    """The family the printed table's marks are judged in."""

    cells: int
    geomeans: int
    tests: int
    method: str
    alpha: float
    band: float
    priors: dict[str, HostPriors]
    power: PowerJson


class Variant(TypedDict):
    """A perturbation task's variant against its reference prompt, for one strategy."""

    host: str
    strategy: str
    task: str
    reference: str
    variant: str
    tok_s_ratio: float | None
    tok_s_ratio_interval: IntervalJson | None
    acceptance_reference: float | None
    acceptance_variant: float | None
    speedup_reference: float | None
    speedup_variant: float | None
    output_common_prefix_tokens: int | None
    output_tokens: int | None


class Unconverged(TypedDict):
    host: str
    strategy: str
    task: str
    rounds: int
    half_width: float | None
    rounds_estimate: int | None


class ConvergenceJson(TypedDict):
    """A run with --until: the target, the rounds run, and every cell still wider than the target."""

    target: float
    max_rounds: int | None
    rounds: int
    not_converged: list[Unconverged]


class CellRef(TypedDict):
    host: str
    strategy: str
    task: str


class CompletionJson(TypedDict):
    """What a resume could still give a verdict, and the command (`completion.Completion`)."""

    fillable: list[CellRef]
    short_planned: list[CellRef]
    unmeasured: int
    disturbed: int
    failed: int
    retakes_made: int
    retake_cap: int | None
    command: str | None
    resumes: bool
    flags: dict[str, str]


class SettingJson(TypedDict):
    """A setting acceptance can differ between (`acceptance.Where`)."""

    host: str
    backend: str
    build: str


class ParityJson(TypedDict):
    """Acceptance of one strategy on one task in two settings (`acceptance.Parity`)."""

    strategy: str
    task: str
    a: SettingJson
    b: SettingJson
    runs_a: list[str]
    runs_b: list[str]
    acceptance_a: float | None
    acceptance_b: float | None
    difference: float | None
    low: float | None
    high: float | None
    paired: bool
    units: int
    p_differs: float | None
    differs: bool


# ---------------------------------------------------------------- compare.json (harness/analysis/compare.py)


class ShortInterval(TypedDict):
    low: float
    high: float
    n: int


class ComparedCell(TypedDict):
    """A cell (task None: a strategy's geometric mean) of B against A."""

    host: str
    host_b: str | None
    strategy: str
    task: str | None
    speedup_a: float | None
    interval_a: ShortInterval | None
    speedup_b: float | None
    interval_b: ShortInterval | None
    ratio: float | None
    ratio_interval: ShortInterval | None
    margin: float
    verdict: str
    rule: str
    p_within: float | None
    p_outside: float | None
    p_adjusted: float | None
    fingerprint: str
    fingerprint_detail: str
    tok_s_ratio: float | None
    tok_s_ratio_note: str
    tasks: list[str]


class RunRefJson(TypedDict):
    run_id: str
    path: str
    hosts: list[str]


class DifferenceJson(TypedDict):
    field: str
    a: Any
    b: Any
    blocking: bool
    kind: str  # environment (build, models, hardware) or workload (harness/analysis/workload.py)


class Worst(TypedDict):
    host: str
    strategy: str
    task: str | None
    ratio: float | None
    ratio_interval: ShortInterval | None


class CompareJson(TypedDict):
    """compare.json: run B judged against run A."""

    a: RunRefJson
    b: RunRefJson
    differences: list[DifferenceJson]
    comparable: bool
    shared_records: list[int]  # B's records that are A's, B's records
    rows: list[ComparedCell]
    geomeans: list[ComparedCell]
    counts: dict[str, int]
    call: str
    verdict: str
    margin: float
    cell_margin: float
    estimator: str
    family: int
    smallest_margin: float | None
    cell_smallest_margin: float | None
    rounds_needed: int | None
    cell_rounds_needed: int | None
    unresolved: int
    torn_last_line: list[str]
    worst: Worst | None
    distribution: StudyComparison | None


# ---------------------------------------------------------------- the run


class CategoryJson(TypedDict):
    """A prompt suite's category for one strategy (harness/analysis/prompt_sample.py): the speedup for these
    prompts (the table's cell, marked there) beside the interval for prompts like these (null below two prompts)."""

    host: str
    strategy: str
    task: str
    suite: str
    category: str
    prompts: int
    speedup: float | None
    these_prompts: IntervalJson | None
    verdict: str
    like_these_speedup: float | None
    like_these: IntervalJson | None
    note: str


class CategoryPower(TypedDict):
    """What a run's suite design could show (harness/analysis/prompt_sample.py `power`)."""

    spread: float | None
    prompts: int
    half_width: float | None
    target: float
    prompts_needed: int | None


class BreakevenPoint(TypedDict):
    """One synthetic acceptance length of a break-even curve: its paired speedup with its 95% interval."""

    strategy: str
    length: float
    rounds: int
    speedup: float | None
    lo: float | None
    hi: float | None


class BreakevenFit(TypedDict):
    """The mean over rounds of each round's line of speedup against length."""

    intercept: float
    slope: float
    rounds: int


class BreakevenLength(TypedDict):
    """Where the fitted line crosses 1, with Fieller's 95% interval (None: unbounded on that side)."""

    length: float
    lo: float | None
    hi: float | None


class AchievedLength(TypedDict):
    """The real strategy's mean acceptance length per step, with its 95% interval over rounds."""

    length: float
    lo: float | None
    hi: float | None
    rounds: int
    sources: list[str]


class Ceiling(TypedDict):
    """The speedup at full acceptance (length n_max + 1): measured, or the fitted line's."""

    length: int
    measured: bool
    speedup: float | None


class BreakevenCurve(TypedDict):
    """One strategy's break-even curve on one task and host (harness/analysis/breakeven.py)."""

    host: str
    strategy: str
    task: str
    n_max: int
    points: list[BreakevenPoint]
    fit: BreakevenFit | None
    breakeven: BreakevenLength | None
    verdict: str
    ceiling: Ceiling
    real: str | None  # the strategy measured at its own acceptance (a swept entry: the combination `at` names)
    achieved: AchievedLength | None


class BreakevenJson(TypedDict):
    """The summary's break-even part: every curve, labelled synthetic acceptance (benchmarking only)."""

    label: str
    curves: list[BreakevenCurve]


class Summary(TypedDict):
    """summary.json: one run folder summarised (harness/analysis/summary.py)."""

    format_version: int
    run_id: str
    status: str
    protocol: str
    manifest: ManifestRef
    hardware: HardwareJson
    baseline: str | None
    strategies: list[StrategyRef]
    tasks: list[str]
    hosts: list[str]
    runs: int
    measurements: Counts
    missing: list[Missing]
    cells: list[CellSummary]
    determinism: dict[str, DeterminismTotal]
    geomeans: list[Geomean]
    family: FamilyJson
    reproduction_reach: ReachJson | None
    interference: dict[str, HostInterference]
    checks_ran: list[CheckRan]
    rules: dict[str, str]
    convergence: ConvergenceJson | None
    sensitivity: list[Variant]
    quiet_wait: QuietWaitSummary | None
    completion: CompletionJson
    decomposition: list[DecompositionJson]
    positions: PositionsJson
    requests: RequestsJson
    # sections a kind of study adds
    sweeps: NotRequired[list[SweepJson]]
    selection_rounds: NotRequired[list[int]]
    confirmation_rounds: NotRequired[list[int]]
    serving: NotRequired[list[ServingJson]]
    rules_sweep: NotRequired[str]
    rules_serving: NotRequired[str]
    dimensions: NotRequired[list[DimensionCurve]]
    rules_dimensions: NotRequired[str]
    builds: NotRequired[BuildsJson]
    distribution: NotRequired[StudySummary]
    categories: NotRequired[list[CategoryJson]]  # a run with prompt suites (harness/analysis/prompt_sample.py)
    categories_power: NotRequired[CategoryPower | None]
    breakeven: NotRequired[BreakevenJson]
