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
  struct Owner {  // a state's memory: its id, and whether it is still in use
    int id;
    const bool* in_use;
  };
  std::vector<std::string>* log;
  const unsigned long long* capture;  // capture id per stream (0: not capturing)
  Event create_event() {
    log->push_back("create");
    return static_cast<int>(log->size());
  }
  void destroy_event(Event) { log->push_back("destroy"); }
  bool same(const Owner& a, const Owner& b) const { return a.id == b.id; }
  bool alive(const Owner& o) const { return *o.in_use; }
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
  const bool yes = true;
  const FakeApi::Owner A{1, &yes}, B{2, &yes};
  {
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    order.before_launch(&a, A, 0);
    order.before_launch(&a, A, 0);
    order.before_launch(&b, B, 3);
    expect(log, {}, "first launches and one stream: no event");
    order.before_launch(&a, A, 3);
    expect(log, {"create", "record 0", "wait 3"}, "a state moves from stream 0 to 3: 3 waits for 0");
    log.clear();
    order.before_launch(&a, A, 3);
    order.before_launch(&b, B, 3);
    expect(log, {}, "the state stays on stream 3");
    order.before_launch(&a, A, 0);
    expect(log, {"record 3", "wait 0"}, "back to stream 0: one event per state, recorded again");
  }
  {
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    order.before_launch(&a, A, 1);  // eager warm-up on the default-ish stream
    capture[4] = capture[5] = 77;  // streams 4 and 5 join one capture (a forked branch)
    order.before_launch(&a, A, 4);
    expect(log, {}, "eager -> captured stream: no wait across the capture's boundary");
    order.before_launch(&a, A, 5);
    expect(log, {"create", "record 4", "wait 5"}, "two branches of one capture: an edge of the graph");
    log.clear();
    capture[6] = 78;  // another capture
    order.before_launch(&a, A, 6);
    order.before_launch(&a, A, 1);
    expect(log, {}, "one capture to another, captured to eager: no wait");
    capture[4] = capture[5] = capture[6] = 0;  // captures ended
    order.before_launch(&a, A, 4);
    expect(log, {"record 1", "wait 4"}, "after the capture: eager streams wait again");
  }
  {  // many threads, each its own stream, one state: every switch waits, none is lost (TSan checks the registry)
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&order, t, &a, &A] {
        for (int i = 0; i < 200; ++i) {
          const auto held = order.lock();
          order.before_launch(&a, A, t);
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
  {  // a new state at a freed state's address does not inherit its stream; freed states' entries are dropped
    std::vector<std::string> log;
    StreamOrder<FakeApi> order(FakeApi{&log, capture});
    order.before_launch(&a, A, 3);
    const FakeApi::Owner A2{3, &yes};  // another state's memory at a's address
    order.before_launch(&a, A2, 0);
    expect(log, {}, "a new state at a reused address: no wait for the old state's stream");
    order.before_launch(&a, A2, 3);
    expect(log, {"create", "record 0", "wait 3"}, "the new state's own switch waits");
    log.clear();
    bool in_use[600];
    std::vector<int> keys(600);
    for (int k = 0; k < 600; ++k) {
      in_use[k] = k % 3 == 0;  // two in three freed
      order.before_launch(&keys[k], FakeApi::Owner{100 + k, &in_use[k]}, 1);
      order.before_launch(&keys[k], FakeApi::Owner{100 + k, &in_use[k]}, 2);  // an event each
    }
    size_t destroyed = 0;
    for (const auto& s : log) destroyed += s == "destroy";
    if (order.size() >= 600 || destroyed == 0) {
      std::printf("FAIL sweep: %zu entries after 600 states of which 400 freed, %zu events destroyed\n",
                  order.size(), destroyed);
      ++failures;
    }
    for (int k = 0; k < 600; ++k) in_use[k] = true;  // no entry of a live state was dropped: its switch still waits
    log.clear();
    order.before_launch(&keys[0], FakeApi::Owner{100, &in_use[0]}, 1);
    expect(log, {"record 2", "wait 1"}, "a live state's entry survives the sweep");
  }
  if (failures) return 1;
  std::printf("ok\n");
  return 0;
}
