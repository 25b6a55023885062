"""Where containers run: one `Engine` interface with a local engine (Docker SDK) and a remote one over SSH (Fabric,
known hosts enforced), and the facts of the machine recorded beside every result.

Imports: the foundation only. Every container, image and host command goes through `Engine`; what a container is
given on a host (access.py) is made in devices.py from the backend's row (harness/image/backends.py, seen here as
a `DeviceRule`) and handed to the engine, which knows no backend."""
