# Shared set-up for ./run and ./test (sourced, not executed).
# Makes .venv with Python 3.11 or newer (see _python) from uv.lock (uv sync --frozen: the locked versions, their
# hashes checked) when uv.lock, pyproject.toml, the requested extras or the Python changed since the last sync;
# installs Debian packages with apt-get when their command is missing.
# The lock is made with `uv lock` (uv pinned below; `uv lock --upgrade-package NAME` to move one dependency).

UV_VERSION=0.13.8
INFER_CTL_CACHE=${INFER_CTL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infer-ctl}

# The oldest Python infer-ctl runs on: pyproject.toml's requires-python (">=3.11") and its classifiers say the same
# (tests/test_python_versions.py checks they agree).
PYTHON_MIN=3.11

# _python: the interpreter for .venv: $INFER_CTL_PYTHON when set, else the first of python3 (the system's),
# python3.13, python3.12, python3.11 that is at least $PYTHON_MIN; prints its path.
_python() {
  local cand version
  for cand in ${INFER_CTL_PYTHON:-python3 python3.13 python3.12 python3.11}; do
    command -v "$cand" >/dev/null 2>&1 || continue
    version=$("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || continue
    if _version_at_least "$version" "$PYTHON_MIN"; then
      command -v "$cand"; return 0
    fi
    if [ -n "${INFER_CTL_PYTHON:-}" ]; then
      echo "INFER_CTL_PYTHON=$cand is Python $version; infer-ctl needs $PYTHON_MIN or newer" >&2
      return 1
    fi
  done
  if [ -n "${INFER_CTL_PYTHON:-}" ]; then
    echo "INFER_CTL_PYTHON=$INFER_CTL_PYTHON: no such command" >&2
  else
    echo "infer-ctl needs Python $PYTHON_MIN or newer (python3, python3.13, python3.12 or python3.11, none found);" \
      "install it with: apt-get install python3 python3-venv" >&2
  fi
  return 1
}

# _version_at_least X.Y A.B: true when X.Y >= A.B (as numbers: 3.13 > 3.9).
_version_at_least() {
  local x=${1%%.*} y=${1#*.} a=${2%%.*} b=${2#*.}
  [ "$x" -gt "$a" ] || { [ "$x" -eq "$a" ] && [ "$y" -ge "$b" ]; }
}

# _uv: the pinned uv, installed once into its own venv in the cache outside the repository; prints its path.
_uv() {
  local dir=$INFER_CTL_CACHE/uv-$UV_VERSION py
  if [ ! -x "$dir/bin/uv" ]; then
    py=$(_python) || return 1
    echo "[setup] installing uv $UV_VERSION into $dir" >&2
    rm -rf "$dir"
    if ! "$py" -m venv "$dir" 2>/dev/null; then
      # Debian splits venv/ensurepip out of python3 (python3.X-venv, for the X chosen): install it, then try again.
      rm -rf "$dir"
      bootstrap_debian_package "python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
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
  py=$(_python) || return 1
  # the interpreter's path and version are part of the stamp: another Python makes uv sync build .venv anew
  want=$( { cat uv.lock pyproject.toml; echo "$UV_VERSION $* $py"; "$py" --version; } | sha256sum | cut -c1-16)
  if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  uv=$(_uv) || return 1
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
