"""From records to verdicts: statistics (paired speedups, intervals, family-wide verdicts, contamination,
stability), the checks (physics, determinism), lossless in distribution (the sampling study's two stages), the
summary of a run folder and the comparison of two runs, in the shapes harness/report reads (harness/store/shapes.py:
summary.json and compare.json as typed dicts). Their words and plots are harness/report's.

Imports: the foundation, harness.intake, harness.models, harness.store. Pure functions of files: nothing here talks
to an engine. A new check goes in checks.py and is wired in summary.py; its words in harness/report/results.py."""
