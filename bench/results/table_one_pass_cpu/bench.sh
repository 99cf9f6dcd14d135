#!/bin/bash
# The commands of README.md (ABBA), as run; the tables went to /tmp/op/bench.
# ABBA: separate, one pass, one pass, separate
#   bash bench.sh [CHECKOUT] [OUT]     # CHECKOUT: the code to run (default: this repository), OUT: default /tmp/op/bench
CODE=$(cd "${1:-$(dirname "$0")/../../..}" && pwd)
cd "$CODE"
export PYTHONPATH="$CODE"
R=${2:-/tmp/op/bench}
rm -rf $R; mkdir -p $R
for run in sep1:--no-one-pass one1:--one-pass one2:--one-pass sep2:--no-one-pass; do
  name=${run%%:*}; flag=${run#*:}
  echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/log
  s=$(date +%s.%N)
  diffsmooth table --demo --rows dds,diffsmooth --images 8 --n-max 300 --threads 1 $flag --quiet --out $R/$name > $R/$name.out 2>&1
  e=$(date +%s.%N)
  echo "$name wall=$(echo "$e - $s" | bc) load_after $(cut -d' ' -f1-3 /proc/loadavg)" >> $R/log
done
