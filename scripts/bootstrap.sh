# Shared set-up for ./run and ./test (sourced, not executed).
# Makes .venv with Python 3.11 from uv.lock (uv sync --frozen: the locked versions, their hashes checked) when
# uv.lock, pyproject.toml or the requested extras changed since the last sync; installs Debian packages with
# apt-get when their command is missing.
# The lock is made with `uv lock` (uv pinned below; `uv lock --upgrade-package NAME` to move one dependency).

UV_VERSION=0.13.8
INFER_CTL_CACHE=${INFER_CTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infer-ctl}

_python311() {
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 &&
       "$cand" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
      command -v "$cand"; return 0
    fi
  done
  echo "infer-ctl needs Python 3.11 (python3.11 or python3); install it with: apt-get install python3.11 python3.11-venv" >&2
  return 1
}

# _uv: the pinned uv, installed once into its own venv in the cache outside the repository; prints its path.
_uv() {
  local dir=$INFER_CTL_CACHE/uv-$UV_VERSION py
  if [ ! -x "$dir/bin/uv" ]; then
    py=$(_python311) || return 1
    echo "[setup] installing uv $UV_VERSION into $dir" >&2
    rm -rf "$dir"
    if ! "$py" -m venv "$dir" 2>/dev/null; then
      # Debian splits venv/ensurepip out of python3: install it, then try again.
      rm -rf "$dir"
      bootstrap_debian_package "python3-venv"
      "$py" -m venv "$dir"
    fi
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" >&2
  fi
  echo "$dir/bin/uv"
}

# bootstrap_venv [UV SYNC OPTIONS...]: .venv as uv.lock says, with the extras and groups the options name
# (./run: --all-extras --no-dev --inexact; ./test: --all-extras, which includes the dev group).
bootstrap_venv() {
  local uv py stamp want
  stamp=.venv/.infer-ctl-synced
  want=$( { cat uv.lock pyproject.toml; echo "$UV_VERSION $*"; } | sha256sum | cut -c1-16)
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  uv=$(_uv) || return 1
  py=$(_python311) || return 1
  echo "[setup] installing infer-ctl and its locked dependencies into .venv (uv sync --frozen $*)" >&2
  UV_PROJECT_ENVIRONMENT=.venv UV_PYTHON_DOWNLOADS=never UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-120} \
    "$uv" sync --quiet --frozen --python "$py" "$@" >&2
  echo "$want" > "$stamp"
}

# bootstrap_debian PACKAGE [COMMAND]: apt-get install PACKAGE when COMMAND (default: PACKAGE) is missing.
bootstrap_debian() {
  local pkg=$1 cmd=${2:-$1}
  command -v "$cmd" >/dev/null 2>&1 && return 0
  bootstrap_debian_package "$pkg"
}

bootstrap_debian_package() {
  local pkg=$1 sudo=""
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "[setup] this is not a Debian machine: install '$pkg' yourself" >&2
    return 1
  fi
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "[setup] installing Debian package $pkg" >&2
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$pkg" >&2
}

# bootstrap_kube: the real control plane's binaries (built from their Go modules on first use, into a cache outside
# the repository; see scripts/kube-binaries.sh); exports INFER_CTL_KUBE_BIN for infer_ctl.sandbox.localcluster.
# Also the Gateway API Inference Extension's InferencePool CRD (scripts/gie-assets.sh, a cache of its own); exports
# INFER_CTL_GIE_DIR for infer_ctl.sandbox.kubesandbox, which installs it on the real control plane.
bootstrap_kube() {
  local bin gie
  bin=$(bash scripts/kube-binaries.sh) || return 1
  export INFER_CTL_KUBE_BIN=$bin
  gie=$(bash scripts/gie-assets.sh) || return 1
  export INFER_CTL_GIE_DIR=$gie
}
