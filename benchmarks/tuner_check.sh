#!/usr/bin/env bash
# Does `auto` pick well? For one setting: tune it, then time every algorithm
# of each collective side by side with `auto` (the tuner's choice), in a
# separate run from the one the table was made from, and print how often auto
# came within 10% of the best algorithm.
#
#   benchmarks/tuner_check.sh --nranks 2
#   benchmarks/tuner_check.sh --cluster tb --ranks-per-host 2
#
# Writes bench-results/tuner-<setting>.{json,txt} per collective and the table
# to bench-results/tuning.json (the setting is merged into it); the sweep reads
# that table through CADENCE_TUNING_FILE. Sizes and iterations: TUNER_ARGS
# (default: -b 8 -e 64M -f 4 -n 10 -w 3); collectives: TUNER_OPS.
set -euo pipefail
cd "$(dirname "$0")/.."
CADENCE=.venv/bin/cadence
OPS=${TUNER_OPS:-allreduce allgather reduce_scatter broadcast alltoall}
ARGS=${TUNER_ARGS:--b 8 -e 64M -f 4 -n 10 -w 3}
TABLE=bench-results/tuning.json
mkdir -p bench-results
tag=$(echo "$*" | tr -c 'a-zA-Z0-9\n' '-' | sed 's/--*/-/g; s/^-//; s/-$//')
# shellcheck disable=SC2086
"$CADENCE" tune "$@" --ops "$(echo $OPS | tr ' ' ,)" $ARGS --output "$TABLE"
status=0
for op in $OPS; do
  # shellcheck disable=SC2086
  CADENCE_TUNING_FILE=$TABLE "$CADENCE" bench "$@" --op "$op" $ARGS --algo all \
    --backends cadence --json "bench-results/tuner-$tag-$op.json" \
    | tee "bench-results/tuner-$tag-$op.txt" || status=1
done
grep -h "^# auto within" bench-results/tuner-"$tag"-*.txt || true
exit $status
