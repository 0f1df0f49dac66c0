#!/usr/bin/env bash
# Times every CPU GEMM library installed here at weft's model shapes, at 1 and 2 threads, and prints
# one table of GFLOP/s (issue #17: which library carries the f32 CPU matmuls; the program and its
# shapes are described in tools/cpu_gemm_libraries.cc). Libraries not installed are skipped:
# libopenblas0-pthread (Debian's default OpenBLAS), libblis4 (libblis-dev), libdnnl2 (libdnnl-dev).
# Run it on an idle machine.
#   usage: tools/cpu_gemm_libraries.sh [PROGRAM]   (default build/tools/cpu_gemm_libraries)
set -euo pipefail
program=${1:-build/tools/cpu_gemm_libraries}
if [[ ! -x "$program" ]]; then
  echo "cpu_gemm_libraries.sh: no program at '$program'; build it (tools/build) or pass its path" >&2
  exit 2
fi
libraries=(
  "OpenBLAS|/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"
  "BLIS|/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4"
  "BLIS|/usr/lib/x86_64-linux-gnu/blis-pthread/libblis.so.4"
  "oneDNN|/usr/lib/x86_64-linux-gnu/libdnnl.so.2"
)
work=$(mktemp -d /tmp/weft-gemm-libraries.XXXXXX)
trap 'rm -rf "$work"' EXIT
columns=()
for entry in "${libraries[@]}"; do
  IFS='|' read -r name file <<<"$entry"
  [[ -f "$file" ]] || continue
  for threads in 1 2; do
    column="$name ($threads)"
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads BLIS_NUM_THREADS=$threads \
      "$program" "$file" >"$work/${#columns[@]}.tsv"
    columns+=("$column")
  done
done
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) cores); f32 GFLOP/s"
printf '%-16s' "shape"
for column in "${columns[@]}"; do printf '%14s' "$column"; done
echo
rows=$(wc -l <"$work/0.tsv")
for ((row = 1; row <= rows; row++)); do
  printf '%-16s' "$(sed -n "${row}p" "$work/0.tsv" | cut -f1)"
  for ((c = 0; c < ${#columns[@]}; c++)); do printf '%14s' "$(sed -n "${row}p" "$work/$c.tsv" | cut -f2)"; done
  echo
done
