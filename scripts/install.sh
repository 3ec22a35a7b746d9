#!/usr/bin/env bash
# Install everything distseg needs, skipping what is already there.
#
# Used by `make demo`, `make test`, `.ci/run` and docker/Dockerfile, so there is
# one source of truth for the set-up. Safe to run again: each step checks first.
#
# Environment:
#   VENV        virtual environment to create/use (default: .venv in the repo)
#   PYTHON      interpreter used to create it (default: python3.11, else python3)
#   SKIP_APT=1  never call apt-get (e.g. inside an image that already has them)
#   WITH_CHROMIUM=1  also headless Chromium, which the report's screenshot test opens
#               report.html in (`make test` sets it; the image and `make demo` do not)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$here/.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
APT_PACKAGES="make openmpi-bin libopenmpi-dev cmake g++ libhighwayhash-dev libfarmhash-dev shellcheck"
if [ "${WITH_CHROMIUM:-0}" = 1 ]; then
  APT_PACKAGES="$APT_PACKAGES chromium"
fi
TF_VERSION=2.18.1
HOROVOD_VERSION=0.28.1
LIVER_PKG=liver-ct-segmentation-package==1.6.0

say() { printf '[install] %s\n' "$*"; }

# 1. System packages (Open MPI, compilers and the hash headers TF's C++ API needs;
#    Chromium only when asked: about 350 MB that only one test uses).
missing=""
for p in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  if [ "${SKIP_APT:-0}" = 1 ]; then
    say "missing system packages:$missing (SKIP_APT=1, not installing)"; exit 1
  fi
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  say "apt-get install$missing"
  $sudo apt-get update -qq
  # shellcheck disable=SC2086 # $missing is a list of package names
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# 2. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip "setuptools>=68" wheel
fi
# pip, without the warnings some mirrors' configs print once per package.
pip() {
  "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
py="$VENV/bin/python"

# 3. TensorFlow first: Horovod compiles against the installed TensorFlow.
if ! $py -c "import tensorflow as tf; assert tf.__version__ == '$TF_VERSION'" 2>/dev/null; then
  say "installing tensorflow-cpu==$TF_VERSION and the Python dependencies"
  pip install -q "tensorflow-cpu==$TF_VERSION"
fi

# 4. Horovod, built from source against that TensorFlow (MPI and Gloo controllers).
#    pip keeps the built wheel in its cache, so a second install takes seconds.
if ! $py -c "import horovod.tensorflow as hvd; assert hvd.mpi_built() and hvd.gloo_built()" 2>/dev/null; then
  say "building horovod==$HOROVOD_VERSION (about 3 minutes on 2 cores the first time; then from pip's cache)"
  start=$(date +%s)
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  MAKEFLAGS="-j$(nproc)" \
    pip install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
  say "horovod installed in $(( $(date +%s) - start )) s"
fi

# 5. The real liver CT case (LiTS 117). --no-deps: the package pins an ancient torch.
if ! $py -c "import importlib.metadata as m; m.version('liver-ct-segmentation-package')" 2>/dev/null; then
  say "installing $LIVER_PKG (data only, --no-deps)"
  pip install -q --no-deps "$LIVER_PKG"
fi

# 6. distseg itself (editable) with its runtime and test dependencies.
stamp="$VENV/.distseg-installed"
want=$(cat "$here/setup.cfg" "$here/pyproject.toml" 2>/dev/null | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "pip install -e .[test]"
  pip install -q --no-build-isolation -e "${here}[test]"
  echo "$want" > "$stamp"
fi
say "ready: $VENV"
