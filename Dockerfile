# syntax=docker/dockerfile:1
#
# The `tenure` binary as a minimal, non-root image: a static (musl) executable on an empty
# base, with CA certificates and an /etc/passwd naming uid 65532 (nonroot), run as 65532.
# Being static, the same binary runs inside any Linux image, which is how the Helm chart uses
# it: an init container runs `tenure install /tenure-bin` and the workload's own image runs
# /tenure-bin/tenure.
#
#   docker build -t REGISTRY/tenure:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/tenure:0.1.0 --push .
#
# TENURE_BINARY picks where the binary comes from: `build` (default) compiles it from this
# repository in the rust image; `prebuilt` takes the files from the build context instead
# (tenure, a static musl build; ca-certificates.crt; passwd; group) and needs no network.
# The repository's node tests build the image that way with buildah, offline, from the
# `.ci/run` musl build (e2e/node/images.sh), and run it in the Helm chart's pods.

ARG RUST_VERSION=1.95
ARG TENURE_BINARY=build

FROM rust:${RUST_VERSION}-bookworm AS build
# ring (rustls's crypto) compiles C and assembly: musl-gcc from musl-tools.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
# The musl target of the platform being built (native, or emulated under buildx).
RUN set -eu; \
    case "$(uname -m)" in \
      x86_64) target=x86_64-unknown-linux-musl ;; \
      aarch64) target=aarch64-unknown-linux-musl ;; \
      *) echo "unsupported architecture $(uname -m)" >&2; exit 1 ;; \
    esac; \
    echo "$target" > /rust-target; \
    rustup target add "$target"
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CC_aarch64_unknown_linux_musl=musl-gcc \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_TERM_COLOR=never
WORKDIR /src
COPY . .
# The ldd check: the binary must be static, or it would not run in arbitrary images.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    target=$(cat /rust-target); \
    cargo build --release --locked --features cli --bin tenure --target "$target"; \
    install -D -m 0755 "target/$target/release/tenure" /out/usr/local/bin/tenure; \
    if ldd /out/usr/local/bin/tenure 2>&1 | grep -q '=>'; then \
      echo "tenure is dynamically linked" >&2; exit 1; \
    fi; \
    /out/usr/local/bin/tenure --version; \
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt; \
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /out/etc/passwd; \
    printf 'root:x:0:\nnonroot:x:65532:\n' > /out/etc/group

# The same files, prebuilt, from the build context (no network: buildah builds this offline).
FROM scratch AS prebuilt
COPY tenure /out/usr/local/bin/tenure
COPY ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt
COPY passwd group /out/etc/

FROM ${TENURE_BINARY} AS binary

# No shell, no package manager: the binary, CA certificates, passwd and group.
FROM scratch
COPY --from=binary /out/ /
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tenure"]
CMD ["--help"]
