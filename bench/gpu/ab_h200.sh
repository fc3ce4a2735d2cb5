#!/usr/bin/env bash
# Before/after on the H200 in ONE device call (after install-c.sh): this tree's server, the server of an
# older tree (OLD_TREE, an untracked copy such as `git archive REV | tar -x -C _old`), then mlx_lm.server,
# each on the same scenarios and chat shape. Results: $OUT/new.json, $OUT/old.json, $OUT/peer.json.
#   OLD_TREE=_old SCENARIOS=poisson8,c64,c1 NEW_S=150 OLD_S=150 PEER_S=150 OUT=$OUT bash bench/gpu/ab_h200.sh
# OLD_FIRST=1 runs the old tree's server before this tree's (see run_new); SKIP_NEW=1 runs no server of this tree. ENGINE=1 adds this tree's engine without
# HTTP at 64 streams (bench/engine_compare.py), for c64's share of it within the same call.
# READY_S (default 180): how long a server may take to be ready; a fresh host's first server compiles its warm-up
# kernels (twenty-second session: not ready within 90 s when the carried kernel cache predated a change).
# VARIANTS="name|server flags|scenarios|VAR=value ...;..." adds runs of this tree with other flags or environment
# ($OUT/name.json). Each server's log is kept as $OUT/<name>.log (new, old, variants). MODEL (default $HOME/shape/rope, built here when missing): another model directory.
set -uo pipefail
OUT=${OUT:-/tmp/ab-out}
mkdir -p "$OUT"
SECONDS=0
step() { echo "[$(date +%T) +${SECONDS}s] $*"; }
ARGS="--max-active 128 --no-whisper ${EXTRA_ARGS:-}"
SCEN=${SCENARIOS:-poisson8,c64,c1}
MODEL=${MODEL:-$HOME/shape/rope}
COMMON=(--model "$MODEL" --profile quick --timeout 60 --ready-timeout ${READY_S:-180} --log-dir "$OUT" --scenarios "$SCEN")
# A fresh host compiles MLX's kernels while its first server serves; kernels saved from an earlier host (PTX_SAVE=1,
# carried as .gpu/ptx) are restored first (nineteenth session: the first server then served c8 with no failure).
[ -f .gpu/ptx/mlx-ptx.tgz ] && bash bench/gpu/ptx_cache.sh restore .gpu/ptx
step "build"
[ -d "$MODEL" ] || [ "$MODEL" != "$HOME/shape/rope" ] || timeout 90 python3 -m bench.gpu.build_shape --tokenizer .gpu/tok --out "$HOME/shape" | tail -1
run_new() {
  step "new"
  timeout $((${NEW_S:-150} + 20)) python3 -m bench.serve --only ours "${COMMON[@]}" --ours-args "$ARGS" \
    --server-budget "${NEW_S:-150}" --out "$OUT/new.json" 2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
  cp "$OUT/tandem.log" "$OUT/new.log" 2>/dev/null
}
# OLD_FIRST=1: the old tree's server runs first. A fresh host's first server compiles MLX's kernels (cached on
# disk for the next ones): the first server measured pays stalls the later ones do not.
[ -n "${OLD_FIRST:-}" ] || [ -n "${SKIP_NEW:-}" ] || run_new
IFS=';' read -ra VARS <<< "${VARIANTS:-}"
for v in "${VARS[@]}"; do
  IFS='|' read -r name flags scen vars <<< "$v"
  step "variant $name: $flags $vars"
  env $vars timeout $((${VAR_S:-100} + 20)) python3 -m bench.serve --only ours "${COMMON[@]}" --scenarios "${scen:-$SCEN}" \
    --ours-args "$ARGS $flags" --server-budget "${VAR_S:-100}" --out "$OUT/$name.json" 2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
  cp "$OUT/tandem.log" "$OUT/$name.log" 2>/dev/null
done
if [ -n "${OLD_TREE:-}" ] && [ -d "$OLD_TREE" ]; then
  step "old ($OLD_TREE)"
  OLD=$(cd "$OLD_TREE" && pwd)
  timeout $((${OLD_S:-150} + 20)) python3 -m bench.serve --only ours "${COMMON[@]}" --ours-args "$ARGS" \
    --ours-cmd "sh -c 'cd $OLD && PYTHONPATH=\$HOME/mlx-site:$OLD exec {python} -m service.cli serve {model} --host 127.0.0.1 --port {port} {args}'" \
    --server-budget "${OLD_S:-150}" --out "$OUT/old.json" 2>&1 | grep -E "tandem (c|p|:)" | grep -v starting
  cp "$OUT/tandem.log" "$OUT/old.log" 2>/dev/null
fi
[ -z "${OLD_FIRST:-}" ] || run_new
if [ -z "${SKIP_PEER:-}" ]; then
  step "peer"
  timeout $((${PEER_S:-150} + 20)) python3 -m bench.serve --only peer "${COMMON[@]}" --server-budget "${PEER_S:-150}" \
    --out "$OUT/peer.json" 2>&1 | grep -E "peer (c|p|:)" | grep -v starting
fi
if [ -n "${ENGINE:-}" ]; then  # the engine without HTTP on the same host: what c64 over HTTP is a share of
  step "engine"
  timeout 120 python3 -m bench.engine_compare --tokenizer .gpu/tok --shape llama-1b --streams 64 --tokens 128 \
    --prompt-len 128 --max-iteration-tokens 512 2>&1 | tail -1 | tee "$OUT/engine.json"
fi
# PTX_SAVE=1: MLX's compiled kernels into $OUT for the next fresh host (bench/gpu/ptx_cache.sh; one more file back).
[ -z "${PTX_SAVE:-}" ] || bash bench/gpu/ptx_cache.sh save "$OUT"
step "done"
