# stages.sh - sourced by tests/run: run named stages, then one summary line.
#   stage NAME COMMAND...   runs COMMAND (its output shown as it comes); exit 0: ok, exit 77
#                           (SKIP_STATUS): skipped, the reason being its last "skipped: WHY"
#                           line; anything else: failed
#   skip NAME WHY           records a stage that did not run at all
#   summary                 the last line, naming failed and skipped stages; exit status 1
#                           when a stage failed, else 0
# shellcheck shell=bash
SKIP_STATUS=77
failed=()
skipped=()
stage() {
    local name=$1; shift
    echo "=== tests/run: $name"
    local t0=$SECONDS log rc why
    log=$(mktemp)
    "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    why=$(sed -n 's/.*skipped: //p' "$log" | tail -1)
    rm -f "$log"
    if (( rc == SKIP_STATUS )); then
        echo "=== tests/run: $name: SKIPPED (${why:-no reason given})"
        skipped+=("$name — ${why:-no reason given}")
        return
    fi
    echo "=== tests/run: $name: $([[ $rc -eq 0 ]] && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s"
    [[ $rc -eq 0 ]] || failed+=("$name")
}
skip() {
    echo "=== tests/run: $1: SKIPPED ($2)"
    skipped+=("$1 — $2")
}
summary() {
    local note="" s
    for s in ${skipped[@]+"${skipped[@]}"}; do
        note+="${note:+; }$s"
    done
    [[ -z $note ]] || note=" (skipped: $note)"
    if ((${#failed[@]})); then
        echo "=== tests/run: FAILED: ${failed[*]}$note"
        return 1
    fi
    echo "=== tests/run: all stages passed$note"
}
