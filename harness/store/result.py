"""The measurement record: one line of measurements.jsonl (schemas/result.schema.json is the contract), and the
sampling study's batch record: one line of samples.jsonl (schemas/samples.schema.json).

harness/run/protocol.py writes a `ResultRecord`, harness/store/rundir.py appends and reads it back, harness/analysis
reads it (records.Measurement holds it as `raw`). tests/test_analysis.py holds these keys against the schema and
against every committed run's records. A new field of the record is a key here and a property in the schema."""

from typing import NotRequired, TypedDict


class Failure(TypedDict):
    """Why a measurement failed: the phase, the reason, the server's log tail."""

    phase: str
    reason: str
    log_tail: NotRequired[str]


class Timing(TypedDict):
    """Where a measurement's wall time went (a reused server's records have the first three only)."""

    container_start_s: float
    load_s: float
    request_s: float
    probs_s: NotRequired[float]
    stop_s: NotRequired[float]
    overhead_s: NotRequired[float]


class ClientFigures(TypedDict):
    """The timed request as the client saw it."""

    ttft_s: float
    decode_s: float
    request_s: float
    chunks: int
    decode_tok_s: float | None
    itl_p50_s: NotRequired[float | None]  # records since the inter-token latencies
    itl_p99_s: NotRequired[float | None]


class ServerFigures(TypedDict):
    """The server's own timings of the request (its final streamed message), with its draft counts."""

    prompt_n: int | None
    prompt_ms: float | None
    prompt_per_second: float | None
    predicted_n: int | None
    predicted_ms: float | None
    predicted_per_second: float | None
    cache_n: int | None
    draft_n: int
    draft_n_accepted: int


class Output(TypedDict):
    text: str
    sha256: str
    tokens: list[int]
    n_tokens: NotRequired[int | None]
    stop_type: NotRequired[str | None]


class Position(TypedDict):
    """One generated position: the chosen token, the runner-up and the top-2 log-probability margin."""

    id: int | None
    token: str | None
    top2_id: int | None
    top2_token: str | None
    margin: float | None


class Probs(TypedDict):
    """The baseline's untimed request with n_probs=2."""

    content_sha256: str
    positions: list[Position]


class QuietWarning(TypedDict):
    kind: str
    sentence: str


class _QuietWaitFigures(TypedDict):
    bound_s: float
    waited_s: float
    windows: int
    quiet: bool
    others_cores: float | None


class QuietWait(_QuietWaitFigures, total=False):
    """--quiet-wait: how long the kit waited before the timed request; the reasons when it ended busy."""

    reasons: list[str]


class Quiet(TypedDict):
    """Was the machine quiet before the measurement (harness/hosts/environment.py `quiet_check`)."""

    load_average_1m: float | None
    kit_containers: int
    gpu_utilization_pct: float | None
    busy: bool
    warnings: list[QuietWarning]
    wait: NotRequired[QuietWait]


class GpuApp(TypedDict):
    """One compute process on the GPUs (nvidia-smi --query-compute-apps)."""

    pid: int
    used_memory_mib: float | None


class Interference(TypedDict):
    """What other work did during the timed request (harness/run/interference.py `Window`)."""

    window_s: float
    cpus: int | None
    host_busy_s: float | None
    container_s: float | None
    client_s: float | None
    others_s: float | None
    others_cores: float | None
    others_fraction: float | None
    steal_s: float | None
    container_source: str | None
    freq_mhz: dict[str, float] | None
    throttled: bool | None
    gpu_other_apps: list[GpuApp] | None
    gpu_util_pct: dict[str, list[float] | None] | None
    disturbed: bool
    reasons: list[str]
    sample_cost_s: float


class Concurrency(TypedDict):
    """N identical requests at once: the aggregate, and each stream's figures."""

    streams: int
    aggregate_tok_s: float
    wall_s: float
    per_stream_tok_s: list[float | None]
    tokens: int  # over the streams
    ttft_s: list[float]
    itl_p50_s: float | None
    itl_p99_s: float | None
    draft_n: list[int]
    draft_n_accepted: list[int]


class Slots(TypedDict):
    """What the server says of its slots after the request (GET /props, GET /slots)."""

    total: int | None
    speculative: list[bool | None]
    n_ctx: int | None


class DraftAcceptance(TypedDict):
    """The server's `draft acceptance = ...` line."""

    rate: float
    accepted: int
    generated: int
    mean_len: float


#: One implementation's `statistics` line (harness/run/serverlog.py).
Counters = dict[str, int | float | list[float] | dict[str, float]]


class DraftCalls(TypedDict):
    """The request's draft calls as histograms: accepted[i] calls accepted exactly i tokens, drafted[i] drafted i."""

    calls: int
    accepted: list[int]
    drafted: list[int]
    tasks: int


class ServerLogFacts(TypedDict):
    """What llama-server's log said of its drafting after the request."""

    draft_acceptance: DraftAcceptance | None
    acc_per_pos: list[float] | None
    statistics: dict[str, Counters]
    implementations: list[str]
    params: dict[str, float | int | str]
    draft_calls: NotRequired[DraftCalls]


class SpecCounters(TypedDict):
    """One request's speculative counters: llama-server's /metrics after it minus before it (harness/run/metrics.py)."""

    drafts: int
    draft_tokens: int
    accepted: int
    #: accepted_per_pos[k]: draft calls that accepted at least k + 1 drafted tokens
    accepted_per_pos: list[int]


class CountersAbsent(TypedDict):
    """Why a record has no counters: the scrape before or after the request could not be read."""

    absent: str


class LoadedModel(TypedDict):
    """Where the load lines put one model: its device, the layers offloaded, its model buffers per device."""

    device: str
    description: str
    free_mib: int
    layers_offloaded: int | None
    layers: int | None
    buffers_mib: dict[str, float]


class DeviceLoad(TypedDict):
    """What the load lines say: each model in load order, the buffers per device and kind, their total in MiB."""

    models: list[LoadedModel]
    device_buffers_mib: dict[str, dict[str, float]]
    device_mib: float


class Context(TypedDict):
    """The filler a task's depth put before its prompt (harness/run/filler.py)."""

    depth: int
    filler_tokens: int
    filler_sha256: str
    filler_chars: int
    source: str


class ResultRecord(TypedDict):
    """One measurement (schemas/result.schema.json)."""

    format_version: int
    run_id: str
    measurement_id: str
    strategy: str
    task: str
    prompt: str
    run_index: int
    round: int
    order: int
    host: str
    protocol: str
    status: str  # "ok" or "failed"
    started_at: str
    wall_s: float
    retake_of: NotRequired[str]
    spec_type: NotRequired[str]
    model: NotRequired[str]
    container_id: NotRequired[str]
    server_command: NotRequired[list[str]]
    failure: NotRequired[Failure]
    timing: NotRequired[Timing]
    client: NotRequired[ClientFigures]
    server: NotRequired[ServerFigures]
    output: NotRequired[Output]
    probs: NotRequired[Probs]
    memory_peak_bytes: NotRequired[int | None]
    quiet: NotRequired[Quiet]
    interference: NotRequired[Interference]
    concurrency: NotRequired[Concurrency]
    context: NotRequired[Context]
    slots: NotRequired[Slots | None]
    server_log: NotRequired[ServerLogFacts]
    #: a speculative server's own counters for this request (GET /metrics before and after it), or why none
    spec_counters: NotRequired[SpecCounters | CountersAbsent]
    device: NotRequired[DeviceLoad | None]


class Sample(TypedDict):
    """One sample of the sampling study: its token ids, the server's drafts, and where recorded the
    log-probability of each token and (the baseline arm) its top candidates per position."""

    seed: int
    tokens: list[int]
    stop_type: str | None
    draft_n: int
    draft_n_accepted: int
    logprobs: NotRequired[list[float] | None]
    top: NotRequired[list[list[list[int | float | None]]]]


class BatchRecord(TypedDict):
    """One batch of the sampling study: a line of samples.jsonl (schemas/samples.schema.json)."""

    format_version: int
    run_id: str
    batch_id: str
    host: str
    arm: str
    role: str
    strategy: str
    spec_type: str
    model: str
    baseline: str
    task: str
    prompt: str
    round: int
    order: int
    started_at: str
    status: str
    temperature: float
    top_k: int | None
    n_predict: int
    samples: list[Sample]
    wall_s: NotRequired[float]
    container_id: NotRequired[str]
    server_command: NotRequired[list[str]]
    failure: NotRequired[Failure]


class RequestPart(TypedDict):
    """What the timed request puts in the record (harness/run/client.py `run_request`)."""

    client: ClientFigures
    server: ServerFigures
    output: Output
    interference: NotRequired[Interference]
    concurrency: NotRequired[Concurrency]
    probs: NotRequired[Probs]
    context: NotRequired[Context]
