// call_clock.hpp: where an ABI call's host time goes (lb_call_times): before its first graph launch, in the
// backend's launches, waiting for the device, between its graphs, and after its last wait. Host clocks only: the
// device's own time is what the waits do not hide, so a call whose other parts are large spends that time on the
// host while the device idles. Three clock reads a graph: nothing a decode step would notice.
#pragma once

#include <array>
#include <chrono>

#include "ggml-backend.h"
#include "lucebox.h"

namespace lb {

class CallClock {
public:
    // The ABI call of `kind` (LB_CALL_*) starts; end() records it as that kind's last call.
    void begin(int32_t kind);
    // One graph, launched (ggml_backend_graph_compute_async) and waited for (ggml_backend_synchronize), each timed
    // when a call is running: what ggml_backend_graph_compute does, in two parts. With wait == false the graph is left
    // running (a commit's: the host goes on to the next call meanwhile): the next wait covers it, or settle().
    ggml_status compute(ggml_backend_t backend, ggml_cgraph * gf, bool wait = true);
    // Waits for the graphs left running, if any: before anything reaches device memory other than through the
    // backend's stream (ggml_backend_tensor_get / _set, buffer clears) or frees it.
    void settle(ggml_backend_t backend);
    // The call returned; a failed one (ok == false) leaves its kind's last times as they were.
    void end(bool ok);
    // The last successful call of `kind` (zeros before the first).
    const lb_call_times & last(int32_t kind) const { return last_.at(size_t(kind)); }

private:
    using clock = std::chrono::steady_clock;
    static double ms(clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

    int32_t kind_ = -1;  // the running call's kind; -1 between calls
    bool running_ = false;  // a graph was left running (compute without wait)
    int32_t graphs_ = 0;
    clock::time_point begin_, first_launch_, last_wait_;
    clock::duration launch_{}, wait_{};  // summed in the clock's own ticks, so the parts add up exactly
    std::array<lb_call_times, LB_CALL_KINDS> last_{};
};

}  // namespace lb
