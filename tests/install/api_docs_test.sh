#!/usr/bin/env bash
# Builds the `docs` target (Doxygen over the public headers) and checks that the reference has
# its front page and the pages of the classes a user starts from.
# Usage: api_docs_test.sh CMAKE BUILD_DIR
set -euo pipefail
cmake="$1"
build="$2"
"$cmake" --build "$build" --target docs
html="$build/docs/api/html"
for page in index.html classkeel_1_1Tensor.html classkeel_1_1Trainer.html \
  classkeel_1_1VmmAllocator.html classkeel_1_1capture_1_1Recorder.html \
  classkeel_1_1storage_1_1Recording.html; do
  if [ ! -s "$html/$page" ]; then
    echo "api_docs: missing $html/$page" >&2
    exit 1
  fi
done
grep -q "Debug your own model\|Public C++ API\|workload" "$html/index.html" || {
  echo "api_docs: the front page is not docs/api.md" >&2
  exit 1
}
echo "api_docs: reference in $html"
