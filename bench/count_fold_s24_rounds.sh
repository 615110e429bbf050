#!/bin/sh
# base / this / A-A copy of this, alternating, ROUNDS rounds (each tree its own process)
ROUNDS=${1:-6}
for r in $(seq "$ROUNDS"); do
  for tree in /tmp/s24-base /work/wt-fields /tmp/s24-aa-fields; do
    printf '%s %s ' "$r" "$tree"
    (cd /tmp && PYTHONPATH=$tree /work/main/.venv/bin/python /work/wt-fields/bench/count_fold_s24.py 30)
  done
done
