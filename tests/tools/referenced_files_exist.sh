#!/usr/bin/env bash
# Every script the project's messages and documents tell a user to run exists: a path such as
# scripts/NAME.sh, tests/DIR/NAME.sh, bench/NAME.sh or jobs/NAME.sh named in the sources, the
# scripts, the tests and the documents is a file of the checkout.
#   referenced_files_exist.sh SOURCE_DIR
set -uo pipefail
root=${1:?source directory}
cd "$root"
missing=0
while read -r path; do
  [[ -f $path ]] || { echo "MISSING: $path (named in: $(grep -rlF --exclude=referenced_files_exist.sh "$path" README.md docs src include tests scripts jobs bench 2>/dev/null | tr '\n' ' '))"; missing=1; }
done < <(grep -rhoE --exclude=referenced_files_exist.sh '\b(scripts|tests/[a-z]+|bench|jobs)/[A-Za-z0-9_.-]+\.(sh|py|js)\b' README.md docs src include tests scripts \
           jobs bench 2>/dev/null | sort -u)
[[ $missing -eq 0 ]] && echo "every script named exists"
exit $missing
