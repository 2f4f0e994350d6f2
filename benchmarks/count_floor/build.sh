#!/bin/bash
# Probes of the CPU op's float-bucket counting, outside the extension: builds ./ab, which times
# avx512::run_one_pass (FLOAT_HIST alone, pieces of 255*1024 values, flushed like flush_float) of two csrc trees
# side by side, an AVX-512 sum (memory reference) and the increments alone from precomputed slots.
#   benchmarks/count_floor/build.sh BASE_CSRC NEW_CSRC && ./ab 64 9     # MB, rounds [randn|relu|narrow] [bf16]
#   g++ -O3 -march=sapphirerapids st.cpp -o st && ./st 100                       # random vs same-line stores
#   g++ -O3 -march=sapphirerapids vb3.cpp -o vb3 && ./vb3                         # pair-table prototype
#   g++ -O3 -march=sapphirerapids floor.cpp -o floor && ./floor randn 65536 4     # increments alone: data, slots streamed, copies (PAIRLAYOUT=1: copy per pair)
set -e
cd "$(dirname "$0")"
PY=${PY:-/work/main/.venv/bin/python}
TI=$($PY -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
F="-O3 -g0 -ffp-contract=off -std=c++17 -I$TI -w"
g++ $F -I"$1" -DHS_NS=hs_base -c kern.cpp -o kb.o
g++ $F -I"$2" -DHS_NS=hs_new -c kern.cpp -o kn.o
g++ $F -c main.cpp -o main.o
g++ main.o kb.o kn.o -o ab
rm -f kb.o kn.o main.o
