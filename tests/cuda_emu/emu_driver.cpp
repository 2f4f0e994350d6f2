// emu_driver.cpp -- runs the real CUDA kernels (csrc/cuda/accumulate_kernel.cuh) on CPU threads through
// cuda_emu.h and writes the resulting states; tests/test_cuda_emulation.py feeds it and checks them.
// usage: emu_driver IN OUT dtype nbins lo inv_w eps flags threads LAUNCHES mode ARGS...
//   LAUNCHES: "E", "E:D" or "E:D:H": E launches with enabled=1, then D with enabled=0 (must change nothing), then H
//             with enabled=3 (kSkipHist: all but the histograms)
//   mode dense   MISALIGN GRID            one tensor, MISALIGN elements past a 16-byte boundary
//   mode many    N1,N2,..  G1,G2,..       consecutive segments of IN, each with its own state
//   mode strided GRID S1,S2,.. T1,T2,..   one view of IN with these sizes and element strides (coalesced
//                                         by the launcher's own coalesce())
//   mode limits                           prints max_block_elems(params, threads) (IN and OUT unused)
//   mode float_words                      OUT: the float table's word (int32) the dense kernel's hot loop increments
//                                         for each value of IN (tests/test_bank_conflicts.py)
#include "cuda_emu.h"
#include "cuda/accumulate_kernel.cuh"

#include <algorithm>
#include <fstream>
#include <string>

using namespace hookstats;
using namespace hookstats::cuda_kernel;

namespace {

std::vector<int64_t> ints(const std::string& s) {
  std::vector<int64_t> v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    v.push_back(std::stoll(s.substr(pos, comma - pos)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

struct State {
  std::vector<double> fs;
  std::vector<int64_t> is;
  std::vector<unsigned char> scratch;
  State(int nbins, int flags, int max_blocks)
      : fs{0, 0, 0, __builtin_nan(""), __builtin_nan("")}, is(istate_size(nbins, flags), 0),
        scratch(scratch_bytes_for(max_blocks), 0) {}
};

template <typename T>
void launch_dense(const Batch& b, const Params& p, int threads, const unsigned char* enabled) {
  cuda_emu::launch(b.block_start[b.count], threads, dyn_smem_bytes(p, threads), dense_kernel_for<T>(p.flags), b, p,
                   enabled, 1);
}

// The flag of launch l: E launches on, D off, then the rest with kSkipHist.
struct Launches {
  int on, off, skip;
  int total() const { return on + off + skip; }
  const unsigned char* flag(int l) const {
    static const unsigned char values[] = {1, 0, 1 | kSkipHist};
    return &values[l < on ? 0 : l < on + off ? 1 : 2];
  }
};

template <typename T>
int run(char** argv, const std::vector<unsigned char>& raw, const Params& p, int threads, const Launches& ls,
        std::vector<State>& states) {
  const std::string mode = argv[11];
  const int64_t total = static_cast<int64_t>(raw.size() / sizeof(T));
  if (mode == "dense" || mode == "many") {
    std::vector<int64_t> sizes{total}, grids;
    int64_t misalign = 0;
    if (mode == "dense") {
      misalign = std::stoll(argv[12]);
      grids = {std::stoll(argv[13])};
    } else {
      sizes = ints(argv[12]);
      grids = ints(argv[13]);
    }
    if (sizes.size() != grids.size() || sizes.size() > static_cast<size_t>(kMaxTargets)) return 2;
    // 16-byte aligned copy of the input, shifted by `misalign` elements (ASan sees the exact bounds)
    std::vector<T*> bufs;
    Batch b{};
    b.count = static_cast<int>(sizes.size());
    int64_t off = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      states.emplace_back(p.nbins, p.flags, static_cast<int>(grids[k]));
      auto* base = static_cast<unsigned char*>(std::aligned_alloc(16, ((misalign + sizes[k]) * sizeof(T) + 15) / 16 * 16 + 16));
      T* x = reinterpret_cast<T*>(base) + misalign;
      std::memcpy(x, raw.data() + off * sizeof(T), sizes[k] * sizeof(T));
      bufs.push_back(reinterpret_cast<T*>(base));
      off += sizes[k];
      b.block_start[k + 1] = b.block_start[k] + static_cast<int>(grids[k]);
    }
    for (size_t k = 0; k < sizes.size(); ++k)
      b.t[k] = make_target(bufs[k] + misalign, sizes[k], sizeof(T), states[k].fs.data(), states[k].is.data(),
                           states[k].scratch.data());
    for (int l = 0; l < ls.total(); ++l) launch_dense<T>(b, p, threads, ls.flag(l));
    for (T* q : bufs) std::free(q);
    return 0;
  }
  if (mode == "strided") {
    const int grid = std::stoi(argv[12]);
    const auto sz = ints(argv[13]), st = ints(argv[14]);
    Strided s{};
    if (sz.size() != st.size() || !coalesce(sz.data(), st.data(), static_cast<int>(sz.size()), s)) return 2;
    int64_t n = 1;
    for (const int64_t d : sz) n *= d;
    states.emplace_back(p.nbins, p.flags, grid);
    std::vector<T> x(total);
    std::memcpy(x.data(), raw.data(), raw.size());
    const Target t = make_target(x.data(), n, sizeof(T), states[0].fs.data(), states[0].is.data(), states[0].scratch.data());
    for (int l = 0; l < ls.total(); ++l)
      cuda_emu::launch(grid, threads, dyn_smem_bytes(p, threads), strided_kernel<T>, t, s, p, ls.flag(l), 1);
    return 0;
  }
  return 2;
}

template <typename T>
std::vector<int32_t> words_of(const std::vector<unsigned char>& raw) {
  std::vector<int32_t> w(raw.size() / sizeof(T));
  for (size_t i = 0; i < w.size(); ++i) {
    T v;
    std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
    w[i] = static_cast<int32_t>(float_offset<kZerosNatural<T>>(to_acc(v)) / sizeof(unsigned));
  }
  return w;
}

int float_words(const char* in_path, const char* out_path, const std::string& dtype) {
  std::ifstream in(in_path, std::ios::binary);
  const std::vector<unsigned char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int32_t> w;
  if (dtype == "float32") w = words_of<float>(raw);
  else if (dtype == "float64") w = words_of<double>(raw);
  else if (dtype == "bfloat16") w = words_of<__nv_bfloat16>(raw);
  else if (dtype == "float16") w = words_of<__half>(raw);
  else return 2;
  std::ofstream(out_path, std::ios::binary).write(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(int32_t));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 12 && std::string(argv[11]) == "limits") {
    const Params q{0.0f, 1.0f, 0.0f, std::stoi(argv[4]), std::stoi(argv[8]), std::stoi(argv[8])};
    std::printf("%lld\n", static_cast<long long>(max_block_elems(q, std::stoi(argv[9]))));
    return 0;
  }
  if (argc == 12 && std::string(argv[11]) == "float_words") return float_words(argv[1], argv[2], argv[3]);
  if (argc < 13) {
    std::fprintf(stderr, "usage: emu_driver IN OUT dtype nbins lo inv_w eps flags threads launches mode ARGS...\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<unsigned char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string dtype = argv[3];
  const Params p{std::stof(argv[5]), std::stof(argv[6]), std::stof(argv[7]), std::stoi(argv[4]), std::stoi(argv[8]),
                 std::stoi(argv[8])};
  std::string launches = argv[10];
  std::replace(launches.begin(), launches.end(), ':', ',');
  const std::vector<int64_t> counts = ints(launches);
  const int threads = std::stoi(argv[9]);
  const Launches ls{static_cast<int>(counts[0]), counts.size() > 1 ? static_cast<int>(counts[1]) : 0,
                    counts.size() > 2 ? static_cast<int>(counts[2]) : 0};
  std::vector<State> states;
  states.reserve(kMaxTargets);
  int rc = 2;
  if (dtype == "float32") rc = run<float>(argv, raw, p, threads, ls, states);
#if !defined(HS_EMU_FLOAT_ONLY)  // the planted-bug builds need only float32: a quicker compile
  else if (dtype == "float64") rc = run<double>(argv, raw, p, threads, ls, states);
  else if (dtype == "float16") rc = run<__half>(argv, raw, p, threads, ls, states);
  else if (dtype == "bfloat16") rc = run<__nv_bfloat16>(argv, raw, p, threads, ls, states);
#endif
  if (rc != 0) {
    std::fprintf(stderr, "emu_driver: bad arguments\n");
    return rc;
  }
  std::ofstream out(argv[2], std::ios::binary);
  for (const State& s : states) {  // per target: fstate | istate | ticket
    unsigned ticket;
    std::memcpy(&ticket, s.scratch.data(), sizeof(ticket));
    const int64_t t64 = ticket;
    out.write(reinterpret_cast<const char*>(s.fs.data()), s.fs.size() * sizeof(double));
    out.write(reinterpret_cast<const char*>(s.is.data()), s.is.size() * sizeof(int64_t));
    out.write(reinterpret_cast<const char*>(&t64), sizeof(t64));
  }
  return 0;
}
