#!/usr/bin/env bash
# Compiles every C++ file of dstrain, syntax only, against the headers of another LibTorch taken
# from Debian's libtorch-dev package (downloaded, never installed): how a machine without a GPU
# host finds what would stop the LibTorch 2.x build there, before a short lease is spent on it.
#   scripts/check_torch_headers.sh [VERSION]    a libtorch-dev version such as 2.6.0+dfsg-7 (trixie's);
#                                               default: the newest of Debian's sid and trixie
# WORK (default /tmp/dstrain-torch-headers) keeps the package between runs; JOBS (default: cores);
# ONLY (a regular expression over the files' paths) checks just those, e.g. the files a change touched.
# Where CUDA's headers are (CUDA_HOME, default /usr/local/cuda; NCCL's nccl.h there or in
# NCCL_INCLUDE), the files are checked as a GPU build compiles them (DSTRAIN_WITH_CUDA, the NCCL
# backend, dstrain's own kernels), the GPU tests (tests/gpu) with them, and each CUDA kernel
# (src/**/*.cu) is compiled by CUDA's nvcc for H100/H200.
# Limits: a header that 2.x removed is still found among this machine's own LibTorch headers:
# changed declarations show, removed headers not.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/dstrain-torch-headers}
jobs=${JOBS:-$(nproc)}
version=${1:-}

# A private apt state that reads Debian's development and stable suites from this machine's mirror.
apt_dir=$work/apt
mkdir -p "$apt_dir"/etc/apt/{sources.list.d,preferences.d} "$apt_dir"/var/lib/apt/lists/partial \
  "$apt_dir"/var/cache/apt/archives/partial "$work/debs"
mirror=$(grep -hm1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true)
[[ -n $mirror ]] || mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' "$mirror" sid "$mirror" trixie \
  >"$apt_dir/etc/apt/sources.list"
apt_options=(-o "Dir::Etc=$apt_dir/etc/apt" -o "Dir::State=$apt_dir/var/lib/apt"
             -o "Dir::Cache=$apt_dir/var/cache/apt" -o Dir::State::status=/var/lib/dpkg/status)
download() { (cd "$work/debs" && apt-get "${apt_options[@]}" download -q "libtorch-dev${version:+=$version}" >/dev/null); }
# The suites' lists take minutes to fetch: again only when the version asked for is not in them.
download 2>/dev/null || { apt-get "${apt_options[@]}" update -q >/dev/null && download; }
deb=$(ls "$work"/debs/libtorch-dev_${version:-*}_*.deb | sort -V | tail -n 1)  # the newest version, not the newest file
headers=$work/root-$(basename "$deb" .deb)
[[ -d $headers ]] || { mkdir -p "$headers.tmp" && dpkg-deb -x "$deb" "$headers.tmp" && mv "$headers.tmp" "$headers"; }
# Older releases define the version in torch/version.h; newer ones include torch/headeronly/version.h there.
for version_h in "$headers"/usr/include/torch/{csrc/api/include/torch,headeronly}/version.h; do
  grep -qs 'define TORCH_VERSION_MAJOR' "$version_h" && break
done
major=$(awk '/define TORCH_VERSION_MAJOR/ {print $3}' "$version_h")
minor=$(awk '/define TORCH_VERSION_MINOR/ {print $3}' "$version_h")
standard=c++17
((major > 2 || (major == 2 && minor >= 14))) && standard=c++20  # its ATen.h refuses C++17
# The GPU build's switches where CUDA's headers are here; the one header of LibTorch's CUDA side
# that its CMake build generates (and Debian's package lacks) as that build writes it.
cuda=${CUDA_HOME:-/usr/local/cuda}
gpu_flags=()
if [[ -f $cuda/include/cuda_runtime_api.h ]]; then
  mkdir -p "$work/cuda-shim/c10/cuda/impl"
  echo '#define C10_CUDA_BUILD_SHARED_LIBS' >"$work/cuda-shim/c10/cuda/impl/cuda_cmake_macros.h"
  gpu_flags=(-DDSTRAIN_WITH_CUDA=1 -DDSTRAIN_WITH_CUDA_KERNELS=1 -isystem "$work/cuda-shim" -isystem "$cuda/include")
  nccl=${NCCL_INCLUDE:-$cuda/include}
  [[ -f $nccl/nccl.h ]] && gpu_flags+=(-DDSTRAIN_WITH_NCCL=1 -isystem "$nccl")
fi
echo "LibTorch $major.$minor headers from $(basename "$deb"), $standard${gpu_flags:+, CUDA from $cuda}"

# This project's compile commands (a configuration only), each turned into a syntax check against
# those headers, which come before this machine's own. torch_api.h, which every file includes
# first, is precompiled once with the library's flags: ten times faster than parsing it each time.
cmake -S "$root" -B "$work/build" -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
rm -rf "$work/checks" "$work/pch" && mkdir -p "$work/checks" "$work/pch/dstrain/core"
python3 - "$work/build/compile_commands.json" "$headers/usr/include" "$standard" "$work" "$root" "${ONLY:-}" \
  "${gpu_flags[@]}" <<'PY'
import glob, json, re, shlex, sys
commands, include, standard, work, root, only = sys.argv[1:7]
gpu_flags = sys.argv[7:]

def check_flags(entry):
    words, kept, skip = shlex.split(entry["command"]), [], 0
    for i, word in enumerate(words):
        if skip:
            skip -= 1
        elif word in ("-o", "-MF", "-MT") or (word == "-include" and "cmake_pch" in words[i + 1]):
            skip = 1
        elif word in ("-c", "-MD", "-Winvalid-pch", entry["file"]):
            pass
        elif word == "-isystem" and words[i + 1].endswith("/torch/csrc/api/include"):
            kept += ["-isystem", include + "/torch/csrc/api/include", "-isystem", include]
            skip = 1
        else:
            kept.append(word.replace("-std=c++17", "-std=" + standard))
    return kept[:1] + ["-I", work + "/pch"] + gpu_flags + kept[1:]

def script(path, entry, words):
    with open(path, "w") as out:
        out.write(f"cd {shlex.quote(entry['directory'])} && {' '.join(map(shlex.quote, words))}\n")

entries = [e for e in json.load(open(commands)) if "cmake_pch" not in e["file"]]
if gpu_flags:  # the GPU tests, which only a CUDA build configures, with the end-to-end tests' flags
    e2e = next(e for e in entries if "/tests/e2e/" in e["file"])
    entries += [dict(e2e, file=f, command=e2e["command"].replace(e2e["file"], f))
                for f in sorted(glob.glob(root + "/tests/gpu/*.cpp"))]
library = next(e for e in entries if "/src/" in e["file"])
script(work + "/pch.sh", library, check_flags(library) + ["-x", "c++-header", root + "/include/dstrain/core/torch_api.h",
                                                       "-o", work + "/pch/dstrain/core/torch_api.h.gch"])
for n, entry in enumerate(e for e in entries if re.search(only, e["file"])):
    words = check_flags(entry) + ["-include", "dstrain/core/torch_api.h", "-fsyntax-only", entry["file"]]
    script(f"{work}/checks/{n:04d}.sh", entry, words)
PY
# (Beside it the header itself, which later includes of it find there and skip.)
ln -s "$root/include/dstrain/core/torch_api.h" "$work/pch/dstrain/core/torch_api.h"
bash "$work/pch.sh" >"$work/pch.log" 2>&1 || echo "(torch_api.h does not precompile: each file parses it on its own)"
: >"$work/failed"
ls "$work"/checks/*.sh | xargs -P "$jobs" -I{} sh -c 'bash {} >{}.log 2>&1 || echo "{}" >>"$0"' "$work/failed"
# dstrain's own CUDA kernels, compiled (not linked) for H100/H200 as a GPU build does.
if [[ -n ${gpu_flags[*]} && -x $cuda/bin/nvcc ]]; then
  n=0
  for kernel in $(find "$root/src" -name '*.cu' | sort); do
    [[ $kernel =~ ${ONLY:-.} ]] || continue
    check=$work/checks/cu$((n++)).sh
    echo "$cuda/bin/nvcc -std=c++17 -arch=sm_90 -c $kernel -o /dev/null # $kernel" >"$check"
    bash "$check" >"$check.log" 2>&1 || echo "$check" >>"$work/failed"
  done
fi
total=$(ls "$work"/checks/*.sh | wc -l)
failed=$(sort -u "$work/failed" | wc -l)
for script in $(sort -u "$work/failed"); do
  echo "--- $(awk '{print $NF}' "$script")"
  grep -m 5 -E 'error' "$script.log" || tail -n 5 "$script.log"
done
echo "$((total - failed)) passed, $failed failed (of $total files, LibTorch $major.$minor)"
((failed == 0))
