# Both services, and opsctl beside them, in one image; docker-compose.yml picks the service with
# `command`.
# Dependencies are built in their own layer (cargo-chef), so a source change rebuilds only the
# workspace crates.
FROM rust:1.95-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /app

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /app/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json -p orders-service -p billing-service -p ops-cli
COPY . .
# The same build the tests run (scripts/test checks this line is here).
RUN scripts/build-services

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin app
COPY --from=builder /app/target/release/orders-service /app/target/release/billing-service \
    /app/target/release/opsctl /usr/local/bin/
USER app
ENV LOG_FORMAT=json
CMD ["orders-service"]
