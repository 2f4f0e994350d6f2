// the floor of the float buckets' counting alone: one 16-bit increment per value (4 copies, slot = bits >> 20),
// indices precomputed from randn / relu / narrow data and streamed from memory (32 MB), no other work
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>
#include <algorithm>
#include <cstdlib>
static double tnow() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
alignas(64) uint16_t fh[4097 * 16];
int sub = 4;
int main(int argc, char** argv) {
  std::string kind = argc > 1 ? argv[1] : "randn";
  if (argc > 3) sub = atoi(argv[3]);
  const int64_t n = argc > 2 ? atol(argv[2]) : 16 << 20;
  std::vector<uint16_t> idx(n);
  std::mt19937 g(1); std::normal_distribution<float> d;
  for (int64_t i = 0; i < n; ++i) {
    float v = d(g); if (kind == "relu" && v < 0) v = 0; if (kind == "narrow") v = 1 + 0.001f * v;
    uint32_t b; memcpy(&b, &v, 4);
    int s = (b & 0x7fffffff) == 0 ? 2047 : b >> 20;
    if (kind == "uniform") s = 500 + g() % 1000;
    if (kind == "uniform100") s = 500 + g() % 100;
    idx[i] = s * sub + i % sub;
    if (getenv("PAIRLAYOUT")) idx[i] = ((i / 2) % sub) * 4104 + s;  // copy-major, one copy per pair of values
  }
  std::vector<double> t;
  const int R = std::max<int64_t>(1, (int64_t(16) << 20) / n);
  for (int r = 0; r < 7; ++r) {
   double t0 = tnow();
   for (int rr = 0; rr < R; ++rr) {
    for (int64_t o = 0; o < n; o += 255 * 1024) {
      const int64_t e = std::min(n, o + 255 * 1024);
#pragma GCC unroll 16
      for (int64_t i = o; i < e; ++i) ++fh[idx[i]];
      memset(fh, 0, sizeof fh);
    }
   }
    t.push_back((tnow() - t0) / (n * R) * 1e9);
  }
  std::sort(t.begin(), t.end());
  printf("%s: counting alone %.4f ns/value (median of 7, min %.4f)\n", kind.c_str(), t[3], t[0]);
}
