#!/usr/bin/env bash
# Issue 11's measurements on a host with one core per rank (16 cores), in one
# bounded run: the lent GPU machines are the only such hosts the team gets,
# for 15 minutes a task, so this script is prepared here and run there as is.
#
#   bash benchmarks/many_ranks.sh [OUTDIR] [BUDGET_SECONDS]
#
# OUTDIR (default $OUT, else ./many-ranks-results) receives many_ranks.txt
# (every table, in the order run) and json.tgz (each step's --json records).
# BUDGET_SECONDS (default 480) bounds the whole run: each step gets at most
# what is left, and steps that no longer fit are listed as skipped. Steps in
# order of what the issue needs most:
#
#   1. stalls: 16 ranks allreduce, 3 rounds (p99, the medians' spread from
#      round to round, cadence's wait counters), then the same with the spin
#      budget fixed at 50 us (CADENCE_SPIN_US=50: the policy before it
#      adapted) as the control;
#   2.-3. every collective at 16, then 8 ranks against Open MPI;
#   4. the algorithm choice at 12 and 16 ranks (--algo all, cadence only);
#   5. 2-rank reduce from 256 KiB, direct against the two stages (the size
#      table's pick) and Open MPI: on 2 cores the winner followed the
#      machine's memory state (docs/benchmarks.md), so a host decides.
#   6. step 5 with reduce's messages by single copy (CADENCE_SHM_STREAM=none;
#      they stream by default), and a 2-rank broadcast streamed and not, to
#      decide the default of CADENCE_SHM_STREAM.
#
# A first run that ran out of budget lists the steps it skipped; STEPS
# (shell patterns of step names, e.g. STEPS="algos* reduce2-* bcast2-*")
# runs only the matching steps, so a second run can take those.
#
# RANKS (default "16 8") and ALGO_RANKS (default "16 12") set the rank
# counts of steps 1-3 (the first is the stall check's) and of step 4, for a
# dry run on a small machine: RANKS="4 2" ALGO_RANKS=3 bash ... OUT 120.
#
# cadence comes from the environment, or from a wheel in .carry/whl (built
# here with `maturin build --release -o .carry/whl`), installed into
# /tmp/site. Needs mpirun and mpi4py for the Open MPI columns (the bench
# marks them n/a otherwise).
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-${OUT:-many-ranks-results}}
budget=${2:-480}
mkdir -p "$out/json"
log="$out/many_ranks.txt"
: >"$log"

if ! python3 -c 'import cadence' 2>/dev/null; then
  if compgen -G '.carry/whl/*.whl' >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
  else
    echo "many_ranks: cadence is not importable and .carry/whl holds no wheel" >&2
    exit 1
  fi
fi

say() { echo "$*" | tee -a "$log"; }
say "# many_ranks.sh on $(hostname), $(nproc) cores, $(date -u +%FT%TZ), budget ${budget} s${STEPS:+, steps $STEPS}"
say "# $(python3 -c 'import cadence, sys; print("cadence", cadence.__file__, "python", sys.version.split()[0])')"
command -v mpirun >/dev/null && say "# $(mpirun --version 2>&1 | head -1)"

start=$SECONDS
skipped=()
# step NAME CAP_SECONDS [ENV=VALUE ...] -- BENCH_ARGS...: one `cadence bench`,
# cut off at CAP_SECONDS or at what is left of the budget.
step() {
  local name=$1 cap=$2
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  if [ -n "${STEPS:-}" ]; then
    local - pat wanted=
    set -f # the patterns are for step names, not files
    for pat in $STEPS; do
      # shellcheck disable=SC2254
      case $name in $pat) wanted=1 ;; esac
    done
    [ -n "$wanted" ] || return 0
  fi
  local left=$((budget - (SECONDS - start)))
  if [ "$left" -lt 30 ]; then
    skipped+=("$name")
    return
  fi
  local limit=$((cap < left ? cap : left))
  say ""
  say "## $name (at most ${limit} s): ${envs[*]} cadence bench $*"
  local t0=$SECONDS
  env "${envs[@]}" timeout --kill-after=10 "$limit" python3 -m cadence.cli.main bench \
    --mpirun-args "--allow-run-as-root --oversubscribe" "$@" --json "$out/json/$name.json" \
    2>&1 | grep -v '^bench: ' | tee -a "$log"
  say "## $name took $((SECONDS - t0)) s (exit ${PIPESTATUS[0]})"
}

read -r -a ranks <<<"${RANKS:-16 8}"
read -r -a algo_ranks <<<"${ALGO_RANKS:-16 12}"
big=${ranks[0]}
sweep=(-b 8 -e 64M -f 8 -n 20 -w 5)
step "stall$big" 150 -- --nranks "$big" --op allreduce -b 8 -e 16M -f 8 -n 20 -w 5 \
  --backends cadence,mpi --rounds 3
step "stall$big-fixed-spin" 60 CADENCE_SPIN_US=50 -- --nranks "$big" --op allreduce \
  -b 8 -e 16M -f 8 -n 20 -w 5 --backends cadence
for n in "${ranks[@]}"; do
  for op in allreduce allgather reduce_scatter broadcast alltoall reduce; do
    step "r$n-$op" 60 -- --nranks "$n" --op "$op" "${sweep[@]}" --backends cadence,mpi
  done
done
for n in "${algo_ranks[@]}"; do
  for op in allreduce allgather reduce_scatter broadcast; do
    step "algos$n-$op" 60 -- --nranks "$n" --op "$op" -b 8 -e 16M -f 8 -n 10 -w 3 \
      --backends cadence --algo all
  done
done
step "reduce2-algos" 60 -- --nranks 2 --op reduce -b 256K -e 64M -f 4 -n 20 -w 5 \
  --backends cadence,mpi --algo direct,reduce_scatter_gather --rounds 2
# 6. the same with single copy for reduce's messages, and a 2-rank broadcast
#    streamed and not (on 2 cores streaming won or lost 1.1-3x with the
#    machine's state; docs/benchmarks.md).
step "reduce2-single-copy" 60 CADENCE_SHM_STREAM=none -- --nranks 2 --op reduce -b 256K \
  -e 64M -f 4 -n 20 -w 5 --backends cadence,mpi --algo direct,reduce_scatter_gather --rounds 2
for s in none broadcast; do
  step "bcast2-stream-$s" 40 CADENCE_SHM_STREAM=$s -- --nranks 2 --op broadcast -b 256K \
    -e 64M -f 4 -n 20 -w 5 --backends cadence,mpi --rounds 2
done

say ""
say "# done in $((SECONDS - start)) s; skipped (out of budget): ${skipped[*]:-none}"
tar czf "$out/json.tgz" -C "$out" json && rm -rf "$out/json"
