#!/usr/bin/env bash
# Runs the whole test suite once per Keras backend; fails if any run fails or
# collects no tests (pytest exit code 5). Extra arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
status=0
for backend in ${KT_BACKENDS:-tensorflow jax torch}; do
    echo "=== KERAS_BACKEND=$backend"
    start=$SECONDS
    KERAS_BACKEND=$backend python -m pytest -q -p no:cacheprovider --durations=5 "$@"
    code=$?
    echo "=== KERAS_BACKEND=$backend: pytest exit $code in $((SECONDS - start)) s"
    if [ "$code" -ne 0 ]; then
        status=1  # includes exit 5: no tests collected
    fi
done
exit $status
