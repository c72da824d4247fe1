#!/usr/bin/env bash
# Runs the AFL++ targets built by `cargo afl build --release` (see mk/fuzz.mk).
#
#   fuzz.sh smoke BIN_DIR OUT_DIR SECONDS TARGET...
#       replay every seed of corpus/<target>/ through the target, then fuzz each target for
#       SECONDS from its corpus; fails if a seed or the fuzzer crashes or cannot run.
#   fuzz.sh run BIN_DIR OUT_DIR SECONDS TARGET...
#       fuzz each target for SECONDS; prints execs/s and coverage; fails on crashes.
# Crashing and hanging inputs are left in OUT_DIR/<target>/default/{crashes,hangs}/.
set -euo pipefail

mode=$1 bin=$2 out=$3 secs=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)

# Shared 2-core CI hosts: no CPU binding, no governor check, no core_pattern demand, no UI.
export AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
export AFL_NO_CRASH_README=1 AFL_QUIET=1

stat() { sed -n "s/^$2 *: //p" "$1/default/fuzzer_stats"; }

mkdir -p "$out"
fail=0
printf '%-9s %10s %10s %12s %8s %8s %6s %6s\n' target execs/s execs edges bitmap corpus crash hang
for t in "$@"; do
    exe="$bin/$t"
    [ -x "$exe" ] || { echo "fuzz: $exe missing (make fuzz-build)" >&2; exit 1; }
    seeds="$here/corpus/$t"
    [ -n "$(ls -A "$seeds" 2>/dev/null)" ] || { echo "fuzz: no seeds in $seeds" >&2; exit 1; }
    if [ "$mode" = smoke ]; then
        for f in "$seeds"/*; do
            if ! timeout 20 "$exe" < "$f" > /dev/null 2> "$out.replay.log"; then
                echo "fuzz: $t crashed on seed $f:" >&2
                tail -20 "$out.replay.log" >&2
                exit 1
            fi
        done
    fi
    rm -rf "${out:?}/$t"
    mkdir -p "$out"
    # -V: stop after SECONDS of fuzzing; -t: a 2 s hang limit (an execution takes milliseconds).
    if ! cargo afl fuzz -V "$secs" -t 2000 -i "$seeds" -o "$out/$t" -- "$exe" \
        > "$out/$t.log" 2>&1; then
        echo "fuzz: afl-fuzz failed for $t:" >&2
        tail -30 "$out/$t.log" >&2
        exit 1
    fi
    [ -f "$out/$t/default/fuzzer_stats" ] || { echo "fuzz: $t: no fuzzer_stats" >&2; exit 1; }
    crashes=$(stat "$out/$t" saved_crashes)
    hangs=$(stat "$out/$t" saved_hangs)
    execs=$(stat "$out/$t" execs_done)
    printf '%-9s %10s %10s %12s %8s %8s %6s %6s\n' "$t" "$(stat "$out/$t" execs_per_sec)" \
        "$execs" "$(stat "$out/$t" edges_found)/$(stat "$out/$t" total_edges)" \
        "$(stat "$out/$t" bitmap_cvg)" "$(stat "$out/$t" corpus_count)" "$crashes" "$hangs"
    if [ "${execs:-0}" -eq 0 ]; then
        echo "fuzz: $t ran no executions" >&2
        fail=1
    fi
    if [ "${crashes:-0}" -ne 0 ]; then
        echo "fuzz: $t: $crashes crashing inputs in $out/$t/default/crashes/" >&2
        fail=1
    fi
    # An execution takes milliseconds: one over the 2 s limit is a loop, i.e. a finding.
    if [ "${hangs:-0}" -ne 0 ]; then
        echo "fuzz: $t: $hangs hanging inputs in $out/$t/default/hangs/" >&2
        fail=1
    fi
done
exit $fail
