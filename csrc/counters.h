// counters.h -- the op counters' one shape: every HS_COUNTER row of state_layout.def after Count is a count of the
// values its predicate holds for (counter_predicates.h: one predicate per width). Every loop -- the scalar and AVX2
// and AVX-512 CPU loops, the CUDA threads, warps and blocks -- keeps them as a Counts<W>: one accumulator of width W
// per counter, generated from the rows, that observes values (each counter's predicate, looked up by its istate
// slot), merges another of its width and adds its totals to integers. A new counter is its row and its predicates;
// no loop, signature or reduction names it.
#pragma once
#include <cstdint>
#include <utility>

#include "accumulator.h"

// Inlined wherever it is called. On the CPU this also lets the vector loops' code (compiled for AVX2 or AVX-512)
// take in these target-neutral templates before it inlines its predicates into them.
#if defined(__CUDACC__) && !defined(HS_CPU_EMULATION)
#define HS_COUNTS_FN __host__ __device__ __forceinline__
#else
#define HS_COUNTS_FN inline __attribute__((always_inline))
#endif

namespace hookstats {

static_assert(kCount == 0, "state_layout.def: Count is istate slot 0, the op counters follow it");
// The op counters: the HS_COUNTER rows after Count, counter k in istate slot op_slot(k).
constexpr int kOpCounters = kLinBase - 1;
HS_HD constexpr int op_slot(int k) { return kCount + 1 + k; }
using CounterSeq = std::make_integer_sequence<int, kOpCounters>;

// One predicate object per op counter, Pred<slot> for each counter's istate slot (Pred<kNearZero>, ...), built from
// the call's Params: what a width's loop holds (its constants: thresholds, masks) beside its Counts.
template <template <int> class Pred, int K = 0, bool = (K < kOpCounters)>
struct Predicates : Predicates<Pred, K + 1> {
  Pred<op_slot(K)> pred;
  HS_COUNTS_FN explicit Predicates(const Params& p) : Predicates<Pred, K + 1>(p), pred(p) {}
};
template <template <int> class Pred, int K>
struct Predicates<Pred, K, false> {
  HS_COUNTS_FN explicit Predicates(const Params&) {}
};
template <int K, template <int> class Pred>
HS_COUNTS_FN const Pred<op_slot(K)>& predicate(const Predicates<Pred, K>& ps) {
  return ps.pred;
}

// The op counters' accumulators of width W. W: Acc (one counter's accumulator; zero-initialised by {}),
// merge(Acc& a, const Acc& b) (a += b) and total(const Acc&) (the count, an integer). A predicate of that width:
// count(Acc& a, v...) adds the values v it holds for to a (and first(Acc& a, v...) sets a to that count, where the
// width has one: observe_first). Accumulators go by reference: no vector crosses a call by value.
template <typename W>
struct Counts {
  typename W::Acc acc[kOpCounters] = {};

  template <typename Ps, typename... V>
  HS_COUNTS_FN void observe(const Ps& ps, const V&... v) { observe_(CounterSeq(), ps, v...); }
  template <typename Ps, typename... V>
  HS_COUNTS_FN void observe_first(const Ps& ps, const V&... v) { first_(CounterSeq(), ps, v...); }
  HS_COUNTS_FN void merge(const Counts& o) { merge_(CounterSeq(), o); }
  // out[k] += counter k's total (out: an integer Counts' acc, or istate + op_slot(0)).
  template <typename I>
  HS_COUNTS_FN void add_to(I* out) const { add_(CounterSeq(), out); }

 private:
  template <int... K, typename Ps, typename... V>
  HS_COUNTS_FN void observe_(std::integer_sequence<int, K...>, const Ps& ps, const V&... v) {
    (predicate<K>(ps).count(acc[K], v...), ...);
  }
  template <int... K, typename Ps, typename... V>
  HS_COUNTS_FN void first_(std::integer_sequence<int, K...>, const Ps& ps, const V&... v) {
    (predicate<K>(ps).first(acc[K], v...), ...);
  }
  template <int... K>
  HS_COUNTS_FN void merge_(std::integer_sequence<int, K...>, const Counts& o) {
    (W::merge(acc[K], o.acc[K]), ...);
  }
  template <int... K, typename I>
  HS_COUNTS_FN void add_(std::integer_sequence<int, K...>, I* out) const {
    ((out[K] += static_cast<I>(W::total(acc[K]))), ...);
  }
};

// Integer totals (a chunk's, a warp's): plain sums.
template <typename I>
struct Tally {
  using Acc = I;
  HS_COUNTS_FN static void merge(I& a, const I& b) { a += b; }
  HS_COUNTS_FN static I total(const I& a) { return a; }
};

// The op counters' totals of a piece of work (a CPU chunk), in istate's integers.
using CounterTotals = Counts<Tally<int64_t>>;

}  // namespace hookstats
