# syntax=docker/dockerfile:1
# mockgpu-agent (it carries libmockfs.so, which `serve` installs; the library is also in the
# image as a file) for linux/amd64 and linux/arm64, built from the repository root:
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/agent.Dockerfile -t mockgpu-agent .
# The build stage runs on the build machine's own platform and cross-compiles with Debian's Rust
# (trixie's rustc-web, and its standard library for the target architecture) and GNU toolchain,
# as tests/arm64/run.sh does in CI: no emulation while compiling.
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
 && cargo build --locked --release --target "$triple" -p mockgpu-agent -p mockfs-shim \
 && install -D -m 755 "target/$triple/release/mockgpu-agent" /out/usr/bin/mockgpu-agent \
 && install -D -m 644 "target/$triple/release/libmockfs.so" /out/usr/lib/mockgpu/libmockfs.so

FROM debian:trixie-slim
COPY --from=build /out/ /
ENTRYPOINT ["/usr/bin/mockgpu-agent"]
CMD ["serve"]
