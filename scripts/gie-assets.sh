#!/usr/bin/env bash
# The Gateway API Inference Extension's InferencePool CRD, from its Go module (sigs.k8s.io/gateway-api-inference-
# extension, pinned by kubebin/gie/go.mod), copied from the Go module cache into a cache outside the repository,
# as scripts/kube-binaries.sh copies Kueue's CRDs; nothing of the extension is copied into this repository. The
# sandbox installs it on the real control plane (infer_ctl/sandbox/kubesandbox.py). A cache of its own (key: the
# module's go.mod/go.sum and the Go version), so that moving this module never invalidates the Kubernetes binaries.
#
#   scripts/gie-assets.sh           download the module if needed, copy its CRDs; print the cache directory
#   scripts/gie-assets.sh --check   print the cache directory if it is complete, else exit 1 without downloading
#   scripts/gie-assets.sh --lwepp   also build the module's lightweight endpoint picker (cmd/lwepp, an Envoy
#                                   ext-proc gRPC server) as bin/lwepp; the sandbox does not use it (kubebin/README.md)
#
# Cache: ${INFER_CTL_CACHE:-${XDG_CACHE_HOME:-~/.cache}/infer-ctl}/gie/<module version>-<key>/crd/*.yaml
# The module comes from the Go module proxy only (GOPROXY without 'direct', checked against go.sum).
set -euo pipefail
cd "$(dirname "$0")/.."
MOD=kubebin/gie
MODULE=sigs.k8s.io/gateway-api-inference-extension
POOL_CRD=inference.networking.k8s.io_inferencepools.yaml

if ! command -v go >/dev/null 2>&1; then
  echo "[gie] Go is needed to fetch $MODULE from the Go module proxy (Go >= 1.26); install it or set PATH" >&2
  exit 2
fi
version=$(cd "$MOD" && GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$MODULE")
if [ -z "$version" ]; then
  echo "[gie] cannot read the pinned version of $MODULE from $MOD/go.mod" >&2
  exit 2
fi
key=$( { cat "$MOD/go.mod" "$MOD/go.sum"; go version; } | sha256sum | cut -c1-12)
CACHE=${INFER_CTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infer-ctl}/gie
DEST=$CACHE/$version-$key

complete() { [ -f "$DEST/complete" ] && [ -f "$DEST/crd/$POOL_CRD" ]; }
want_lwepp=0
[ "${1:-}" = "--lwepp" ] && want_lwepp=1
if complete && { [ $want_lwepp = 0 ] || [ -x "$DEST/bin/lwepp" ]; }; then echo "$DEST"; exit 0; fi
if [ "${1:-}" = "--check" ]; then exit 1; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
export CGO_ENABLED=0 GOFLAGS=-mod=readonly GOTOOLCHAIN=local
proxy=$(go env GOPROXY); proxy=${proxy%,direct}; proxy=${proxy%|direct}
if [ -z "$proxy" ] || [ "$proxy" = direct ] || [ "$proxy" = off ]; then proxy=https://proxy.golang.org; fi
export GOPROXY=$proxy

if ! complete; then
  echo "[gie] $MODULE $version: downloading (Go module proxy $GOPROXY)" >&2
  (cd "$MOD" && go mod download "$MODULE") >&2
  src=$(cd "$MOD" && go list -m -f '{{.Dir}}' "$MODULE")
  TMP=$(mktemp -d "$CACHE/.build-XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  mkdir -p "$TMP/crd"
  cp "$src"/config/crd/bases/*.yaml "$TMP/crd/"
  chmod -R u+w "$TMP/crd"
  rm -rf "$DEST"
  mkdir -p "$DEST"
  mv "$TMP/crd" "$DEST/crd"
  { echo "$MODULE $version"; go version; date -u +%FT%TZ; } > "$DEST/complete"
fi
if [ $want_lwepp = 1 ] && [ ! -x "$DEST/bin/lwepp" ]; then
  echo "[gie] building $MODULE/cmd/lwepp $version (a few minutes cold on 2 cores)" >&2
  start=$(date +%s)
  (cd "$MOD" && go mod download && go build -trimpath -ldflags "-s -w" -o "$DEST/bin/lwepp" "$MODULE/cmd/lwepp") >&2
  echo "[gie] lwepp built in $(( $(date +%s) - start ))s" >&2
fi
echo "$DEST"
