# A Debian base from a registry: debian:bookworm (pulled for the engine's own architecture) plus the packages the
# debootstrap base carries (harness/bases.py passes the same list). Built with network, before the llama.cpp build,
# which runs without network.
ARG DEBIAN=debian:bookworm
FROM ${DEBIAN}
ARG PACKAGES
RUN set -eu; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${PACKAGES}; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
