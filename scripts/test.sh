#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one: installs what the tests need
# (Debian's redis-server), then runs every unit, integration, property, conformance and doc
# test with all features, and runs the examples that need no external server.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkg() { command -v "$1" >/dev/null 2>&1; }

# nftables and iproute2 (ip, nsenter is util-linux): the Kubernetes fencing suite partitions a
# leader inside a network namespace it makes. busybox: its `nc` is the plain HTTP client of the
# fenced-command suite (it half-closes, as simple clients do).
if ! need_pkg redis-server || ! need_pkg redis-cli || ! need_pkg redis-benchmark || ! need_pkg openssl \
  || ! need_pkg nft || ! need_pkg ip || ! need_pkg nsenter || ! need_pkg busybox || ! need_pkg promtool; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "tenure tests need redis-server, redis-tools, openssl, nftables, iproute2, util-linux, busybox-static and prometheus (promtool); install them or run as root" >&2
    exit 1
  fi
  echo "== installing redis-server, redis-tools, openssl, nftables, iproute2, busybox-static and prometheus (for promtool) from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools openssl nftables iproute2 util-linux busybox-static prometheus >/dev/null
fi
# The package may start a system-wide server; the tests start their own on free ports.

echo "== cargo test (all features)"
cargo test --all-features --no-fail-fast

# The real lock runtime and electors under seeded faults on virtual time (sim/,
# docs/evidence.md): a fixed set of seeds, each run twice to prove it replays byte for byte;
# a sharded group; and the proof that the checker bites (each defect in sim/defects/ found).
echo "== deterministic simulation"
(cd sim && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/../target}/sim" cargo test --quiet --release --locked)
bash scripts/sim.sh --seeds 200 --check-determinism
bash scripts/sim.sh --seeds 40 --first-seed 1000 --replicas 10 --shards 64
bash scripts/sim.sh --bite 200

echo "== examples"
bash scripts/demo.sh
cargo run --quiet --example contention
cargo run --quiet --all-features --example fenced_writes
cargo run --quiet --example sharded_workers

# The Helm chart's pods on a real single-node Kubernetes (e2e/node, tests/node_chart.rs):
# Debian's containerd, runc, CNI plugins, buildah (the image, from the Dockerfile, offline) and
# busybox-static (the workload image); the static musl tenure goes into the image. Needs root
# and cgroup v1 (what this machine kind has); elsewhere the suite says why it skips.
echo "== the chart's pods on a real node"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED node suite: needs root (namespaces, cgroups, containerd)"
elif [ -e /sys/fs/cgroup/cgroup.controllers ]; then
  echo "SKIPPED node suite: cgroup v2 host; e2e/node supports cgroup v1 only"
else
  if ! need_pkg containerd || ! need_pkg runc || ! need_pkg buildah || ! need_pkg busybox \
    || ! need_pkg musl-gcc || [ ! -x /usr/lib/cni/bridge ]; then
    echo "== installing containerd, runc, containernetworking-plugins, buildah, busybox-static, musl-tools from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd runc containernetworking-plugins \
      buildah busybox-static musl-tools >/dev/null
  fi
  if ! rustup target list --installed 2>/dev/null | grep -q '^x86_64-unknown-linux-musl$'; then
    rustup target add x86_64-unknown-linux-musl
  fi
  # The same static build as .ci/run's (which then finds it done).
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked --features cli --bin tenure --target x86_64-unknown-linux-musl
  TENURE_NODE_TENURE_BIN="${CARGO_TARGET_DIR:-$PWD/target}/x86_64-unknown-linux-musl/release/tenure" \
    cargo test --all-features --test node_chart -- --test-threads=1 --nocapture
  # The chart's pods on the Redis backend (a redis-server in the node's network namespace), and
  # bad input: a missing image, a wrong Redis password, a Role without update on leases.
  TENURE_NODE_TENURE_BIN="${CARGO_TARGET_DIR:-$PWD/target}/x86_64-unknown-linux-musl/release/tenure" \
    cargo test --all-features --test node_redis --test node_bad_input -- --test-threads=1 --nocapture
  # examples/kube_controller.rs as pods under the chart's RBAC, and the chart's release side by
  # side with client-go's leader election (tests/node_peers.rs): the example's static build too.
  CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build --release --locked --all-features --example kube_controller --target x86_64-unknown-linux-musl
  TENURE_NODE_TENURE_BIN="${CARGO_TARGET_DIR:-$PWD/target}/x86_64-unknown-linux-musl/release/tenure" \
    TENURE_NODE_KUBE_CONTROLLER_BIN="${CARGO_TARGET_DIR:-$PWD/target}/x86_64-unknown-linux-musl/release/examples/kube_controller" \
    cargo test --all-features --test node_peers -- --test-threads=1 --nocapture
fi
