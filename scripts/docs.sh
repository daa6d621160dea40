#!/usr/bin/env bash
# Builds the API reference (Doxygen, docs/api/Doxyfile) into build/docs/html, or into $1/html.
# Fails, listing each one, on any warning: an undocumented public declaration, a broken reference
# or a malformed command.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$root/build/docs}")"
command -v doxygen >/dev/null || { echo "docs.sh: doxygen is missing (apt-get install doxygen)" >&2; exit 1; }
mkdir -p "$out"
log="$out/warnings.txt"
# Doxygen reads paths relative to the folder it runs in (the Doxyfile's).
if (cd "$root/docs/api" && EF_DOCS_OUT="$out" doxygen Doxyfile 2>"$log") && [[ ! -s "$log" ]]; then
  echo "API reference: $out/html/index.html"
else
  # Inherited members are reported once per subclass: print each warning once.
  sort -u "$log" >&2
  echo "docs.sh: $(sort -u "$log" | wc -l) Doxygen warnings (above)" >&2
  exit 1
fi
