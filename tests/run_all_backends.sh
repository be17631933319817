#!/usr/bin/env bash
# Runs the test suite once per Keras backend; fails if any run fails or
# collects no tests (pytest exit code 5). Extra arguments go to pytest.
#
# Tests marked backend_independent (the list is in tests/conftest.py: tf.data,
# tokenizer, readers, demo corpus, subprocess-only tf.distribute tests) run
# under the first backend only; the later backends run with
# KT_SKIP_BACKEND_INDEPENDENT=1, which deselects them. A later backend whose
# selection is left empty by that (pytest exit 5, only "N deselected") passes:
# its tests ran under the first backend. Slow tests not marked every_backend
# count as backend-independent (see tests/conftest.py).
#
# With pytest-xdist installed (the `test` extra), each run spreads its tests
# over KT_TEST_WORKERS processes (default: the CPU count, at most 4; 1 turns
# it off), grouping the modules that share an expensive fixture.
#
# Reporting: pytest lists the 15 slowest tests of each backend
# (--durations=15; a --durations given here overrides it), each run ends with
# its wall time, and a summary at the end gives every backend's time and
# result and the total.
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
workers="${KT_TEST_WORKERS:-$(python -c 'import os; print(min(os.cpu_count() or 1, 4))')}"
parallel=()
if [ "$workers" -gt 1 ] && python -c 'import xdist' 2>/dev/null; then
    parallel=(-n "$workers" --dist loadgroup)
fi
independent=$(python -c 'import sys; sys.path.insert(0, "tests"); import conftest; print(" ".join(sorted(conftest.BACKEND_INDEPENDENT_MODULES)))' 2>/dev/null) \
    || independent="(see tests/conftest.py)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
first=1
summary_lines=()
total_start=$SECONDS
for backend in ${KT_BACKENDS:-tensorflow jax torch}; do
    if [ "$first" -eq 1 ]; then
        skip=0
        echo "=== KERAS_BACKEND=$backend (all tests, backend-independent ones included)"
    else
        skip=1
        echo "=== KERAS_BACKEND=$backend (deselecting backend-independent tests in: $independent)"
    fi
    first=0
    start=$SECONDS
    KT_SKIP_BACKEND_INDEPENDENT=$skip KERAS_BACKEND=$backend \
        python -m pytest -q -p no:cacheprovider --durations=15 "${parallel[@]}" "$@" | tee "$log"
    code=${PIPESTATUS[0]}
    seconds=$((SECONDS - start))
    echo "=== KERAS_BACKEND=$backend: pytest exit $code in $seconds s"
    last=$(tail -n 1 "$log")
    if [ "$code" -eq 0 ]; then
        result="passed"
    elif [ "$code" -eq 5 ] && [ "$skip" -eq 1 ] \
        && grep -Eq '[0-9]+ deselected' <<<"$last" \
        && ! grep -Eq 'passed|failed|error|skipped|xfail|xpass' <<<"$last"; then
        echo "=== KERAS_BACKEND=$backend: nothing left after deselecting; the backend-independent tests ran under the first backend"
        result="passed (nothing left after deselecting)"
    elif [ "$code" -eq 5 ]; then
        status=1
        result="FAILED (pytest exit 5: no tests collected)"
    else
        status=1
        result="FAILED (pytest exit $code)"
    fi
    summary_lines+=("$(printf '%-10s %6d s  %s' "$backend" "$seconds" "$result")")
done
if [ "${#summary_lines[@]}" -eq 0 ]; then
    echo "=== no backend to run (KT_BACKENDS='${KT_BACKENDS:-}')"
    exit 1
fi
echo "=== summary (wall time per backend, result)"
for line in "${summary_lines[@]}"; do
    echo "=== $line"
done
if [ "$status" -eq 0 ]; then overall="passed"; else overall="FAILED"; fi
echo "=== $(printf '%-10s %6d s  %s' total "$((SECONDS - total_start))" "$overall")"
exit $status
