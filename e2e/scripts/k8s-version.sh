# Sourced by the e2e build scripts (kube-testenv.sh, e2e/node/build.sh), which build
# Kubernetes binaries of the k8s.io/kubernetes release a module's go.mod pins. The sourcing
# script defines `die`.

# k8s_version MOD: the k8s.io/kubernetes version MOD/go.mod requires.
k8s_version() {
  awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }
       $1 == "k8s.io/kubernetes" && $2 ~ /^v/      { print $2; exit }' "$1/go.mod"
}

# k8s_ldflags GO MOD: the -ldflags of a build in MOD: -s -w, and the same variables as
# kubernetes' hack/lib/version.sh, so that /version reports the real release. buildDate is the
# release's publication time (from the module proxy's .info), which keeps the build
# reproducible; the git commit is not known from the module proxy and is left empty.
# Run it as `ldflags=$(k8s_ldflags GO MOD) || exit 1`: it dies in its subshell.
k8s_ldflags() {
  local go=$1 mod=$2 kver major minor bdate ldflags p
  kver=$(k8s_version "$mod")
  [[ $kver =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+ ]] || die "cannot read the k8s.io/kubernetes version from $mod/go.mod"
  major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
  bdate=$(cd "$mod" && GOFLAGS=-mod=readonly "$go" list -m \
    -f '{{with .Time}}{{.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes 2>/dev/null || true)
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$kver -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.gitCommit="
    if [[ -n $bdate ]]; then ldflags+=" -X $p.buildDate=$bdate"; fi
  done
  echo "$ldflags"
}
