"""The kit's files on disk: a run folder (run.json + measurements.jsonl, appended and fsynced), the typed records of
run.json (runmeta.py), of a build (buildrecord.py), of a measurement and a sampling batch (result.py: what the
protocol writes and the analysis reads) and of summary.json and compare.json (shapes.py: what the analysis writes and
the report reads), with the upgrades of older formats, and archives from elsewhere extracted without trusting them.

Imports: the foundation, harness.intake, harness.models (what one pass of a model reads, as run.json keeps it).
Nothing here measures or judges."""
