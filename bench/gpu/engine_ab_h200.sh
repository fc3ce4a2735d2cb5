#!/usr/bin/env bash
# The engine without HTTP (bench/engine_compare.py --ours-only, random-init Llama-3.2-1B shape), this tree against
# an older one (OLD_TREE, e.g. `git archive REV | tar -x -C _old`) and environment variants of this tree, in turn,
# ROUNDS times, in ONE device call (after install-c.sh). Each run's rows go to $OUT/engine_ab.jsonl.
#   OLD_TREE=_old STREAMS=1,8,64 ROUNDS=2 VARIANTS="built|TANDEM_DECODE_COMPILE=off" OUT=$OUT bash bench/gpu/engine_ab_h200.sh
set -uo pipefail
OUT=${OUT:-/tmp/engine-ab}
mkdir -p "$OUT"
SECONDS=0
TOK=$(pwd)/.gpu/tok
run() {  # NAME DIR [VAR=value ...]
  local name=$1 dir
  dir=$(cd "$2" && pwd)
  shift 2
  echo "[$(date +%T) +${SECONDS}s] $name"
  (cd "$dir" && env PYTHONPATH="$HOME/mlx-site:$dir" "$@" timeout "${RUN_S:-120}" python3 -m bench.engine_compare \
    --tokenizer "$TOK" --shape llama-1b --streams "${STREAMS:-1,8,64}" --tokens "${TOKENS:-256}" --prompt-len 128 \
    --max-iteration-tokens 512 --passes "${PASSES:-3}" --ours-only) 2>&1 | grep '"streams"' \
    | sed "s/^/{\"run\": \"$name\", \"row\": /; s/\$/}/" | tee -a "$OUT/engine_ab.jsonl"
}
IFS=';' read -ra VARS <<< "${VARIANTS:-}"
for r in $(seq "${ROUNDS:-2}"); do
  run "new" .
  [ -n "${OLD_TREE:-}" ] && [ -d "$OLD_TREE" ] && run "old" "$OLD_TREE"
  for v in "${VARS[@]}"; do
    IFS='|' read -r name vars <<< "$v"
    # shellcheck disable=SC2086
    run "$name" . $vars
  done
done
echo "[$(date +%T) +${SECONDS}s] done"
