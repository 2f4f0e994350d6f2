// layout_dump.cpp -- prints csrc/accumulator.h's state layout as JSON, as the compiler sees it: every row of
// csrc/state_layout.def by its C++ name with its compiled value, the derived constants, and the istate offsets of
// every flag combination for a few nbins. tests/test_layout_source.py compares it with hookstats/rawstate.py.
#include <cstdio>
#include <initializer_list>

#include "accumulator.h"

using namespace hookstats;

int main() {
  std::printf("{\"rows\": {");
  const char* sep = "";
#define HS_LAYOUT_VERSION(version) std::printf("%s\"LayoutVersion\": %d", sep, kLayoutVersion), sep = ", ";
#define HS_FSLOT(name, merge, step) std::printf("%s\"" #name "\": %d", sep, static_cast<int>(k##name)), sep = ", ";
#define HS_COUNTER(name) std::printf("%s\"" #name "\": %d", sep, static_cast<int>(k##name)), sep = ", ";
#define HS_FLAG(name, bit) std::printf("%s\"" #name "\": %d", sep, static_cast<int>(k##name)), sep = ", ";
#define HS_CONST(name, value) std::printf("%s\"" #name "\": %d", sep, static_cast<int>(k##name)), sep = ", ";
#include "state_layout.def"
  std::printf("}, \"derived\": {\"FState\": %d, \"LinBase\": %d, \"HistFlags\": %d, \"FloatShift\": %d, "
              "\"FloatHalf\": %d, \"FloatSlots\": %d, \"FloatBelow\": %d, \"FloatAbove\": %d, \"FloatZero\": %d}",
              kFState, kLinBase, kHistFlags, kFloatShift, kFloatHalf, kFloatSlots, kFloatBelow, kFloatAbove,
              kFloatZero);
  std::printf(", \"offsets\": [");
  sep = "";
  for (int nbins : {1, 7, 40, kMaxBins}) {
    for (int flags = 0; flags < 16; ++flags) {
      std::printf("%s[%d, %d, %lld, %lld, %lld, %lld, %lld]", sep, nbins, flags,
                  static_cast<long long>(kept_first(nbins, flags)),
                  static_cast<long long>(nonfinite_base(nbins, flags)),
                  static_cast<long long>(log_base(nbins, flags)), static_cast<long long>(float_base(nbins, flags)),
                  static_cast<long long>(istate_size(nbins, flags)));
      sep = ", ";
    }
  }
  std::printf("]}\n");
  return 0;
}
