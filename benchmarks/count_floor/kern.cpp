#define hookstats HS_NS
#include <cstring>
#include <cstdlib>
#include "cpu/accumulate_avx512.h"
#include <algorithm>
using namespace HS_NS;
constexpr int kSub = 4;
alignas(4096) static FloatCount fh_store[(kFloatSlots + 1) * kSub + 4096];
static FloatCount* fh = fh_store + (getenv("FH_OFF") ? atoi(getenv("FH_OFF")) : 0) / 2;
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
static void flush(int64_t* dst) {  // as accumulate_cpu_kernel.h flush_float
  constexpr int kLine = 32;
  for (int base = 0; base < kFloatSlots * kSub; base += kLine) {
    uint64_t any = 0, w;
    for (int i = 0; i < kLine; i += 4) { memcpy(&w, fh + base + i, 8); any |= w; }
    if (any == 0) continue;
    for (int s = base / kSub; s < (base + kLine) / kSub; ++s) {
      uint32_t t = 0;
      for (int k = 0; k < kSub; ++k) t += fh[s * kSub + k];
      dst[s] += t;
    }
    std::fill(fh + base, fh + base + kLine, FloatCount(0));
  }
  std::fill(fh + kFloatSlots * kSub, fh + (kFloatSlots + 1) * kSub, FloatCount(0));
}
template <typename T>
static double run(const T* x, int64_t n, int64_t* dst) {
  Params p{0.f, 1.f, 1e-6f, 40, kFloatHist, kFloatHist};
  Partial res; int64_t nz = 0, nonfin[3] = {0,0,0};
  const int64_t piece = 255 * 1024;
  for (int64_t o = 0; o < n; o += piece) {
    int64_t m = std::min(piece, n - o);
    avx512::run_one_pass<T, true, kSub>(x + o, m, p, res, nz, fh, nonfin);
    flush(dst);
  }
  return res.mean + res.m2 + nz;
}
extern "C" double CAT(run_f32_, HS_NS)(const float* x, int64_t n, int64_t* dst) { return run(x, n, dst); }
extern "C" double CAT(run_bf16_, HS_NS)(const void* x, int64_t n, int64_t* dst) { return run(static_cast<const c10::BFloat16*>(x), n, dst); }
