# syntax=docker/dockerfile:1
# mockgpu-controller (the GpuNode controller of the Helm chart's Deployment) for linux/amd64 and
# linux/arm64, built from the repository root:
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/controller.Dockerfile -t mockgpu-controller .
# The build stage is the agent's (images/agent.Dockerfile): Debian's Rust on the build machine's
# platform, cross-compiling with the GNU toolchain, no emulation. The final image is trixie-slim
# (the glibc the binary was linked against) with the CA bundle, and runs as the unprivileged
# user 65532, as the chart's securityContext asks.
# tests/images.sh checks that every file this copies out of target/<triple>/release exists after
# a release build for that triple.

FROM --platform=$BUILDPLATFORM debian:trixie AS build
ARG BUILDARCH
ARG TARGETARCH
RUN case "$TARGETARCH" in \
      amd64) echo x86_64-unknown-linux-gnu x86_64-linux-gnu x86-64-linux-gnu ;; \
      arm64) echo aarch64-unknown-linux-gnu aarch64-linux-gnu aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac > /target \
 && read -r _ gnu pkg < /target \
 && if [ "$TARGETARCH" = "$BUILDARCH" ]; then cross="gcc libc6-dev"; \
    else cross="gcc gcc-$pkg libc6-dev-$TARGETARCH-cross"; dpkg --add-architecture "$TARGETARCH"; fi \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      ca-certificates rustc-web cargo-web "libstd-rust-web-dev:$TARGETARCH" $cross \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN read -r triple gnu _ < /target \
 && export "CARGO_TARGET_$(echo "$triple" | tr a-z- A-Z_)_LINKER=$gnu-gcc" \
 && cargo build --locked --release --target "$triple" -p mockgpu-controller \
 && install -D -m 755 "target/$triple/release/mockgpu-controller" /out/usr/bin/mockgpu-controller \
 && install -D -m 644 /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt

FROM debian:trixie-slim
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/usr/bin/mockgpu-controller"]
CMD ["run"]
