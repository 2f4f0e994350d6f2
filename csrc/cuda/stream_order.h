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
// Torch ops that read or write a state on the host's side (step ends, resets, checkpoints, host reads) go through
// the same registry (the order_states op): their stream waits for the state's last one and becomes its stream.
//
// States are keyed by their fstate's address, which a freed state's memory may give to a new one: each entry keeps
// an owner (the fstate's storage, held weakly: its identity cannot be reused while the entry lives), and a state
// at a known address with another owner starts afresh. Entries of freed states are dropped (their events
// destroyed) whenever the registry has doubled since the last sweep.
//
// Api is a policy (CudaApi in accumulate_cuda.cpp; a fake in tests/cuda_emu/stream_order_test.cpp):
//   Stream, Event, Owner               handle types (Owner: what identifies a state's memory)
//   Event create_event()               one event, no timing
//   void destroy_event(Event)
//   void record(Event, Stream)         the event after the work queued on the stream so far
//   void wait(Stream, Event)           the stream waits for the event
//   unsigned long long capture_id(Stream)   0 when the stream is not capturing, else its capture's id
//   bool same(const Owner&, const Owner&)   one state's memory
//   bool alive(const Owner&)           the state's memory is still in use
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
  using Owner = typename Api::Owner;

  explicit StreamOrder(Api api = Api()) : api_(api) {}

  // Held from the first before_launch of a call until its last launch is queued: the event a later launch on
  // another stream records must come after this launch, not before it.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mutex_); }

  // Before work on `stream` that reads or updates the state whose fstate is at `state` (owned by `owner`); with
  // lock() held.
  void before_launch(const void* state, const Owner& owner, Stream stream) {
    auto it = entries_.find(state);
    if (it == entries_.end()) {
      if (entries_.size() >= sweep_at_) sweep();
      it = entries_.emplace(state, Entry{owner}).first;
    } else if (!api_.same(it->second.owner, owner)) {  // a new state in a freed one's memory: no order to keep
      it->second.owner = owner;
      it->second.seen = false;
    }
    Entry& e = it->second;
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

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Owner owner;
    bool seen = false, has_event = false;
    Stream stream{};
    Event event{};
  };

  void sweep() {  // drops the entries of freed states; the next sweep when the registry has doubled
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (api_.alive(it->second.owner)) {
        ++it;
        continue;
      }
      if (it->second.has_event) api_.destroy_event(it->second.event);
      it = entries_.erase(it);
    }
    sweep_at_ = entries_.size() * 2 > kFirstSweep ? entries_.size() * 2 : kFirstSweep;
  }

  static constexpr size_t kFirstSweep = 256;
  Api api_;
  std::mutex mutex_;
  std::unordered_map<const void*, Entry> entries_;  // one per live state (a few hundred bytes each)
  size_t sweep_at_ = kFirstSweep;
};

}  // namespace cuda_kernel
}  // namespace hookstats
