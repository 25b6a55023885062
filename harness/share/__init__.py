"""Handing results to someone else: a bundle (one archive of a run, its manifest and prompts, every file hashed) and
reproducing one (verify, fetch models, build, run, compare).

Imports: everything below it."""
