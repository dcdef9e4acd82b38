# The chatpipe binaries (ingest-api, pipeline, gateway) in one image, for docker-compose.yml.
# Not built on our own machines (no Docker engine there); scripts/stack runs the same parts natively.
FROM rust:1.95-bookworm AS build
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
COPY . .
# The git revision for chatpipe_build_info (.git is not in the build context).
ARG CHATPIPE_REVISION=unknown
ENV CHATPIPE_REVISION=$CHATPIPE_REVISION
RUN cargo build --release --locked -p ingest-api -p pipeline -p gateway

FROM debian:bookworm-slim
# curl: the health checks of docker-compose.yml.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ingest-api /src/target/release/pipeline /src/target/release/gateway /usr/local/bin/
# The services need no privilege: no port below 1024, nothing written outside /tmp.
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin chatpipe
USER 10001:10001
ENTRYPOINT ["ingest-api"]
