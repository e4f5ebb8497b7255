#!/usr/bin/env bash
# docs/api.md is a guide a newcomer follows; this builds exactly what it says. Keel is installed
# into a scratch ~/keel, the project is put together from the guide's blocks (a block opening with
# `// file: NAME` or `# file: NAME` belongs to file NAME, in page order), commands.sh runs as
# written (build, keel record --workload, inspect, ops, a cpu-ref vs cpu diff, a studio picture),
# every `# output: CMD` block must equal what CMD prints, and the loss falls as the guide promises.
# Usage: api_guide_test.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CXX
set -euo pipefail
cmake="$1" build="$2" src="$3" work="$4" cxx="$5"
die() { echo "api_guide_test: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work/home/project" "$work/outputs"
export HOME="$work/home"  # the guide's ~/keel, and the studio's settings, stay in here
"$cmake" --install "$build" --prefix "$HOME/keel" >/dev/null

# The project, from the guide's marked blocks; outputs/N.cmd + outputs/N.out per `# output:`.
project="$HOME/project"
awk -v dir="$project" -v outs="$work/outputs" '
  /^```/ { if (inblock) { inblock = 0; target = "" } else { inblock = 1; first = 1 } next }
  inblock && first {
    first = 0
    if (match($0, /^(\/\/|#) file: [A-Za-z0-9_.-]+$/)) {
      target = dir "/" substr($0, index($0, "file: ") + 6)
    } else if (match($0, /^# output: /)) {
      n++
      print substr($0, 11) > (outs "/" n ".cmd")
      close(outs "/" n ".cmd")
      target = outs "/" n ".out"
      next
    }
  }
  inblock && target != "" { print >> target }
' "$src/docs/api.md"
for f in CMakeLists.txt first_steps.cpp mlp.cpp leaky_relu.h leaky_relu.cpp commands.sh; do
  [ -s "$project/$f" ] || die "docs/api.md has no block for $f"
done
ls "$work/outputs"/*.cmd >/dev/null 2>&1 || die "docs/api.md shows no # output: block"

# The commands as written, with warnings as errors for the guide's code.
export KEEL_BLAS_TUNE=0
cd "$project"
CXX="$cxx" CXXFLAGS="-Wall -Wextra -Werror" \
  bash -euo pipefail commands.sh >"$work/commands.log" 2>&1 ||
  { tail -40 "$work/commands.log" >&2; die "commands.sh from docs/api.md failed"; }

# Every shown output is what the command prints.
for cmdfile in "$work/outputs"/*.cmd; do
  cmd="$(cat "$cmdfile")" expected="${cmdfile%.cmd}.out"
  PATH="$HOME/keel/bin:$PATH" bash -c "$cmd" >"$work/actual.out" 2>&1 || die "'$cmd' failed"
  diff -u "$expected" "$work/actual.out" >&2 ||
    die "'$cmd' does not print what docs/api.md shows (- doc, + actual)"
done

# What section 9 promises: the first step's line, the backends equal within tolerance, and 40
# finite losses, from 1.73 in step 1 to below 0.1 in step 40.
grep -q "^step 1/40  loss 1.7301$" "$work/commands.log" ||
  die "keel record printed no 'step 1/40  loss 1.7301'"
grep -q "^EQUAL within tolerance" "$work/commands.log" || die "keel diff: cpu-ref and cpu differ"
keel="$HOME/keel/bin/keel"
"$keel" inspect run.db >"$work/inspect.txt"
grep -q "status finished" "$work/inspect.txt" || die "run.db is not finished"
awk '$1 == "step" && $3 == "loss" { print $4 }' "$work/inspect.txt" >"$work/losses.txt"
[ "$(wc -l <"$work/losses.txt")" -eq 40 ] || die "expected 40 losses: $(cat "$work/inspect.txt")"
awk 'NR == 1 { first = $1 }
  { if ($1 !~ /^[0-9.]+$/) { print "loss " NR " is " $1; exit 1 } last = $1 }
  END { if (first < 1.7 || first > 1.76 || !(last < 0.1)) {
          print "loss " first " -> " last; exit 1 } }' "$work/losses.txt" >&2 ||
  die "the loss does not fall as docs/api.md says"

# The user op is recorded with an MD5, forward under scope act, and its backward op too.
"$keel" ops run.db --step 1 --phase forward --name leaky_relu >"$work/op.txt"
grep -Eq ' forward +leaky_relu +act +[0-9.]+ +[0-9a-f]{16} ' "$work/op.txt" ||
  die "no leaky_relu op with an MD5 under scope act: $(cat "$work/op.txt")"
"$keel" ops run.db --step 1 --phase backward --name leaky_relu_backward | tail -1 |
  grep -q '^1 ' || die "leaky_relu_backward is not in step 1's backward pass"

# The studio opened the recording and drew it.
[ "$(head -c 8 run.png | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
  die "keel-studio wrote no PNG picture"
echo "api_guide: docs/api.md built, recorded and shown; loss" \
  "$(head -1 "$work/losses.txt") -> $(tail -1 "$work/losses.txt")"
