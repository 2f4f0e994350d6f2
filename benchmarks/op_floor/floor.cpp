// The op's per-value work on the CPU, built up step by step from one read (benchmarks/op_floor.py builds and runs
// it). Each variant is timed over a workload's captured tensors, every tensor freshly written just before its call
// (as a hook sees it: just written by its layer), variants rotated each round, the thread's CPU clock.
// The "+" variants are one-pass AVX-512 loops shaped like the op's (csrc/cpu/accumulate_avx512.h: blocks of 1024
// values, shift K = the previous block's mean, fp32 sums over 8 values per lane then fp64), adding one statistic at
// a time; "the op" rows call the op's own kernel (run_one_pass) as accumulate_cpu_kernel.h does, chunks and flushes.
//   floor TENSORS_FILE ROUNDS [CAP]  ->  one JSON object on stdout
// CAP: only the first CAP values of each tensor, called over and over (~2M values a tensor): the loops' speed on
// cache-resident data, where memory is no limit (the float buckets' flush then dominates their row).
#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "cpu/accumulate_avx512.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,popcnt")

using namespace hookstats;
namespace {

double now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// one read: x.sum()'s work, four accumulators
double sum_only(const float* x, int64_t n) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(x + i));
    b = _mm512_add_ps(b, _mm512_loadu_ps(x + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(x + i + 32));
    d = _mm512_add_ps(d, _mm512_loadu_ps(x + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
  for (; i < n; ++i) s += x[i];
  return s;
}

inline __m512d add_halves(__m512d s, __m512 c) {
  return _mm512_add_pd(s, _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(c)),
                                        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(c), 1)))));
}

// sum (v - K) and sum (v - K)^2 per block (the moments), then + min/max, + near-zero count, + the 4 KB prefetch
template <bool kMinMax, bool kNearZero, bool kPrefetch>
double one_pass(const float* x, int64_t n) {
  constexpr int kB = 1024;
  const __m512 eps = _mm512_set1_ps(1e-6f);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), all = _mm512_set1_epi32(-1);
  __m512 mn = _mm512_set1_ps(__builtin_inff()), mx = _mm512_set1_ps(-__builtin_inff());
  __m512i nz = _mm512_setzero_si512();
  double n_acc = 0, mean = 0, m2 = 0;
  float K = 0;
  for (int64_t b = 0; b + kB <= n; b += kB) {
    const __m512 kv = _mm512_set1_ps(K);
    __m512d s1v = _mm512_setzero_pd(), s2v = s1v;
    for (int g = 0; g < kB / 16; g += 8) {
      __m512 c1a = _mm512_setzero_ps(), c1b = c1a, c2a = c1a, c2b = c1a;
      auto one = [&](int j, __m512& c1, __m512& c2) {
        if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(x + b + j * 16) + 4096, _MM_HINT_T0);
        const __m512 v = _mm512_loadu_ps(x + b + j * 16);
        const __m512 d = _mm512_sub_ps(v, kv);
        c1 = _mm512_add_ps(c1, d);
        c2 = _mm512_fmadd_ps(d, d, c2);
        if (kMinMax) {
          mn = _mm512_min_ps(v, mn);
          mx = _mm512_max_ps(v, mx);
        }
        if (kNearZero) {
          const __mmask16 z = _mm512_cmp_ps_mask(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask)),
                                                 eps, _CMP_LE_OQ);
          nz = _mm512_mask_sub_epi32(nz, z, nz, all);
        }
      };
      for (int j = g; j < g + 8; j += 2) {
        one(j, c1a, c2a);
        one(j + 1, c1b, c2b);
      }
      s1v = add_halves(s1v, _mm512_add_ps(c1a, c1b));
      s2v = add_halves(s2v, _mm512_add_ps(c2a, c2b));
    }
    const double s1 = _mm512_reduce_add_pd(s1v), s2 = _mm512_reduce_add_pd(s2v);
    Partial bp;
    shifted_to_partial(bp, kB, K, s1, s2);
    chan_merge(n_acc, mean, m2, bp.n, bp.mean, bp.m2);
    K = static_cast<float>(bp.mean);
  }
  return mean + m2 + _mm512_reduce_min_ps(mn) + _mm512_reduce_max_ps(mx) + _mm512_reduce_add_epi32(nz);
}

// the op's kernel as accumulate_cpu_kernel.h runs it on one thread: chunks of max(2^15, n / 1024) values, the float
// buckets flushed every 255 * 1024 values (a plain flush here, without the atomics)
alignas(64) FloatCount fh[(kFloatSlots + 1) * 4];
int64_t hist[kFloatSlots];
void flush() {
  for (int s = 0; s < kFloatSlots; ++s) {
    uint32_t t = 0;
    for (int k = 0; k < 4; ++k) t += fh[s * 4 + k];
    hist[s] += t;
  }
  std::fill(fh, fh + (kFloatSlots + 1) * 4, FloatCount(0));
}
template <bool kFloat>
double the_op(const float* x, int64_t n) {
  const Params p{0.f, 1.f, 1e-6f, 0, kFloat ? kFloatHist : 0, kFloatHist};
  const int64_t chunk = std::max<int64_t>(int64_t(1) << 15, (n + 1023) / 1024 + 1023) / 1024 * 1024;
  Partial tot;
  int64_t nz = 0, nonfin[3] = {0, 0, 0}, counted = 0;
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    Partial res;
    for (int64_t done = 0, piece; done < len; done += piece) {
      piece = std::min<int64_t>(255 * 1024, len - done);
      if (kFloat && counted + piece > 255 * 1024) {
        flush();
        counted = 0;
      }
      avx512::run_one_pass<float, kFloat, 4>(x + off + done, piece, p, res, nz, fh, nonfin);
      counted += piece;
    }
    merge_partial(tot, res);
  }
  if (kFloat) flush();
  return tot.mean + tot.m2 + nz;
}

struct Variant {
  const char* name;
  double (*fn)(const float*, int64_t);
};
const Variant kVariants[] = {
    {"one read (sum)", sum_only},
    {"+ sum of squares about K (the moments)", one_pass<false, false, false>},
    {"+ min/max", one_pass<true, false, false>},
    {"+ near-zero count", one_pass<true, true, false>},
    {"+ 4 KB prefetch (the op's loop)", one_pass<true, true, true>},
    {"the op, no histograms", the_op<false>},
    {"the op, float buckets", the_op<true>},
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || !__builtin_cpu_supports("avx512bw")) {
    fprintf(stderr, "usage: floor TENSORS_FILE ROUNDS [CAP] (needs AVX-512)\n");
    return 2;
  }
  FILE* f = fopen(argv[1], "rb");
  const int rounds = atoi(argv[2]);
  const int64_t cap = argc > 3 ? atoll(argv[3]) : 0;
  int64_t nt = 0;
  if (!f || fread(&nt, 8, 1, f) != 1) return 2;
  std::vector<int64_t> ns(nt);
  if (fread(ns.data(), 8, nt, f) != size_t(nt)) return 2;
  std::vector<std::vector<float>> src(nt), buf(nt);
  int64_t total = 0;
  for (int i = 0; i < nt; ++i) {
    src[i].resize(ns[i]);
    buf[i].resize(ns[i]);
    total += ns[i];
    if (fread(src[i].data(), 4, ns[i], f) != size_t(ns[i])) return 2;
  }
  std::vector<int> reps(nt, 1);
  if (cap > 0) {
    total = 0;
    for (int i = 0; i < nt; ++i) {
      ns[i] = std::min(cap, ns[i]);
      reps[i] = static_cast<int>(std::max<int64_t>(1, (int64_t(1) << 21) / ns[i]));
      total += ns[i] * reps[i];
    }
  }
  constexpr int nv = sizeof(kVariants) / sizeof(kVariants[0]);
  std::vector<std::vector<double>> ms(nv), ratio(nv);
  volatile double sink = 0;
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> t(nv);
    for (int w = 0; w < nv; ++w) {
      const int v = (r + w) % nv;
      for (int i = 0; i < nt; ++i) {
        memcpy(buf[i].data(), src[i].data(), 4 * ns[i]);
        const double t0 = now();
        for (int k = 0; k < reps[i]; ++k) sink = sink + kVariants[v].fn(buf[i].data(), ns[i]);
        t[v] += now() - t0;
      }
    }
    for (int v = 0; v < nv; ++v) {
      ms[v].push_back(1e3 * t[v]);
      ratio[v].push_back(t[v] / t[0]);
    }
  }
  auto q = [](std::vector<double> a, double at) {
    std::sort(a.begin(), a.end());
    return a[static_cast<size_t>(at * (a.size() - 1) + 0.5)];
  };
  printf("{\"values\": %lld, \"tensors\": %lld, \"results\": {", static_cast<long long>(total), static_cast<long long>(nt));
  for (int v = 0; v < nv; ++v)
    printf("%s\n \"%s\": {\"ms\": %.4f, \"ns_per_value\": %.5f, \"x_sum\": %.3f, \"x_sum_q1\": %.3f, \"x_sum_q3\": %.3f}",
           v ? "," : "", kVariants[v].name, q(ms[v], 0.5), 1e6 * q(ms[v], 0.5) / total, q(ratio[v], 0.5),
           q(ratio[v], 0.25), q(ratio[v], 0.75));
  printf("}}\n");
  return 0;
}

#pragma GCC pop_options
