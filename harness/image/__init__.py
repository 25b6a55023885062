"""The llama.cpp image: its source (git, sdist, local folder), its base images (registry or debootstrap; CUDA from
PyPI wheels), its build plan and identity labels (recipe.py), the build itself, and finding an image on an engine
by what it is.

Imports: the foundation, harness.intake, harness.models, harness.store, harness.hosts. A new backend goes in
recipe.py (CMake flags, labels), bases.py (packages) and docker/Dockerfile."""
