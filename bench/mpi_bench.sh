# Sourced by the benchmark scripts that train on MPI ranks of this machine. Sets root, dstrain
# (DSTRAIN, or the build's) and work (a scratch directory removed at exit), lets mpirun run as
# root; `prepare_corpus [FILE]` sets corpus to FILE, or prepares the license texts every Debian
# system ships (on a host without them, this project's own documents).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

prepare_corpus() {
  corpus=${1:-}
  [[ -n $corpus ]] && return
  corpus=$work/corpus.h5
  local texts=(/usr/share/common-licenses/{GPL-2,GPL-3,Apache-2.0,MPL-2.0})
  [[ -r ${texts[0]} ]] || texts=("$root/README.md" "$root/bench/RESULTS.md")
  "$dstrain" prep --input "${texts[@]}" --output "$corpus" >/dev/null
}
