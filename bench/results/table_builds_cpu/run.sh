#!/bin/sh
# One measurement of the demo table with --compile on CPU: WHICH (before|after), CODE (the checkout to run).
# A cold inductor cache each time, so both runs compile from scratch.
set -e
WHICH=$1; CODE=$2; HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../.." && pwd)
rm -rf "/tmp/table_builds_$WHICH" "/tmp/inductor_$WHICH"
uptime > "$HERE/$WHICH.load_before.txt"
TORCHINDUCTOR_CACHE_DIR="/tmp/inductor_$WHICH" PYTHONPATH="$CODE" python "$REPO/studies/compile_measure.py" table --demo \
  --out "/tmp/table_builds_$WHICH" --rows rs,dds --images 4 --n-max 200 --pilot 2 --compile --threads 1 --quiet \
  > "$HERE/$WHICH.log" 2>&1
uptime > "$HERE/$WHICH.load_after.txt"
cp "/tmp/table_builds_$WHICH/summary.json" "$HERE/$WHICH.summary.json"
cp "/tmp/table_builds_$WHICH/cost.json" "$HERE/$WHICH.cost.json"
