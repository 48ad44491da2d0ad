# syntax=docker/dockerfile:1
# mockgpu-agent (it carries libmockfs.so, libnvidia-ml.so.1 and nvidia-smi, which `serve`
# installs; the shim is also in the image as a file) for linux/amd64 and linux/arm64, built from
# the repository root:
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/agent.Dockerfile -t mockgpu-agent .
# The build stage (images/cross-build.sh) runs on the build machine's own platform and
# cross-compiles with the Rust toolchain that rust-toolchain.toml pins (the tests' own, installed
# by rustup-init from static.rust-lang.org, pinned by version and checksum, with the standard
# library for the target architecture) and Debian's GNU toolchain: no emulation while compiling.
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
    triple=$(cross-build cargo "$TARGETARCH" mockgpu-agent mockfs-shim) \
 && install -D -m 755 "target/$triple/release/mockgpu-agent" /out/usr/bin/mockgpu-agent \
 && install -D -m 644 "target/$triple/release/libmockfs.so" /out/usr/lib/mockgpu/libmockfs.so

FROM debian:trixie-slim
COPY --from=build /out/ /
ENTRYPOINT ["/usr/bin/mockgpu-agent"]
CMD ["serve"]
