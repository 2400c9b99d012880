#!/usr/bin/env bash
# Builds the real Kubernetes control plane from its Go modules, once, into a cache outside the repository:
# kube-apiserver, kube-scheduler, kube-controller-manager and kubectl from k8s.io/kubernetes (kubebin/kubernetes),
# etcd from go.etcd.io/etcd/server/v3 (kubebin/etcd, its own module so that etcd's requirements cannot raise the
# versions Kubernetes was tested with). The cache key is a hash of both modules' go.mod/go.sum, the Go version and
# the flags below: the binaries are rebuilt only when a pinned version changes.
# Third, Kueue's manager from sigs.k8s.io/kueue/cmd/kueue (kubebin/kueue, its own module: Kueue builds against
# k8s.io v0.35.x) as bin/kueue, with Kueue's CRDs and webhook manifests from the same module version copied next
# to bin/ (kueue/crd/*.yaml, kueue/webhook/manifests.yaml) so that tests never need the repository to hold them.
# Its go.mod/go.sum are part of the cache key too.
# Fourth, helm from helm.sh/helm/v4/cmd/helm (kubebin/helm, its own module) as bin/helm, for the suite's install
# of deploy/helm/infer-ctl (tests/realcluster/test_deploy.py); its go.mod/go.sum are in the cache key as well.
#
#   scripts/kube-binaries.sh          build if needed, then print the bin directory on stdout (progress on stderr)
#   scripts/kube-binaries.sh --check  print the bin directory if it is built, else exit 1 without building
#
# Cache: ${INFER_CTL_CACHE:-${XDG_CACHE_HOME:-~/.cache}/infer-ctl}/kube/<kubernetes version>-<key>/bin.
# Modules come from the Go module proxy only (GOPROXY without 'direct', checked against go.sum).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

K8S_MOD=kubebin/kubernetes
ETCD_MOD=kubebin/etcd
KUEUE_MOD=kubebin/kueue
HELM_MOD=kubebin/helm
K8S_CMDS=(kube-apiserver kube-scheduler kube-controller-manager kubectl)

if ! command -v go >/dev/null 2>&1; then
  echo "[kube] Go is needed to build the Kubernetes binaries (Go >= 1.26); install it or set PATH" >&2
  exit 2
fi

pinned() {  # pinned DIR MODULE: the version go.mod requires
  (cd "$1" && GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$2")
}
k8s_version=$(pinned "$K8S_MOD" k8s.io/kubernetes)
etcd_version=$(pinned "$ETCD_MOD" go.etcd.io/etcd/server/v3)
kueue_version=$(pinned "$KUEUE_MOD" sigs.k8s.io/kueue)
helm_version=$(pinned "$HELM_MOD" helm.sh/helm/v4)
if [ -z "$k8s_version" ] || [ -z "$etcd_version" ] || [ -z "$kueue_version" ] || [ -z "$helm_version" ]; then
  echo "[kube] cannot read the pinned versions from $K8S_MOD/go.mod, $ETCD_MOD/go.mod, $KUEUE_MOD/go.mod and" \
       "$HELM_MOD/go.mod" >&2
  exit 2
fi
minor=${k8s_version#v1.}; minor=${minor%%.*}

# Version stamping as kubernetes' hack/lib/version.sh does, for both packages that report it (/version, kubectl).
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
LDFLAGS="-s -w$stamp"
# Kueue stamps its own version package (Kueue's Makefile, LD_FLAGS); the Kubernetes stamp above is not for it.
KUEUE_LDFLAGS="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
# helm stamps its version as helm's Makefile does (`helm version`).
HELM_LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
BUILD_FLAGS="-trimpath"

key=$( { cat "$K8S_MOD/go.mod" "$K8S_MOD/go.sum" "$ETCD_MOD/go.mod" "$ETCD_MOD/go.sum";
         cat "$KUEUE_MOD/go.mod" "$KUEUE_MOD/go.sum" "$HELM_MOD/go.mod" "$HELM_MOD/go.sum"; go version;
         echo "$LDFLAGS $KUEUE_LDFLAGS $HELM_LDFLAGS $BUILD_FLAGS"; } | sha256sum | cut -c1-12)
CACHE=${INFER_CTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infer-ctl}/kube
DEST=$CACHE/$k8s_version-$key
BIN=$DEST/bin

built() {
  [ -f "$DEST/complete" ] || return 1
  for b in "${K8S_CMDS[@]}" etcd kueue helm; do [ -x "$BIN/$b" ] || return 1; done
  [ -f "$DEST/kueue/webhook/manifests.yaml" ] && [ -f "$DEST/kueue/crd/kueue.x-k8s.io_workloads.yaml" ]
}

if built; then echo "$BIN"; exit 0; fi
if [ "${1:-}" = "--check" ]; then exit 1; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  echo "[kube] another build holds $CACHE/.build.lock; waiting for it" >&2
  flock 9
fi
if built; then echo "$BIN"; exit 0; fi

export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
proxy=$(go env GOPROXY); proxy=${proxy%,direct}; proxy=${proxy%|direct}
if [ -z "$proxy" ] || [ "$proxy" = direct ] || [ "$proxy" = off ]; then proxy=https://proxy.golang.org; fi
export GOPROXY=$proxy

# go build -v names each package as it compiles it; count them against the dependency list for a progress line.
build_with_progress() {  # build_with_progress LABEL MODULE_DIR OUT (a directory ending in /, or a file) PACKAGE...
  local label=$1 dir=$2 out=$3; shift 3
  local total log start
  echo "[kube] $label: downloading modules (Go module proxy $GOPROXY)" >&2
  (cd "$dir" && go mod download) >&2
  total=$(cd "$dir" && go list -deps "$@" | wc -l)
  log=$(mktemp)
  start=$(date +%s)
  echo "[kube] $label: compiling (about $total packages; a few minutes cold on 2 cores)" >&2
  set +e
  (cd "$dir" && go build -v $BUILD_FLAGS -ldflags "$LDFLAGS" -o "$out" "$@") 2>"$log" &
  local pid=$! done=0 last=-1 tty=0
  [ -t 2 ] && tty=1
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    done=$(grep -cv '^#' "$log" || true)
    if [ "$tty" = 1 ]; then
      printf '\r[kube] %s: %d/%d packages, %ds ' "$label" "$done" "$total" $(( $(date +%s) - start )) >&2
    elif [ $(( done * 10 / (total + 1) )) != "$last" ]; then  # a line per tenth when not on a terminal
      last=$(( done * 10 / (total + 1) ))
      echo "[kube] $label: $done/$total packages, $(( $(date +%s) - start ))s" >&2
    fi
  done
  wait "$pid"; local rc=$?
  set -e
  [ "$tty" = 1 ] && echo >&2
  if [ $rc != 0 ]; then
    echo "[kube] $label: go build failed (exit $rc); its output:" >&2
    grep -v '^[a-zA-Z0-9._/-]*$' "$log" | tail -40 >&2
    rm -f "$log"
    exit $rc
  fi
  rm -f "$log"
  echo "[kube] $label: built in $(( $(date +%s) - start ))s" >&2
}

TMP=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
overall=$(date +%s)
pkgs=()
for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
build_with_progress "kubernetes $k8s_version" "$ROOT/$K8S_MOD" "$TMP/bin/" "${pkgs[@]}"
build_with_progress "etcd $etcd_version" "$ROOT/$ETCD_MOD" "$TMP/bin/etcd" go.etcd.io/etcd/server/v3
LDFLAGS=$KUEUE_LDFLAGS build_with_progress "kueue $kueue_version" "$ROOT/$KUEUE_MOD" "$TMP/bin/kueue" \
  sigs.k8s.io/kueue/cmd/kueue
LDFLAGS=$HELM_LDFLAGS build_with_progress "helm $helm_version" "$ROOT/$HELM_MOD" "$TMP/bin/helm" \
  helm.sh/helm/v4/cmd/helm
# Kueue's CRDs and webhook configurations, from the module version just built (read-only in the module cache).
kueue_src=$(cd "$KUEUE_MOD" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
mkdir -p "$TMP/kueue/crd" "$TMP/kueue/webhook"
cp "$kueue_src"/config/components/crd/bases/*.yaml "$TMP/kueue/crd/"
cp "$kueue_src/config/components/webhook/manifests.yaml" "$TMP/kueue/webhook/"
chmod -R u+w "$TMP/kueue"
version=$("$TMP/bin/kube-apiserver" --version)
case "$version" in
  *"$k8s_version"*) ;;
  *) echo "[kube] the built kube-apiserver says '$version', expected $k8s_version" >&2; exit 1 ;;
esac
rm -rf "$DEST"
mkdir -p "$DEST"
mv "$TMP/bin" "$BIN"
mv "$TMP/kueue" "$DEST/kueue"
{ echo "kubernetes $k8s_version"; echo "etcd $etcd_version"; echo "kueue $kueue_version"; echo "helm $helm_version"; go version; date -u +%FT%TZ;
  echo "seconds $(( $(date +%s) - overall ))"; } > "$DEST/complete"
echo "[kube] Kubernetes $k8s_version, etcd $etcd_version, Kueue $kueue_version and helm $helm_version built in $(( $(date +%s) - overall ))s into $BIN" >&2
echo "$BIN"
