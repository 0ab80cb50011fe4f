#!/usr/bin/env bash
# Without a tuning table, how well does `auto` choose with the cost model
# measured at start-up, against the built-in size table? For one setting,
# times every algorithm of each collective side by side with auto, once with
# CADENCE_CALIBRATE=1 and once with 0, and prints how often auto came within
# 10% of the best algorithm in each.
#
#   benchmarks/calibration_check.sh --cluster tb --ranks-per-host 2
#
# Sizes and iterations: CHECK_ARGS (default: -b 16 -e 64M -f 4 -n 8 -w 2);
# collectives: CHECK_OPS. Writes bench-results/calib-<setting>-<0|1>-<op>.{json,txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
CADENCE=.venv/bin/cadence
OPS=${CHECK_OPS:-allreduce allgather reduce_scatter broadcast alltoall}
ARGS=${CHECK_ARGS:--b 16 -e 64M -f 4 -n 8 -w 2}
mkdir -p bench-results
tag=$(echo "$*" | tr -c 'a-zA-Z0-9\n' '-' | sed 's/--*/-/g; s/^-//; s/-$//')
status=0
for cal in 1 0; do
  for op in $OPS; do
    # shellcheck disable=SC2086
    CADENCE_TUNING_FILE=none CADENCE_CALIBRATE=$cal "$CADENCE" bench "$@" --op "$op" $ARGS \
      --algo all --backends cadence --json "bench-results/calib-$tag-$cal-$op.json" \
      > "bench-results/calib-$tag-$cal-$op.txt" || status=1
  done
done
for cal in 1 0; do
  echo "CADENCE_CALIBRATE=$cal:"
  for op in $OPS; do
    printf '  %-15s' "$op"
    grep -h "^# auto within" "bench-results/calib-$tag-$cal-$op.txt" \
      | sed 's/^# auto within 10% of the best cadence algorithm at //' || echo
  done
done
exit $status
