#!/usr/bin/env bash
# Runs a libFuzzer harness once over every file of the given directories
# (its seed corpus and its regression inputs) without fuzzing: a crash, a
# sanitizer report or a failed check in any input fails the test.
#
#   replay.sh HARNESS DIR...
set -euo pipefail
harness=$1
shift
files=()
for dir in "$@"; do
  [[ -d $dir ]] || continue
  while IFS= read -r -d '' f; do files+=("$f"); done \
    < <(find "$dir" -type f ! -name '*.md' -print0 | sort -z)
done
if ((${#files[@]} == 0)); then
  echo "replay.sh: no inputs under $*" >&2
  exit 1
fi
echo "replaying ${#files[@]} inputs through $(basename "$harness")"
# One process per batch keeps the command line short; libFuzzer runs each
# file given as an argument once and exits non-zero on the first failure
# (xargs then exits non-zero too).
printf '%s\0' "${files[@]}" | xargs -0 -n 200 "$harness"
