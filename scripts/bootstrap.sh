# Shared set-up for ./run and ./test (sourced, not executed).
# Creates .venv with Python 3.11 and installs the project when pyproject.toml changed since the last install;
# installs Debian packages with apt-get when their command is missing.

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

bootstrap_venv() {
  local py stamp want
  if [ ! -x .venv/bin/python ]; then
    py=$(_python311)
    echo "[setup] creating .venv with $py" >&2
    if ! "$py" -m venv .venv 2>/dev/null; then
      # Debian splits venv/ensurepip out of python3: install it, then try again.
      rm -rf .venv
      bootstrap_debian_package "python3-venv"
      "$py" -m venv .venv
    fi
  fi
  stamp=.venv/.infer-ctl-installed
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "[setup] installing infer-ctl and its dependencies into .venv" >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]' >&2
    echo "$want" > "$stamp"
  fi
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
bootstrap_kube() {
  local bin
  bin=$(bash scripts/kube-binaries.sh) || return 1
  export INFER_CTL_KUBE_BIN=$bin
}
