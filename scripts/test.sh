#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one: installs what the tests need
# (Debian's redis-server), then runs every unit, integration, property, conformance and doc
# test with all features, and runs the examples that need no external server.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkg() { command -v "$1" >/dev/null 2>&1; }

# nftables and iproute2 (ip, nsenter is util-linux): the Kubernetes fencing suite partitions a
# leader inside a network namespace it makes.
if ! need_pkg redis-server || ! need_pkg redis-cli || ! need_pkg redis-benchmark || ! need_pkg openssl \
  || ! need_pkg nft || ! need_pkg ip || ! need_pkg nsenter; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "tenure tests need redis-server, redis-tools, openssl, nftables, iproute2 and util-linux; install them or run as root" >&2
    exit 1
  fi
  echo "== installing redis-server, redis-tools, openssl, nftables and iproute2 from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools openssl nftables iproute2 util-linux >/dev/null
fi
# The package may start a system-wide server; the tests start their own on free ports.

echo "== cargo test (all features)"
cargo test --all-features --no-fail-fast

echo "== examples"
bash scripts/demo.sh
cargo run --quiet --example contention
cargo run --quiet --all-features --example fenced_writes
