# The E2B template `computerd-agent`: a sandbox whose start command runs computerd's agent, which
# dials the cluster with the pairing code of the create that made the sandbox (deploy/e2b/README.md).
#
# E2B builds it from a public base image (its own `e2bdev/base`, with the `user` account). Here,
# without a registry, it is built on the local sandbox image instead:
#   docker build --build-arg BASE=computerd-sandbox:latest -f e2b.Dockerfile <context>
ARG BASE=e2bdev/base:latest
FROM ${BASE}

USER root
# The agent (built with `cargo build --release -p computer-agent`, copied into the context).
COPY computer-agent /usr/local/bin/computer-agent
COPY start.sh /usr/local/bin/computerd-e2b-start
RUN chmod 0755 /usr/local/bin/computer-agent /usr/local/bin/computerd-e2b-start \
    && mkdir -p /var/lib/computer-agent /workspace \
    && chmod 0700 /var/lib/computer-agent \
    && (id user >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash user) \
    && chown user /workspace \
    && command -v python3 >/dev/null
