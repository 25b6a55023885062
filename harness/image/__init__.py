"""The llama.cpp image: its source (git, sdist, local folder), its base images (registry or debootstrap; CUDA from
PyPI wheels), its build plan and identity labels (recipe.py), the build itself, and finding an image on an engine
by what it is.

Imports: the foundation, harness.intake, harness.models, harness.store, harness.hosts. A new backend: one row in
backends.py (its bases' packages, CMake flags, devices, probe, checks) and its name in the schemas' backend enums
(tests/test_kinds.py holds them together); docker/Dockerfile only where it needs a program of its own."""
