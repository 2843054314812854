#!/usr/bin/env bash
# Rewrites docs/configuration.md's option reference (between its BEGIN/END option reference markers)
# from the option table of the built dstrain (`dstrain train --help-markdown`), which the unit
# test ConfigurationDoc.OptionReferenceMatchesTheOptionTable compares it with.
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
' "$root/docs/configuration.md" > "$root/docs/configuration.md.new"
grep -q '<!-- END option reference -->' "$root/docs/configuration.md.new" || { echo "docs/configuration.md lacks the markers" >&2; rm -f "$root/docs/configuration.md.new"; exit 1; }
mv "$root/docs/configuration.md.new" "$root/docs/configuration.md"
