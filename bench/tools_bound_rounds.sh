#!/bin/sh
# Session 25 (mend): interleaved rounds of bench/tools_bound_cost.py over BASE, THIS and AA (a copy of THIS).
# Usage: sh bench/tools_bound_rounds.sh BASE_TREE THIS_TREE AA_TREE ROUNDS PY > bench/results/<file>.txt
base=$1; this=$2; aa=$3; rounds=$4; py=$5
i=1
while [ "$i" -le "$rounds" ]; do
  for t in base this aa; do
    eval tree=\$$t
    printf 'round %s %s load=%s ' "$i" "$t" "$(cut -d' ' -f1 /proc/loadavg)"
    (cd "$tree" && PYTHONPATH="$tree" "$py" -P bench/tools_bound_cost.py 15)
  done
  i=$((i + 1))
done
