#!/usr/bin/env bash
# MLX's CUDA kernels compiled on one lent H200, for the next fresh host. MLX compiles its kernels at first use and
# keeps them in its PTX cache (MLX_PTX_CACHE_DIR, else ${TMPDIR:-/tmp}/mlx/<version>/ptx); a fresh host's first
# server compiled them while serving (eighteenth session, call 8: not ready within 60 s, then 30 requests failed).
#   save, at the end of a device call:     bash bench/gpu/ptx_cache.sh save "$OUT"   # → $OUT/mlx-ptx.tgz (≤ 15 MiB)
#   then here: mkdir -p .gpu/ptx && cp <files_at>/mlx-ptx.tgz .gpu/ptx/   (.gpu/ is git-ignored)
#   restore, in the first call on a new host (carry [".gpu/a", ".gpu/ptx"]): bash bench/gpu/ptx_cache.sh restore .gpu/ptx
# ab_h200.sh restores it by itself when .gpu/ptx/mlx-ptx.tgz is carried (carry [".gpu/c", ".gpu/tok", ".gpu/ptx"]). Tried
# in the nineteenth session: restored on two fresh hosts, their first server served at once (45 files, 1.4 MB).
set -uo pipefail
ROOT=${TMPDIR:-/tmp}
case "${1:-}" in
  save)
    [ -d "$ROOT/mlx" ] || { echo "no PTX cache under $ROOT/mlx"; exit 0; }
    tar -C "$ROOT" -czf "$2/mlx-ptx.tgz" mlx
    size=$(stat -c %s "$2/mlx-ptx.tgz")
    if [ "$size" -gt $((15 * 1024 * 1024)) ]; then  # a file over 16 MiB does not come back from $OUT
      rm -f "$2/mlx-ptx.tgz"
      echo "PTX cache too large to bring back ($size bytes)"
    else
      echo "PTX cache saved: $size bytes"
    fi ;;
  restore)
    if [ -f "$2/mlx-ptx.tgz" ]; then
      mkdir -p "$ROOT" && tar -C "$ROOT" -xzf "$2/mlx-ptx.tgz" && echo "PTX cache restored: $(find "$ROOT/mlx" -type f | wc -l) files"
    else
      echo "no saved PTX cache in $2"
    fi ;;
  *) echo "usage: $0 save OUT_DIR | restore DIR" >&2; exit 2 ;;
esac
