# syntax=docker/dockerfile:1
# mockgpu-controller (the GpuNode controller of the Helm chart's Deployment) for linux/amd64 and
# linux/arm64, built from the repository root:
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/controller.Dockerfile -t mockgpu-controller .
# The build stage is the agent's (images/cross-build.sh): the pinned Rust toolchain
# (rust-toolchain.toml) on the build machine's platform, cross-compiling with Debian's GNU
# toolchain, no emulation. The final image is trixie-slim
# (the glibc the binary was linked against) with the CA bundle, and runs as the unprivileged
# user 65532, as the chart's securityContext asks.
# cargo's registry and target directory are cache mounts (BuildKit's and buildah's), so a
# rebuild compiles only what changed. CI builds this file with buildah, with the arguments of the
# README's `docker build` line (tests/images-build.sh), and the test bed's cluster mode runs the
# result (product-images, the chart's steps); tests/images.sh checks that every file this copies
# out of target/<triple>/release exists after a release build for that triple.

FROM --platform=$BUILDPLATFORM debian:trixie AS build
ARG BUILDARCH
ARG TARGETARCH
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
COPY images/cross-build.sh /usr/local/bin/cross-build
WORKDIR /src
COPY rust-toolchain.toml ./
RUN cross-build toolchain "$TARGETARCH" "$BUILDARCH"
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    triple=$(cross-build cargo "$TARGETARCH" mockgpu-controller) \
 && install -D -m 755 "target/$triple/release/mockgpu-controller" /out/usr/bin/mockgpu-controller \
 && install -D -m 644 /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt

FROM debian:trixie-slim
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/usr/bin/mockgpu-controller"]
CMD ["run"]
