"""From verdicts to words and pictures: RESULTS.md (results.py), its sections (builds, explanation, lossless,
tuning, the checks' tables in check_tables.py), the marks every table shares (marks.py), the plots (plotting.py)
and the comparison of two runs in words (compare.py).

Imports: harness.analysis and everything below it. Nothing here computes a verdict: a figure comes from analysis,
its words and plots from here; a new table's words go here, its numbers in analysis/."""
