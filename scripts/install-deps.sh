#!/usr/bin/env bash
# Installs the Debian 12 packages dstrain builds and runs with; with --with-tests also what the
# tests need: Slurm with PMIx for the job scripts (on one node, and on the cluster in miniature's
# network namespaces), Lmod for the modulefiles, and Node.js with npm for the tokenizer's parity
# with tiktoken (tests/parity, which fetches tiktoken from the npm registry).
# Idempotent: when everything is already there it only checks (dpkg-query) and returns in well
# under a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev                      # LibTorch 1.13 (CPU); GPU hosts bring their own 2.x
  libopenblas0-pthread              # its matrix products: ~10x the reference BLAS Debian installs with it
  libopenmpi-dev openmpi-bin        # MPI bootstrap and CPU collectives
  libhdf5-openmpi-dev hdf5-tools    # parallel HDF5 (MPI-IO) for corpora and checkpoints; h5dump
  libboost-program-options-dev      # INI + command-line configuration
  libboost-dev                      # Boost.Beast and Asio (headers): dstrain serve's HTTP
  nlohmann-json3-dev                # JSONL corpora and metrics
  libpcre2-dev                      # Unicode regular expressions of BPE tokenizers (tokenizer.json)
  libicu-dev                        # their Unicode tables (newer than PCRE2's) and NFC normalization
  libgtest-dev                      # unit tests
  base-files                        # /usr/share/common-licenses: the demo corpus text
  python3                           # tests/tools/read_tfevents.py, an independent reader of TensorBoard files
  gnuplot-nox                       # dstrain plot draws its PNG charts with gnuplot (pngcairo)
)
if [[ ${1:-} == --with-tests ]]; then
  packages+=(slurm-wlm slurmctld slurmd slurm-client munge libpmix-dev  # Slurm for jobs/ (srun --mpi=pmix)
             lmod                                                      # modulefiles/
             iproute2 util-linux   # ip, tc, nsenter, unshare: the cluster in miniature (tests/cluster/)
             curl)                 # tests/serve: a real HTTP client besides Python's
  # tests/parity: tiktoken and GPT-2's encoder, independent tokenizers, from npm. Debian's packages
  # unless a Node.js with its own npm is there already (NodeSource's conflicts with Debian's npm).
  command -v npm >/dev/null || packages+=(nodejs npm)
fi

# Installed, OpenBLAS takes libblas.so.3 and liblapack.so.3 in Debian's alternatives (its
# priority is the higher one) unless someone chose another BLAS by hand: say so, change nothing.
check_blas() {
  local name link
  for name in libblas.so.3 liblapack.so.3; do
    link=$name-$(gcc -dumpmachine)
    if update-alternatives --query "$link" 2>/dev/null | grep -q '^Value: .*/\(blas\|lapack\)/'; then
      echo "install-deps: $link points at the reference implementation, about 10 times slower than OpenBLAS;" \
           "select OpenBLAS with: update-alternatives --config $link" >&2
    fi
  done
}

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  check_blas
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
check_blas
