# Sourced on a GPU host after `source .gpu-host/env.sh`, from the project's root: unpacks what
# scripts/fetch-gpu-host-extras.sh brought (EXTRAS, default .gpu-host/extras) and adds it to the
# build's search paths. PCRE2 and ICU go under /opt/deps with the rest; of the runtime libraries
# only those the host's own library cache lacks are copied there, so that none of the host's is
# replaced by Debian's. Adds -DICU_ROOT to DSDEV_CMAKE_ARGS.
extras=${EXTRAS:-.gpu-host/extras}
deps_lib=/opt/deps/usr/lib/x86_64-linux-gnu
if [ ! -e /opt/deps/.extras-unpacked ]; then
  while read -r package; do dpkg -x "$extras/${package}"_*.deb /opt/deps; done <"$extras/build-packages.txt"
  # The pkg-config file names its install prefix; point it at the unpacked tree.
  sed -i "s|^prefix=/usr\$|prefix=/opt/deps/usr|" $deps_lib/pkgconfig/libpcre2-8.pc
  staging=$(mktemp -d)
  for f in "$extras"/*.deb; do dpkg -x "$f" "$staging"; done
  for so in $(find "$staging" -name 'lib*.so.*' -type l -printf '%f\n' | sort -u); do  # the sonames
    ldconfig -p | grep -q "^[[:space:]]*$so " && continue
    [ -e "$deps_lib/$so" ] || cp -L "$(find "$staging" -name "$so" | head -n 1)" "$deps_lib/"
  done
  rm -rf "$staging"
  touch /opt/deps/.extras-unpacked
fi
export PKG_CONFIG_PATH=$deps_lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export DSDEV_CMAKE_ARGS="$DSDEV_CMAKE_ARGS -DICU_ROOT=/opt/deps/usr"
