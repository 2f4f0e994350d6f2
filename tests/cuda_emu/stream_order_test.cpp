// stream_order_test.cpp -- csrc/cuda/stream_order.h against a fake CUDA API that logs every call: which
// launches on one state make the new stream wait for the old one, and which cannot (a capture's boundary).
// Prints "ok" and exits 0, else the first failed expectation and exits 1. tests/test_cuda_emulation.py runs it.
#include "cuda/stream_order.h"

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

using hookstats::cuda_kernel::StreamOrder;

struct FakeApi {
  using Stream = int;  // 0 is the default stream, as in CUDA
  using Event = int;
  std::vector<std::string>* log;
  const unsigned long long* capture;  // capture id per stream (0: not capturing)
  Event create_event() {
    log->push_back("create");
    return static_cast<int>(log->size());
  }
  void record(Event, Stream s) { log->push_back("record " + std::to_string(s)); }
  void wait(Stream s, Event) { log->push_back("wait " + std::to_string(s)); }
  unsigned long long capture_id(Stream s) const { return capture[s]; }
};

namespace {
int failures = 0;
void expect(const std::vector<std::string>& got, const std::vector<std::string>& want, const char* what) {
  if (got == want) return;
  std::string g;
  for (const auto& s : got) g += "[" + s + "]";
  std::printf("FAIL %s: got %s\n", what, g.c_str());
  ++failures;
}
}  // namespace

int main() {
  unsigned long long capture[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int a = 1, b = 2;
  {
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    order.before_launch(&a, 0);
    order.before_launch(&a, 0);
    order.before_launch(&b, 3);
    expect(log, {}, "first launches and one stream: no event");
    order.before_launch(&a, 3);
    expect(log, {"create", "record 0", "wait 3"}, "a state moves from stream 0 to 3: 3 waits for 0");
    log.clear();
    order.before_launch(&a, 3);
    order.before_launch(&b, 3);
    expect(log, {}, "the state stays on stream 3");
    order.before_launch(&a, 0);
    expect(log, {"record 3", "wait 0"}, "back to stream 0: one event per state, recorded again");
  }
  {
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    order.before_launch(&a, 1);  // eager warm-up on the default-ish stream
    capture[4] = capture[5] = 77;  // streams 4 and 5 join one capture (a forked branch)
    order.before_launch(&a, 4);
    expect(log, {}, "eager -> captured stream: no wait across the capture's boundary");
    order.before_launch(&a, 5);
    expect(log, {"create", "record 4", "wait 5"}, "two branches of one capture: an edge of the graph");
    log.clear();
    capture[6] = 78;  // another capture
    order.before_launch(&a, 6);
    order.before_launch(&a, 1);
    expect(log, {}, "one capture to another, captured to eager: no wait");
    capture[4] = capture[5] = capture[6] = 0;  // captures ended
    order.before_launch(&a, 4);
    expect(log, {"record 1", "wait 4"}, "after the capture: eager streams wait again");
  }
  {  // many threads, each its own stream, one state: every switch waits, none is lost (TSan checks the registry)
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&order, t, &a] {
        for (int i = 0; i < 200; ++i) {
          const auto held = order.lock();
          order.before_launch(&a, t);
        }
      });
    for (auto& t : ts) t.join();
    size_t records = 0, waits = 0;
    for (const auto& s : log) {
      records += s.rfind("record", 0) == 0;
      waits += s.rfind("wait", 0) == 0;
    }
    if (records != waits) {
      std::printf("FAIL threads: %zu records, %zu waits\n", records, waits);
      ++failures;
    }
  }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
