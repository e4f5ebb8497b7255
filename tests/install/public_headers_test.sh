#!/usr/bin/env bash
# Every public header (keel/**/*.h under the given include roots) compiles on its own with the
# project's warnings as errors, and pulls in no third-party header a user would not expect: no
# SQLite, Qt, OpenSSL, BLAS, zstd, libdw, Graphviz, nlohmann-json or CLI11 behind Keel's API.
# Usage: public_headers_test.sh CXX INCLUDE_DIR...
set -euo pipefail
cxx="$1"
shift
incs=()
for d in "$@"; do incs+=("-I$d"); done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
headers=()
for d in "$@"; do
  while IFS= read -r h; do headers+=("${h#"$d"/}"); done < <(find "$d/keel" -name '*.h' | sort)
done
[ ${#headers[@]} -gt 0 ] || { echo "public_headers_test: no headers under $*" >&2; exit 1; }
check() {
  local h="$1" tu="$work/$(echo "$1" | tr '/.' '__').cpp"
  printf '#include <%s>\n#include <%s>\n' "$h" "$h" >"$tu"  # twice: the include guard works
  if ! "$cxx" -std=c++20 -Wall -Wextra -Wpedantic -Wno-unused-parameter -Werror -fsyntax-only "${incs[@]}" "$tu" \
      2>"$tu.err"; then
    echo "public_headers_test: <$h> does not compile on its own:" >&2
    head -20 "$tu.err" >&2
    return 1
  fi
  local leaks
  leaks="$("$cxx" -std=c++20 -M "${incs[@]}" "$tu" | tr ' \\' '\n\n' |
    grep -Ei 'sqlite|openssl|cblas|openblas|/qt|zstd|elfutils|libdw|graphviz|nlohmann|CLI11' || true)"
  if [ -n "$leaks" ]; then
    echo "public_headers_test: <$h> exposes third-party headers:" $leaks >&2
    return 1
  fi
}
failed=0
pids=()
for h in "${headers[@]}"; do
  check "$h" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then  # at most $(nproc) compilers at a time
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || exit 1
echo "${#headers[@]} public headers compile on their own and expose no third-party headers"
