"""What comes in and what it may decide: a manifest (bounded YAML, schema, typed dataclasses), the llama-server
flags it may pass (an allow-list), the URLs it may name, and the trust rule for build sources.

Imports: the foundation (harness, harness.files, harness.schema, harness.formatter) only. A new manifest field goes
in schemas/manifest.schema.json and manifest.py; a new server flag a manifest may pass goes in flags.py. A new spec
type: one row in spec_types.py and its name in the schema's spec_type enum (tests/test_kinds.py holds the two
together)."""
