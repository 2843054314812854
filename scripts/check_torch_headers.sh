#!/usr/bin/env bash
# Compiles every C++ file of dstrain, syntax only, against the headers of another LibTorch taken
# from Debian's libtorch-dev package (downloaded, never installed): how a machine without a GPU
# host finds what would stop the LibTorch 2.x build there, before a short lease is spent on it.
#   scripts/check_torch_headers.sh [VERSION]    a libtorch-dev version such as 2.6.0+dfsg-7 (trixie's);
#                                               default: the newest of Debian's sid and trixie
# WORK (default /tmp/dstrain-torch-headers) keeps the package between runs; JOBS (default: cores);
# ONLY (a regular expression over the files' paths) checks just those, e.g. the files a change touched.
# Limits: the CPU build's files only (no CUDA or NCCL code), and a header that 2.x removed is still
# found among this machine's own LibTorch headers: changed declarations show, removed headers not.
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
echo "LibTorch $major.$minor headers from $(basename "$deb"), $standard"

# This project's compile commands (a configuration only), each turned into a syntax check against
# those headers, which come before this machine's own. torch_api.h, which every file includes
# first, is precompiled once with the library's flags: ten times faster than parsing it each time.
cmake -S "$root" -B "$work/build" -G Ninja -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
rm -rf "$work/checks" "$work/pch" && mkdir -p "$work/checks" "$work/pch/dstrain/core"
python3 - "$work/build/compile_commands.json" "$headers/usr/include" "$standard" "$work" "$root" "${ONLY:-}" <<'PY'
import json, re, shlex, sys
commands, include, standard, work, root, only = sys.argv[1:]

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
    return kept[:1] + ["-I", work + "/pch"] + kept[1:]

def script(path, entry, words):
    with open(path, "w") as out:
        out.write(f"cd {shlex.quote(entry['directory'])} && {' '.join(map(shlex.quote, words))}\n")

entries = [e for e in json.load(open(commands)) if "cmake_pch" not in e["file"]]
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
total=$(ls "$work"/checks/*.sh | wc -l)
failed=$(sort -u "$work/failed" | wc -l)
for script in $(sort -u "$work/failed"); do
  echo "--- $(awk '{print $NF}' "$script")"
  grep -m 5 -E 'error' "$script.log" || tail -n 5 "$script.log"
done
echo "$((total - failed)) passed, $failed failed (of $total files, LibTorch $major.$minor)"
((failed == 0))
