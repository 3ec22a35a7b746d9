#!/usr/bin/env bash
# Install everything distseg needs, skipping what is already there.
#
# Used by `make demo`, `make test`, `.ci/run` and docker/Dockerfile, so there is one
# source of truth for the set-up. Safe to run again: each step checks first. Works as
# root on Debian (apt fills in what is missing) and as a cluster user without root, with
# the compiler, MPI and Python from `module load` (docs/install.md).
#
# Environment:
#   VENV        virtual environment to create/use (default: .venv in the repo)
#   PYTHON      interpreter used to create it (default: python3.11, 3.12, 3.10, python3)
#   MPICC, MPICXX  the MPI compiler wrappers Horovod is built with (default:
#               mpicc and mpicxx on PATH, i.e. the loaded MPI module)
#   WHEELHOUSE  the wheels every install goes through (default
#               ~/.cache/distseg/wheelhouse): pypi/ holds what the package index gave,
#               one folder per MPI, TensorFlow and Python holds Horovod built for them
#               (pip's own cache does not know which MPI a wheel was built with)
#   OFFLINE=1   never contact a package index: install from WHEELHOUSE only, as filled
#               by an earlier install where the index was reachable
#   SKIP_APT=1  never call apt-get. Without it apt-get is used only when it exists and
#               we are root or `sudo -n true` allows it (never a password prompt)
#   WITH_TEST_TOOLS=1  also Chromium (report.html's screenshot test), shellcheck and
#               MPICH (the wrong-MPI test), with apt; `make test` sets it
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$here/.venv}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3.12 || command -v python3.10 ||
                   command -v python3 || echo python3)}
MPICC=${MPICC:-mpicc}
MPICXX=${MPICXX:-mpicxx}
WHEELHOUSE=${WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/distseg/wheelhouse}
TF_VERSION=2.18.1
HOROVOD_VERSION=0.28.1
LIVER_PKG=liver-ct-segmentation-package==1.6.0
#: Debian packages that give each capability, for machines where apt may be used.
APT_FOR_CXX="g++" APT_FOR_CMAKE="cmake" APT_FOR_MAKE="make" APT_FOR_MPI="openmpi-bin libopenmpi-dev"
APT_TEST_TOOLS="chromium shellcheck mpich"

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }
started=$(date +%s)
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT

may_apt() {  # apt-get exists, is allowed, and needs no password
  [ "${SKIP_APT:-0}" != 1 ] && command -v apt-get >/dev/null 2>&1 &&
    { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }
}

apt_install() {  # apt_install PACKAGE...
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  say "apt-get install $*"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# 1. What the build needs, checked by what it can do, not by package name.
python_problem() {
  local v
  v=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
    { echo "no Python at '$PYTHON': load one (e.g. 'module load python/3.11') or set PYTHON"; return; }
  case $v in 3.10|3.11|3.12) ;; *)
    echo "Python $v ($PYTHON): distseg needs 3.10-3.12 (TensorFlow $TF_VERSION has wheels for those only); load one (e.g. 'module load python/3.11') or set PYTHON"; return ;;
  esac
  "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
    echo "Python $v ($PYTHON) lacks venv/ensurepip: load a full Python module, or install python3-venv"
}

cxx_problem() {  # a C++17 compiler (TensorFlow's headers need C++17)
  local d
  d=$(mktemp -d)
  printf '#include <optional>\nint main() { std::optional<int> x; return x ? 1 : 0; }\n' > "$d/t.cc"
  "${CXX:-c++}" -std=c++17 "$d/t.cc" -o "$d/t" >/dev/null 2>&1 ||
    echo "no C++17 compiler (${CXX:-c++}): load one, e.g. 'module load gcc' (GCC 9 or later), or set CXX"
  rm -rf "$d"
}

cmake_problem() {  # CMake 3.13 or later, which Horovod's build calls
  local v
  v=$(cmake --version 2>/dev/null | awk 'NR == 1 {print $3}')
  [ -n "$v" ] || { echo "no cmake on PATH: load one, e.g. 'module load cmake' (3.13 or later)"; return; }
  printf '3.13\n%s\n' "$v" | sort -V -C ||
    echo "cmake $v is older than the 3.13 Horovod needs: load a newer one, e.g. 'module load cmake'"
}

make_problem() { command -v make >/dev/null 2>&1 || echo "no make on PATH: load or install GNU make"; }

mpi_problem() {  # the MPI wrappers compile and link a program that asks its library's name
  if ! command -v "$MPICC" >/dev/null 2>&1 || ! command -v "$MPICXX" >/dev/null 2>&1; then
    echo "no MPI compiler wrappers ($MPICC, $MPICXX) on PATH: load your site's MPI, e.g. 'module load openmpi' or 'module load impi', or set MPICC and MPICXX"
    return
  fi
  mpi_probe >/dev/null ||
    echo "$MPICC cannot build an MPI program (see $probe_dir/build.log): check the loaded MPI module"
}

mpi_probe() {  # prints the MPI library's own name (MPI_Get_library_version), then its path
  cat > "$probe_dir/probe.c" <<'EOF'
#include <mpi.h>
#include <stdio.h>
int main(void) {  /* allowed before MPI_Init: no launcher needed */
  char name[MPI_MAX_LIBRARY_VERSION_STRING]; int n;
  MPI_Get_library_version(name, &n);
  printf("%s\n", name);
  return 0;
}
EOF
  "$MPICC" "$probe_dir/probe.c" -o "$probe_dir/probe" > "$probe_dir/build.log" 2>&1 || return 1
  "$probe_dir/probe" | sed -n '/[^[:space:]]/{s/^[[:space:]]*//;s/[[:space:]]*$//;p;q}'
  ldd "$probe_dir/probe" | awk '$1 ~ /^libmpi/ {print $3; exit}'
}

check_build_tools() {
  local problems="" p missing_apt=""
  for what in python cxx cmake make mpi; do
    p=$("${what}_problem")
    [ -z "$p" ] && continue
    case $what in
      cxx) missing_apt="$missing_apt $APT_FOR_CXX" ;; cmake) missing_apt="$missing_apt $APT_FOR_CMAKE" ;;
      make) missing_apt="$missing_apt $APT_FOR_MAKE" ;; mpi) missing_apt="$missing_apt $APT_FOR_MPI" ;;
    esac
    problems="$problems$p"$'\n'
  done
  if [ -n "$problems" ] && [ -n "$missing_apt" ] && [ -z "${apt_tried:-}" ] && may_apt; then
    apt_tried=1
    # shellcheck disable=SC2086 # a list of package names
    apt_install $missing_apt
    check_build_tools
    return
  fi
  [ -z "$problems" ] || { printf '%s' "$problems" | sed 's/^/[install] error: /' >&2; exit 1; }
}

check_build_tools
if [ "${WITH_TEST_TOOLS:-0}" = 1 ]; then
  if ! command -v chromium >/dev/null || ! command -v shellcheck >/dev/null ||
     ! command -v mpiexec.mpich >/dev/null; then
    if may_apt; then
      # shellcheck disable=SC2086 # a list of package names
      apt_install $APT_TEST_TOOLS
    else
      say "not installing $APT_TEST_TOOLS (no apt here): the tests that need them skip"
    fi
  fi
fi

# The MPI Horovod is built against: the one the wrappers on PATH belong to.
{ read -r mpi_name; read -r mpi_lib; } < <(mpi_probe)
mpi_show=$("$MPICXX" -show 2>/dev/null || "$MPICXX" --showme 2>/dev/null || true)
py_tag=$("$PYTHON" -c 'import sys; print("py%d%d" % sys.version_info[:2])')
mpi_slug=$(printf '%s' "$mpi_name" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9.]\{1,\}/-/g' | cut -c1-40 | sed 's/-$//')
mpi_hash=$(printf '%s|%s|%s' "$mpi_name" "$mpi_lib" "$mpi_show" | sha256sum | cut -c1-10)
KEY="tf$TF_VERSION-$py_tag-$mpi_slug-$mpi_hash"
say "MPI: $mpi_name"
say "     library $mpi_lib, wrappers $(command -v "$MPICXX")"

# 2. Virtual environment.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"
# pip, without the warnings some mirrors' configs print once per package.
pip() {
  "$py" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
pypi="$WHEELHOUSE/pypi" built="$WHEELHOUSE/$KEY"
mkdir -p "$pypi" "$built"
from_wheelhouse() { pip install -q --no-index --find-links "$pypi" --find-links "$built" "$@"; }

# 3. The wheelhouse: everything from the index once (skipped when complete), so that
#    every install, online or not, installs from the same files.
requirements() {  # distseg's own requirements and the test tools, from setup.cfg
  "$py" - "$here/setup.cfg" <<'EOF'
import configparser, sys
cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
text = cfg["options"]["install_requires"] + "\n" + cfg["options.extras_require"]["test"]
for line in text.splitlines():
    line = line.split("#")[0].strip()
    if line:
        print(line)
EOF
}
mapfile -t reqs < <(requirements)
wanted=(pip "setuptools>=68" wheel "tensorflow-cpu==$TF_VERSION" "horovod==$HOROVOD_VERSION" "${reqs[@]}")
how=(--no-binary horovod)  # Horovod as its source, to build; the rest as wheels
stamp="$pypi/.complete-$(printf '%s\n' "$py_tag" "${how[@]}" "${wanted[@]}" "$LIVER_PKG" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  [ "${OFFLINE:-0}" != 1 ] ||
    die "OFFLINE=1, but $pypi was not filled for these requirements: run scripts/install.sh once where the package index is reachable, with the same WHEELHOUSE and Python (docs/install.md#offline-compute-nodes)"
  say "filling the wheelhouse $pypi from the package index (once)"
  pip download -q -d "$pypi" "${how[@]}" "${wanted[@]}"
  pip download -q -d "$pypi" --no-deps "$LIVER_PKG"
  touch "$stamp"
fi
from_wheelhouse --upgrade pip "setuptools>=68" wheel

# 4. TensorFlow first: Horovod compiles against the installed TensorFlow.
if ! "$py" -c "import tensorflow as tf; assert tf.__version__ == '$TF_VERSION'" 2>/dev/null; then
  say "installing tensorflow-cpu==$TF_VERSION and its dependencies"
  from_wheelhouse "tensorflow-cpu==$TF_VERSION"
fi

# 5. Horovod (MPI and Gloo controllers), built against the MPI above once per MPI,
#    TensorFlow and Python ($built), and reinstalled when the MPI changes. The hash headers
#    TensorFlow's C++ API includes come with TensorFlow itself. mpi4py is not built: its
#    wheel carries both MPI ABIs (Open MPI's, and MPICH's, which Intel MPI and MVAPICH
#    share) and uses the library Horovod loaded (docs/install.md#the-sites-mpi).
build_horovod() {
  local inc t0
  inc=$("$py" -c "import tensorflow as tf; print(tf.sysconfig.get_include())" 2>/dev/null)
  t0=$(date +%s)
  say "building horovod==$HOROVOD_VERSION against $mpi_name (about 2 minutes on 2 cores)"
  PATH="$(dirname "$(command -v "$MPICXX")"):$PATH" \
  CPLUS_INCLUDE_PATH="$inc/external/highwayhash:$inc/external/farmhash_archive/src${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    pip wheel -q --no-index --find-links "$pypi" --no-build-isolation --no-deps \
      -w "$built" "$pypi/horovod-$HOROVOD_VERSION.tar.gz"
  say "built in $(( $(date +%s) - t0 )) s into $built"
}
if ! ls "$built"/horovod-*.whl >/dev/null 2>&1; then
  build_horovod
fi
if [ "$(cat "$VENV/.distseg-mpi" 2>/dev/null)" != "$KEY" ]; then
  say "installing the Horovod built for this MPI ($built)"
  from_wheelhouse --force-reinstall --no-deps "$built"/horovod-*.whl
  from_wheelhouse "horovod==$HOROVOD_VERSION"  # its pure-Python dependencies
  echo "$KEY" > "$VENV/.distseg-mpi"
  checked=0
fi

# 6. distseg itself (editable) with its runtime and test dependencies.
stamp="$VENV/.distseg-installed"
want=$(cat "$here/setup.cfg" "$here/pyproject.toml" 2>/dev/null | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  say "pip install -e .[test]"
  from_wheelhouse --no-build-isolation -e "${here}[test]"
  echo "$want" > "$stamp"
fi

# 7. The real liver CT case (LiTS 117). --no-deps: the package pins an ancient torch.
#    Last, so that no later pip run lists the pins it was installed without.
if ! "$py" -c "import importlib.metadata as m; m.version('liver-ct-segmentation-package')" 2>/dev/null; then
  say "installing $LIVER_PKG (data only, --no-deps)"
  from_wheelhouse --no-deps "$LIVER_PKG"
fi

# 8. Which MPI Horovod loads, kept where every rank compares it at start-up.
if [ "${checked:-1}" = 0 ] || [ ! -f "$VENV/share/distseg/horovod-mpi.json" ]; then
  TF_CPP_MIN_LOG_LEVEL=3 "$py" -m distseg.parallel.distributed --record-mpi "$VENV/share/distseg/horovod-mpi.json" "$mpi_name"
  TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/horovodrun" --check-build 2>/dev/null | sed -n '/Available Controllers/,/Gloo/p' | sed 's/^/[install] /'
fi
say "ready: $VENV ($(( $(date +%s) - started )) s)"
