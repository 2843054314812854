#!/usr/bin/env bash
# Rewrites README.md's configuration reference (between its BEGIN/END option reference markers)
# from the option table of the built dstrain (`dstrain train --help-markdown`), which the unit
# test Readme.OptionReferenceMatchesTheOptionTable compares it with.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
reference=$(mktemp)
trap 'rm -f "$reference"' EXIT
"$dstrain" train --help-markdown > "$reference"
awk -v reference="$reference" '
  /<!-- BEGIN option reference -->/ { print; while ((getline line < reference) > 0) print line; skipping = 1; next }
  /<!-- END option reference -->/ { skipping = 0 }
  !skipping { print }
' "$root/README.md" > "$root/README.md.new"
grep -q '<!-- END option reference -->' "$root/README.md.new" || { echo "README.md lacks the markers" >&2; rm -f "$root/README.md.new"; exit 1; }
mv "$root/README.md.new" "$root/README.md"
