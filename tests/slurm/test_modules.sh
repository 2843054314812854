#!/usr/bin/env bash
# The modulefiles under Debian's Lmod, with the layout `cmake --install` produces: loading
# dstrain puts the installed executable on PATH and sets DSTRAIN_ROOT, from an installed prefix
# (PREFIX/share/modulefiles) and from a source checkout's modulefiles/ (pointing at its install/),
# for the Lua file and for the Tcl file alike.
#   test_modules.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -uo pipefail
build=${1:?} source_dir=${2:?} work=${3:?}
lmod_init=/usr/share/lmod/lmod/init/bash
[[ -f $lmod_init ]] || { echo "FAIL: Lmod is missing ($lmod_init): scripts/install-deps.sh --with-tests installs it"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# loads MODULEPATH EXPECTED_ROOT: in a fresh shell, `module load dstrain` and check what it did.
loads() {
  local modulepath=$1 root=$2 out
  out=$(env -u DSTRAIN_PREFIX -u DSTRAIN_ROOT bash -c "source $lmod_init && module use $modulepath && module load dstrain \
        && echo ROOT=\$DSTRAIN_ROOT && echo BIN=\$(command -v dstrain) && dstrain --version" 2>&1) ||
    fail "module load dstrain from $modulepath: $out"
  grep -qx "ROOT=$root" <<<"$out" || fail "DSTRAIN_ROOT is not $root: $out"
  grep -qx "BIN=$root/bin/dstrain" <<<"$out" || fail "dstrain on PATH is not $root/bin/dstrain: $out"
  grep -q "^dstrain " <<<"$out" || fail "the loaded dstrain does not run: $out"
}

# An installed prefix: the Lua file (Lmod prefers it) ...
cmake --install "$build" --prefix "$work/prefix" >/dev/null || fail "cmake --install"
[[ -x $work/prefix/bin/dstrain && -f $work/prefix/share/dstrain/jobs/common.sh ]] || fail "incomplete installation"
loads "$work/prefix/share/modulefiles" "$work/prefix"
# ... and the Tcl file alone.
cmake --install "$build" --prefix "$work/tcl-prefix" >/dev/null || fail "cmake --install"
rm "$work/tcl-prefix"/share/modulefiles/dstrain/*.lua
loads "$work/tcl-prefix/share/modulefiles" "$work/tcl-prefix"
# A checkout: modulefiles/ beside install/.
mkdir -p "$work/checkout" && cp -r "$source_dir/modulefiles" "$work/checkout/"
cmake --install "$build" --prefix "$work/checkout/install" >/dev/null || fail "cmake --install"
loads "$work/checkout/modulefiles" "$work/checkout/install"
echo "PASS: modulefiles (Lua and Tcl) load the installed dstrain"
