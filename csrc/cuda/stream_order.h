// stream_order.h -- orders the launches on one state across CUDA streams. A state's blocks share its scratch
// (block partials and the last-block ticket): two launches on it that run at once mix partials and leave the
// ticket armed, after which every launch misfires. The host lock orders when launches are queued, not when they
// run, so a launch on a stream other than the state's previous one first waits for everything queued on that
// stream so far, which holds the previous launch (an event recorded there now, waited on by the new stream).
// Nothing is recorded while a state stays on one stream.
//
// CUDA graphs: inside one capture (forked branches of a captured step) the record/wait is captured as an edge
// of the graph. Across a capture's boundary no wait is possible (a captured stream may not wait on an event
// recorded outside its capture, nor the reverse); such launches are ordered by the capture itself (torch.cuda.graph
// synchronises before capturing), and a graph's replays are ordered by the stream they run on.
//
// Api is a policy (CudaApi in accumulate_cuda.cu; a fake in tests/cuda_emu/stream_order_test.cpp):
//   Stream, Event                      handle types
//   Event create_event()               one event, no timing
//   void record(Event, Stream)         the event after the work queued on the stream so far
//   void wait(Stream, Event)           the stream waits for the event
//   unsigned long long capture_id(Stream)   0 when the stream is not capturing, else its capture's id
#pragma once
#include <mutex>
#include <unordered_map>

namespace hookstats {
namespace cuda_kernel {

template <typename Api>
class StreamOrder {
 public:
  using Stream = typename Api::Stream;
  using Event = typename Api::Event;

  explicit StreamOrder(Api api = Api()) : api_(api) {}

  // Held from the first before_launch of a call until its last launch is queued: the event a later launch on
  // another stream records must come after this launch, not before it.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

  // Before a launch on `stream` that updates the state whose fstate is at `state`; with lock() held.
  void before_launch(const void* state, Stream stream) {
    Entry& e = entries_[state];
    if (e.seen && !(e.stream == stream)) {
      const unsigned long long was = api_.capture_id(e.stream), now = api_.capture_id(stream);
      if (was == now) {  // both outside any capture, or both in the same one
        if (!e.has_event) {
          e.event = api_.create_event();
          e.has_event = true;
        }
        api_.record(e.event, e.stream);
        api_.wait(stream, e.event);
      }
    }
    e.seen = true;
    e.stream = stream;
  }

 private:
  struct Entry {
    bool seen = false, has_event = false;
    Stream stream{};
    Event event{};
  };
  Api api_;
  std::mutex mutex_;
  std::unordered_map<const void*, Entry> entries_;  // one per state ever launched on (a few hundred bytes each)
};

}  // namespace cuda_kernel
}  // namespace hookstats
