#!/usr/bin/env bash
# What a GPU host lacks for this project beyond ../shared/gpu-host's Open MPI, HDF5 and Boost,
# downloaded (not installed) on the development machine as Debian packages, into DEST (default
# .gpu-host/extras, which travels with .gpu-host): the headers and libraries of PCRE2 and ICU (the
# tokenizers' regular expressions), and the libraries the unpacked HDF5's libcurl loads. On the
# host, `source scripts/gpu-host-extras.sh` after .gpu-host/env.sh unpacks and uses them.
set -euo pipefail
dest=${1:-.gpu-host/extras}
mkdir -p "$dest"
cd "$dest"
build=(libpcre2-dev libpcre2-8-0 libicu-dev libicu72)
# libcurl4's own needs, found missing one by one on an H200 host (2026-11-28); only those the host
# lacks are used there.
runtime=(libssh2-1 libnghttp2-14 librtmp1 libpsl5 libbrotli1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libdb5.3
         libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libzstd1 libidn2-0
         libunistring2 libgnutls30 libnettle8 libhogweed6 libtasn1-6 libp11-kit0 libffi8 libgmp10)
[ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || apt-get update -q >/dev/null
for p in "${build[@]}" "${runtime[@]}"; do
  ls "${p}"_*.deb >/dev/null 2>&1 || apt-get download -q "$p" >/dev/null 2>&1 || { echo "could not download $p" >&2; exit 1; }
done
printf '%s\n' "${build[@]}" >build-packages.txt
du -sh .
