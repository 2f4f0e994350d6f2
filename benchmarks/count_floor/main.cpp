#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>
extern "C" double run_f32_hs_base(const float*, int64_t, int64_t*);
extern "C" double run_bf16_hs_base(const void*, int64_t, int64_t*);
extern "C" double run_f32_hs_new(const float*, int64_t, int64_t*);
extern "C" double run_bf16_hs_new(const void*, int64_t, int64_t*);
static double tnow() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
#include <immintrin.h>
// a memory-bound reference like x.sum(): 4 AVX-512 accumulators
__attribute__((noinline, target("avx512f"))) float sumf(const float* x, int64_t n) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(x + i)); b = _mm512_add_ps(b, _mm512_loadu_ps(x + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(x + i + 32)); d = _mm512_add_ps(d, _mm512_loadu_ps(x + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}
// the float buckets' increments alone, from slots precomputed as the kernel stores them (copy i % 4 folded in),
// flushed (zeroed) every 255 * 1024 values as the op does
alignas(64) static uint16_t cfh[4097 * 4];
__attribute__((noinline)) int64_t count_only(const uint16_t* idx, int64_t n) {
  for (int64_t o = 0; o < n; o += 255 * 1024) {
    const int64_t e = std::min(n, o + 255 * 1024);
#pragma GCC unroll 16
    for (int64_t i = o; i < e; ++i) ++cfh[idx[i]];
    memset(cfh, 0, sizeof cfh);
  }
  return cfh[0];
}
int main(int argc, char** argv) {
  int64_t mb = atoi(argv[1]); int reps = atoi(argv[2]); std::string kind = argc > 3 ? argv[3] : "randn";
  bool bf = argc > 4 && std::string(argv[4]) == "bf16";
  int64_t n = mb * (1 << 20) / (bf ? 2 : 4);
  std::vector<float> x(n); std::mt19937 g(1); std::normal_distribution<float> d;
  for (auto& v : x) { v = d(g); if (kind == "relu" && v < 0) v = 0; if (kind == "narrow") v = 1.0f + 0.001f * v; }
  std::vector<c10::BFloat16> xb(bf ? n : 0);
  for (int64_t i = 0; i < (bf ? n : 0); ++i) xb[i] = c10::BFloat16(x[i]);
  std::vector<int64_t> db(4096), dn(4096);
  std::vector<uint16_t> idx(n);
  for (int64_t i = 0; i < n; ++i) { uint32_t b; memcpy(&b, &x[i], 4); idx[i] = ((b & 0x7fffffff) == 0 ? 2047 : b >> 20) * 4 + i % 4; }
  std::vector<double> tc;
  std::vector<double> tb, tn, ts, ratio;
  double cb = 0, cn = 0;
  int mult = std::max<int64_t>(1, (64 << 20) / (n * (bf ? 2 : 4)));
  for (int r = 0; r < reps; ++r) {
    for (int w = 0; w < 4; ++w) {
      int v = (r + w) % 4;
      double t0 = tnow();
      for (int k = 0; k < mult; ++k) {
        if (v == 0) cb += bf ? run_bf16_hs_base(xb.data(), n, db.data()) : run_f32_hs_base(x.data(), n, db.data());
        else if (v == 1) cn += bf ? run_bf16_hs_new(xb.data(), n, dn.data()) : run_f32_hs_new(x.data(), n, dn.data());
        else if (v == 2) cb += sumf(x.data(), bf ? n / 2 : n);
        else cb += count_only(idx.data(), n);
      }
      double t = (tnow() - t0) / (n * mult) * 1e9;
      (v == 0 ? tb : v == 1 ? tn : v == 2 ? ts : tc).push_back(t);
    }
    ratio.push_back(tb.back() / tn.back());
  }
  auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  auto mn = [](std::vector<double> v) { return *std::min_element(v.begin(), v.end()); };
  auto mx = [](std::vector<double> v) { return *std::max_element(v.begin(), v.end()); };
  bool same = db == dn && cb == cb;
  printf("count-only %.4f ns/value (sum/count-only %.3f); ", med(tc), med(ts) / med(tc));
  printf("%ld MB %s %s: ns/value base %.4f new %.4f sum %.4f | base/new %.3f [%.3f..%.3f] | sum/new %.3f | hist %s moments %s\n",
         mb, kind.c_str(), bf ? "bf16" : "f32", med(tb), med(tn), med(ts), med(ratio), mn(ratio), mx(ratio),
         med(ts) / med(tn), same ? "same" : "DIFFER", std::to_string(cn).c_str());
}
