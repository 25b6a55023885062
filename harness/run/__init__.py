"""Making measurements: the run plan (cells x rounds, shuffled), one measurement's protocol (fresh container, health,
one streamed request, record), the server container and the HTTP client, the server log, interference measured
during each request, the executor (hosts in parallel, resume, Ctrl-C, retakes), the sampling study (its plan and its
batches of seeded samples), the `invoke run` use case, the readiness check and the bandwidth probe.

Imports: everything below it (harness.analysis for --until). A new measurement field goes in protocol.py and
schemas/result.schema.json."""
