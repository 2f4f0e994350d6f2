// Prototype (timing only; the 16-bit counters wrap): pairs of values whose slots both fall in a 64-slot window
// (32 magnitudes per sign) counted with ONE increment in a pair table, the others one by one, against the current
// one-increment-per-value pass; x walks 1 MB of randn (unpredictable slots).
#include <immintrin.h>
#include <cstdio>
#include <ctime>
#include <cstdint>
#include <random>
#include <cstring>
#include <vector>
static double tnow() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
constexpr int NX = 1024;  // values per block
alignas(64) float xbig[1 << 18];
const float* x = xbig;
alignas(64) uint16_t fs[2][NX + 64];
alignas(64) uint16_t fh[16400];
alignas(64) uint16_t pt[8192 + 64];
alignas(64) uint32_t ps[2][NX / 2 + 64], ss[2][NX + 64];
int pn[2], sn[2];
template <int V>
__attribute__((noinline)) double run(long reps, int m0) {
  const __m512 kv = _mm512_set1_ps(0.1f), eps = _mm512_set1_ps(1e-6f);
  const __m512i nz_mask = _mm512_set1_epi32(0x7fffffff), all = _mm512_set1_epi32(-1), abs_mask = nz_mask, float_zero = _mm512_set1_epi32(2047);
  alignas(64) int32_t o[16], o2[16];
  for (int k = 0; k < 16; ++k) { o[k] = k % 4; o2[k] = k % 2; }
  const __m512i off = _mm512_load_si512(o), off2 = _mm512_load_si512(o2);
  const __m512i m0v = _mm512_set1_epi32(m0), win = _mm512_set1_epi32(0xFFFFF7E0), k81f = _mm512_set1_epi32(0x81F), k63 = _mm512_set1_epi32(63);
  __m512 bmn = _mm512_set1_ps(1e30f), bmx = _mm512_set1_ps(-1e30f), c1a = _mm512_setzero_ps(), c1b = c1a, c2a = c1a, c2b = c1a;
  __m512i nz = _mm512_setzero_si512();
  int cur = 0;
  for (long r = 0; r < reps; ++r) {
    x = xbig + (r & 255) * NX;
    uint16_t* out = fs[cur]; const uint16_t* prev = fs[cur ^ 1];
    uint32_t* pout = ps[cur]; uint32_t* sout = ss[cur];
    const uint32_t* pprev = ps[cur ^ 1]; const uint32_t* sprev = ss[cur ^ 1];
    const int pend = pn[cur ^ 1], send = sn[cur ^ 1];
    int np = 0, ns = 0, pi = 0, si = 0;
    for (int j = 0; j < NX / 16; j += 2) {
      __m512i f2[2];
      for (int u = 0; u < 2; ++u) {
        __m512& c1 = u ? c1b : c1a; __m512& c2 = u ? c2b : c2a;
        const __m512 v = _mm512_load_ps(x + (j + u) * 16);
        const __m512 d = _mm512_sub_ps(v, kv);
        c1 = _mm512_add_ps(c1, d);
        c2 = _mm512_fmadd_ps(d, d, c2);
        bmn = _mm512_min_ps(v, bmn); bmx = _mm512_max_ps(v, bmx);
        const __m512i bits = _mm512_castps_si512(v);
        const __mmask16 z = _mm512_cmp_ps_mask(_mm512_castsi512_ps(_mm512_and_si512(bits, nz_mask)), eps, _CMP_LE_OQ);
        nz = _mm512_mask_sub_epi32(nz, z, nz, all);
        const __mmask16 zero = _mm512_testn_epi32_mask(bits, abs_mask);
        const __m512i f = _mm512_mask_mov_epi32(_mm512_srli_epi32(bits, 20), zero, float_zero);
        f2[u] = f;
        if (V == 0) {
          const __m512i fk = _mm512_add_epi32(_mm512_slli_epi32(f, 2), off);
          _mm256_store_si256(reinterpret_cast<__m256i*>(out + (j + u) * 16), _mm512_cvtepi32_epi16(fk));
        }
      }
      if (V == 1) {
        const __m512i wa = _mm512_sub_epi32(f2[0], m0v), wb = _mm512_sub_epi32(f2[1], m0v);
        const __mmask16 m = _mm512_testn_epi32_mask(wa, win) & _mm512_testn_epi32_mask(wb, win);
        __m512i ra = _mm512_and_si512(wa, k81f), rb = _mm512_and_si512(wb, k81f);
        ra = _mm512_and_si512(_mm512_or_si512(ra, _mm512_srli_epi32(ra, 6)), k63);
        rb = _mm512_and_si512(_mm512_or_si512(rb, _mm512_srli_epi32(rb, 6)), k63);
        const __m512i P = _mm512_ternarylogic_epi32(_mm512_slli_epi32(ra, 7), _mm512_slli_epi32(rb, 1), off2, 0xFE);
        _mm512_storeu_si512(pout + np, _mm512_maskz_compress_epi32(m, P));
        const int c = __builtin_popcount(m);
        np += c;
        const __m512i sa = _mm512_add_epi32(_mm512_slli_epi32(f2[0], 2), off), sb = _mm512_add_epi32(_mm512_slli_epi32(f2[1], 2), off);
        _mm512_storeu_si512(sout + ns, _mm512_maskz_compress_epi32(~m, sa));
        _mm512_storeu_si512(sout + ns + 16 - c, _mm512_maskz_compress_epi32(~m, sb));
        ns += 32 - 2 * c;
        // count the previous block's streams: up to 12 pairs and 12 singles per 32 values
#pragma GCC unroll 3
        for (int q = 0; q < 3; ++q) {
          if (pi + 4 <= pend) { ++pt[pprev[pi]]; ++pt[pprev[pi + 1]]; ++pt[pprev[pi + 2]]; ++pt[pprev[pi + 3]]; pi += 4; }
          if (si + 4 <= send) { ++fh[sprev[si]]; ++fh[sprev[si + 1]]; ++fh[sprev[si + 2]]; ++fh[sprev[si + 3]]; si += 4; }
        }
      }
      if (V == 0) {
        for (int u = 0; u < 2; ++u) {
          const uint16_t* f = prev + (j + u) * 16;
#pragma GCC unroll 16
          for (int k = 0; k < 16; ++k) ++fh[f[k]];
        }
      }
    }
    if (V == 1) {
      for (; pi < pend; ++pi) ++pt[pprev[pi]];
      for (; si < send; ++si) ++fh[sprev[si]];
      pn[cur] = np; sn[cur] = ns;
    }
    cur ^= 1;
    asm volatile("" ::: "memory");
  }
  return _mm512_reduce_add_ps(c1a) + _mm512_reduce_add_ps(c2b) + _mm512_reduce_add_ps(bmn)+ _mm512_reduce_add_ps(bmx) + _mm512_reduce_add_epi32(nz);
}
int main(int argc, char** argv) {
  float scale = argc > 1 ? atof(argv[1]) : 1.0f;
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (int i = 0; i < (1 << 18); ++i) xbig[i] = scale * nd(g);
  int m0 = 992;  // exponents 124..127: [1/8, 2)
  long reps = 30000;
  for (int V = 0; V < 2; ++V) {
    memset(fh, 0, sizeof fh); memset(pt, 0, sizeof pt); pn[0] = pn[1] = sn[0] = sn[1] = 0;
    double t0 = tnow(); double s = V ? run<1>(reps, m0) : run<0>(reps, m0); double t = tnow() - t0;
    printf("%s: %.2f cycles/vector at 2.97 GHz, %.4f ns/value (%g)\n", V ? "pair table" : "current", t * 2.97e9 / (reps * NX / 16), t * 1e9 / (reps * NX), s);
  }
}
