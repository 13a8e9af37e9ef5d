#!/usr/bin/env bash
# Runs perf_analyzer ($REAL_PERF_ANALYZER) and appends its own CPU time to $OUT_DIR/client_cpu.tsv
# (label, model, concurrency, user s, system s, wall s), so that reports can show how much of the
# machine the client took. bench/lib.sh points v2_load.sh's PERF_ANALYZER here.
set -uo pipefail
model="" conc=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    -m) model="${args[i + 1]:-}" ;;
    --concurrency-range) conc="${args[i + 1]%%:*}" ;;
  esac
done
times="$(mktemp)"
/usr/bin/time -f "%U %S %e" -o "$times" "$REAL_PERF_ANALYZER" "$@"
rc=$?
if [ -n "${OUT_DIR:-}" ] && [ -s "$times" ]; then
  out="$OUT_DIR/client_cpu.tsv"
  [ -f "$out" ] || printf "label\tmodel\tconc\tuser_s\tsys_s\twall_s\n" > "$out"
  read -r user sys wall < <(tail -1 "$times")
  printf "%s\t%s\t%s\t%s\t%s\t%s\n" "${LABEL:-}" "$model" "$conc" "$user" "$sys" "$wall" >> "$out"
fi
rm -f "$times"
exit "$rc"
