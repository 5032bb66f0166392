# Sourced by the e2e build scripts: `find_go` prints the Go toolchain to use ($GO, `go` on
# PATH, or /usr/local/go/bin/go). The sourcing script defines `die`.
find_go() {
  if [[ -n ${GO:-} ]]; then echo "$GO"; return; fi
  if command -v go >/dev/null 2>&1; then command -v go; return; fi
  if [[ -x /usr/local/go/bin/go ]]; then echo /usr/local/go/bin/go; return; fi
  die "no Go toolchain found (put go on PATH or set GO=/path/to/go)"
}
