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
        python -m pytest -q -p no:cacheprovider --durations=5 "${parallel[@]}" "$@" | tee "$log"
    code=${PIPESTATUS[0]}
    echo "=== KERAS_BACKEND=$backend: pytest exit $code in $((SECONDS - start)) s"
    summary=$(tail -n 1 "$log")
    if [ "$code" -eq 5 ] && [ "$skip" -eq 1 ] \
        && grep -Eq '[0-9]+ deselected' <<<"$summary" \
        && ! grep -Eq 'passed|failed|error|skipped|xfail|xpass' <<<"$summary"; then
        echo "=== KERAS_BACKEND=$backend: nothing left after deselecting; the backend-independent tests ran under the first backend"
        continue
    fi
    if [ "$code" -ne 0 ]; then
        status=1  # includes exit 5: no tests collected
    fi
done
exit $status
