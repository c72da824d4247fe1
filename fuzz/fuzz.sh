#!/usr/bin/env bash
# Runs the AFL++ targets built by `cargo afl build --release` (see mk/fuzz.mk).
#
#   fuzz.sh smoke BIN_DIR OUT_DIR SECONDS TARGET...
#       replay every seed of corpus/<target>/ through the target, then fuzz each target for
#       SECONDS from its corpus; fails if a seed or the fuzzer crashes or cannot run.
#   fuzz.sh run BIN_DIR OUT_DIR SECONDS TARGET...
#       fuzz each target for SECONDS; prints execs/s and coverage; fails on crashes. With
#       FUZZ_LEDGER set, appends one line per target run to that ledger (see `fuzz.sh report`).
#   fuzz.sh cmin BIN_DIR OUT_DIR 0 TARGET...
#       replace corpus/<target>/ by the afl-cmin minimum of itself and OUT_DIR/<target>'s queue
#       (the queue's entries named q-<hash of content>, the named seeds keep their names).
#   fuzz.sh report LEDGER
#       per target: CPU-hours fuzzed, executions, edges and crashes, summed over the ledger;
#       "open" are the crashes that findings.tsv (beside the ledger: the campaign line's date
#       and target, the count, the fixing commit and its regression test) does not account for.
# Crashing and hanging inputs are left in OUT_DIR/<target>/default/{crashes,hangs}/, what the
# target's panics said (message, thread, backtrace) in OUT_DIR/<target>.panics/.
set -euo pipefail

mode=$1 bin=$2 out=${3:-} secs=${4:-0}
shift $(($# < 4 ? $# : 4))
here=$(cd "$(dirname "$0")" && pwd)

# Shared 2-core CI hosts: no CPU binding, no governor check, no core_pattern demand, no UI.
export AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
export AFL_NO_CRASH_README=1 AFL_QUIET=1

stat() { sed -n "s/^$2 *: //p" "$1/default/fuzzer_stats"; }

# The ledger's columns (tab-separated, one line per real `fuzz.sh run` of a target):
ledger_header='date\ttarget\tcpu_seconds\twall_seconds\texecs\tedges\ttotal_edges\tcrashes\thangs\tcommit'

if [ "$mode" = report ]; then
    ledger=$bin
    [ -s "$ledger" ] || { echo "fuzz: no ledger $ledger" >&2; exit 1; }
    findings="$(dirname "$ledger")/findings.tsv"
    [ -f "$findings" ] || findings=/dev/null
    # Edges are not additive: a target's figure is the most any run reached (each run starts
    # from the kept corpus, so the latest run is usually the highest).
    # findings.tsv first (FNR == NR): the crashes of a campaign line that a commit fixed.
    awk -F'\t' 'FNR == NR { if (FNR > 1) fixed[$1 "\t" $2] += $3; next }
        FNR > 1 {
            if (!($2 in runs)) order[n++] = $2
            open[$2] += $8 - fixed[$1 "\t" $2]; delete fixed[$1 "\t" $2]
            runs[$2]++; cpu[$2] += $3; wall[$2] += $4; execs[$2] += $5; crash[$2] += $8; hang[$2] += $9
            if ($6 + 0 > edges[$2] + 0) { edges[$2] = $6; total[$2] = $7 }
        }
        END {
            printf "%-10s %5s %9s %10s %14s %13s %7s %5s %5s\n", "target", "runs", "CPU-hours", \
                "wall-hours", "execs", "edges", "crashes", "open", "hangs"
            for (i = 0; i < n; i++) {
                t = order[i]
                printf "%-10s %5d %9.2f %10.2f %14d %13s %7d %5d %5d\n", t, runs[t], cpu[t] / 3600, \
                    wall[t] / 3600, execs[t], edges[t] "/" total[t], crash[t], open[t], hang[t]
            }
            # A finding that names no campaign line is a typo, not a fix.
            for (k in fixed) { print "fuzz: findings.tsv names no ledger line: " k > "/dev/stderr"; bad = 1 }
            exit bad
        }' "$findings" "$ledger"
    exit 0
fi

if [ "$mode" = cmin ]; then
    for t in "$@"; do
        queue="$out/$t/default/queue"
        [ -d "$queue" ] || { echo "fuzz: no queue in $queue (make fuzz first)" >&2; exit 1; }
        all=$(mktemp -d) min=$(mktemp -d)
        # Found inputs over FUZZ_CMIN_MAX_BYTES are left out (the generated seeds never): the
        # kept corpus stays small (a few hundred KB per target) at the price of the tuples
        # only they reach.
        for f in "$here/corpus/$t"/* "$queue"/id:*; do
            case $(basename "$f") in
            q-* | id:*) [ "$(wc -c < "$f")" -le "${FUZZ_CMIN_MAX_BYTES:-4096}" ] || continue
                cp "$f" "$all/q-$(sha1sum < "$f" | cut -c1-12)" ;;
            *) cp "$f" "$all/" ;;
            esac
        done
        # The shell afl-cmin of cargo-afl's AFL++ build: its Python afl-cmin (`cargo afl cmin`)
        # keeps no file of these targets ("0 unique tuples").
        cmin=$(ls "$HOME"/.local/share/afl.rs/rustc-"$(rustc --version | cut -d' ' -f2)"-*/afl.rs-*/afl/bin/afl-cmin.bash | tail -1)
        AFL_PATH=$(dirname "$cmin") PATH="$(dirname "$cmin"):$PATH" AFL_QUIET=1 \
            "$cmin" -t 2000 -i "$all" -o "$min" -- "$bin/$t" > "$out/$t.cmin.log" 2>&1 \
            || { tail -c 2000 "$out/$t.cmin.log" >&2; exit 1; }
        [ -n "$(ls -A "$min")" ] || { echo "fuzz: cmin of $t kept nothing" >&2; exit 1; }
        rm -rf "${here:?}/corpus/$t"
        mv "$min" "$here/corpus/$t"
        chmod 755 "$here/corpus/$t"
        rm -rf "$all"
        echo "fuzz: $t: $(ls "$here/corpus/$t" | wc -l) inputs, $(du -sb "$here/corpus/$t" | cut -f1) bytes"
    done
    exit 0
fi

# The vhost_user target's executions each make a socket under the temporary directory.
# Parallel fuzzers run in PID namespaces of their own (below), where PIDs repeat: three
# processes in namespaces of their own, each replaying a seed many times at once, must not
# meet (a name built from the PID did: one process's clean-up took another's socket, the
# crash recorded on 2026-12-07).
side_by_side() {
    local exe=$1 seeds=$2 out=$3 seed pids=() k rc=0
    seed=$(ls "$seeds"/* | head -1)
    local ns="unshare --pid --fork"
    if ! unshare --pid --fork true 2>/dev/null; then
        echo "fuzz: no PID namespaces here (unshare refused): the side-by-side check runs without them" >&2
        ns=
    fi
    for k in 1 2 3; do
        VRDMA_FUZZ_REPEAT=200 timeout 120 $ns "$exe" < "$seed" > /dev/null 2> "$out.side.$k.log" &
        pids+=($!)
    done
    for k in 1 2 3; do
        wait "${pids[$((k - 1))]}" || { echo "fuzz: vhost_user failed beside itself (process $k):" >&2
            grep -m3 -A2 panicked "$out.side.$k.log" >&2; rc=1; }
    done
    return $rc
}

mkdir -p "$out"
fail=0
reaper=
unshare --pid --fork true 2>/dev/null && reaper="unshare --pid --fork"
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
    if [ "$mode" = smoke ] && [ "$t" = vhost_user ]; then
        side_by_side "$exe" "$seeds" "$out" || exit 1
    fi
    # What was fuzzed: the binary is built from this tree (make fuzz builds first).
    commit=$(git -C "$here" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
    git -C "$here" diff --quiet HEAD -- "$here/../backend/src" "$here/src" 2>/dev/null \
        || commit="$commit+dirty"
    rm -rf "${out:?}/$t" "${out:?}/$t.panics"
    mkdir -p "$out" "$out/$t.panics"
    # -V: stop after SECONDS of fuzzing; -t: the hang limit, 2 s (an execution takes
    # milliseconds). FUZZ_TIMEOUT_MS raises it for a campaign that only gets the host's idle
    # time (SCHED_IDLE beside VM runs), where an execution can wait seconds for a CPU.
    # GNU time's figure is the CPU time of every process reaped below it: the CPU-hours the
    # ledger counts on a shared host. afl-fuzz does not reap its fork server (whose children
    # are the executions), so it runs as PID 1's child in a PID namespace of its own: the
    # namespace's init (bash) reaps every orphan, and their time counts.
    # A target's panic hook writes what it knows into $t.panics/ (vrdma_fuzz::record_panics).
    if ! VRDMA_FUZZ_PANICS="$out/$t.panics" /usr/bin/time -f '%U %S %e' -o "$out/$t.time" $reaper \
        bash -c 'cargo afl fuzz "$@"; rc=$?; wait; exit $rc' fuzz \
        -V "$secs" -t "${FUZZ_TIMEOUT_MS:-2000}" -i "$seeds" -o "$out/$t" -- "$exe" > "$out/$t.log" 2>&1; then
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
    if [ "$mode" = run ] && [ -n "${FUZZ_LEDGER:-}" ] && [ "${execs:-0}" -gt 0 ]; then
        [ -s "$FUZZ_LEDGER" ] || printf "$ledger_header\n" > "$FUZZ_LEDGER"
        read -r user sys wall < <(tail -1 "$out/$t.time")
        printf '%s\t%s\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" \
            "$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')" "$wall" "$execs" "$(stat "$out/$t" edges_found)" \
            "$(stat "$out/$t" total_edges)" "$crashes" "$hangs" "$commit" >> "$FUZZ_LEDGER"
    fi
    if [ "${execs:-0}" -eq 0 ]; then
        echo "fuzz: $t ran no executions" >&2
        fail=1
    fi
    if [ "${crashes:-0}" -ne 0 ]; then
        echo "fuzz: $t: $crashes crashing inputs in $out/$t/default/crashes/" >&2
        cat "$out/$t.panics"/*.txt 2>/dev/null | head -60 >&2 || true
        fail=1
    fi
    # An execution takes milliseconds: one over the 2 s limit is a loop, i.e. a finding.
    if [ "${hangs:-0}" -ne 0 ]; then
        echo "fuzz: $t: $hangs hanging inputs in $out/$t/default/hangs/" >&2
        fail=1
    fi
done
exit $fail
