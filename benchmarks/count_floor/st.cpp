// random 16-bit increments / stores against ones whose consecutive stores share a 64-byte line (cycles at 2.97 GHz)
#include <cstdio>
#include <ctime>
#include <cstdint>
#include <random>
static double tnow() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
alignas(64) uint16_t idx[1024], seqi[1024], pairi[1024];
alignas(64) uint16_t fh[65536];
template <int V> __attribute__((noinline)) long run(const uint16_t* f, long reps) {
  long s = 0;
  for (long r = 0; r < reps; ++r) {
#pragma GCC unroll 16
    for (int k = 0; k < 1024; ++k) {
      if (V == 0) ++fh[f[k]];
      if (V == 1) fh[f[k]] = k;
      if (V == 2) s += fh[f[k]];
    }
    asm volatile("" ::: "memory");
  }
  return s;
}
int main(int argc, char** argv) {
  int spread = argc > 1 ? atoi(argv[1]) : 100;
  std::mt19937 g(1);
  for (int i = 0; i < 1024; ++i) { idx[i] = (1000 + g() % spread) * 4 + i % 4; seqi[i] = 4000 + i % 512; }
  // pairs: each two consecutive in the same 64-byte line (slots 2k, 2k+1 of random k... same line = 32 counters)
  for (int i = 0; i < 1024; i += 2) { int line = 1000 + g() % spread; pairi[i] = line * 32 + (i / 2) % 4; pairi[i + 1] = line * 32 + 16 + (i / 2) % 4; }
  long reps = 100000;
  auto go = [&](auto fn, const uint16_t* f, const char* name) { double t0 = tnow(); long s = fn(f, reps); double t = tnow() - t0;
    printf("%-30s %.3f cycles/value (%ld)\n", name, t * 2.97e9 / (reps * 1024), s); };
  go(run<0>, idx, "RMW random");
  go(run<1>, idx, "store random");
  go(run<0>, seqi, "RMW sequential");
  go(run<1>, seqi, "store sequential");
  go(run<0>, pairi, "RMW pairs in one line");
  go(run<1>, pairi, "store pairs in one line");
}
