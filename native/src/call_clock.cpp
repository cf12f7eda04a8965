// call_clock.cpp: see call_clock.hpp.
#include "call_clock.hpp"

namespace lb {

void CallClock::begin(int32_t kind) {
    kind_ = kind;
    graphs_ = 0;
    launch_ = wait_ = clock::duration{};
    begin_ = clock::now();
}

ggml_status CallClock::compute(ggml_backend_t backend, ggml_cgraph * gf, bool wait) {
    const clock::time_point t0 = clock::now();
    const ggml_status st = ggml_backend_graph_compute_async(backend, gf);
    const clock::time_point t1 = clock::now();
    if (wait) {
        ggml_backend_synchronize(backend);
        running_ = false;
    } else {
        running_ = true;
    }
    const clock::time_point t2 = clock::now();
    if (kind_ < 0) return st;  // a graph outside an ABI call (none today): not timed
    if (graphs_++ == 0) first_launch_ = t0;
    launch_ += t1 - t0;
    wait_ += t2 - t1;
    last_wait_ = t2;
    return st;
}

void CallClock::settle(ggml_backend_t backend) {
    if (!running_) return;
    ggml_backend_synchronize(backend);
    running_ = false;
}

void CallClock::end(bool ok) {
    const clock::time_point t = clock::now();
    if (kind_ < 0) return;
    if (ok) {
        lb_call_times & out = last_[size_t(kind_)];
        out = lb_call_times{};
        out.graphs = graphs_;
        out.total_ms = ms(t - begin_);
        if (graphs_ > 0) {
            out.before_ms = ms(first_launch_ - begin_);
            out.launch_ms = ms(launch_);
            out.wait_ms = ms(wait_);
            // the rest of the span from the first launch to the last wait
            out.between_ms = ms(last_wait_ - first_launch_ - launch_ - wait_);
            out.after_ms = ms(t - last_wait_);
        } else {
            out.before_ms = out.total_ms;  // no graph ran: all of it came before one would have
        }
    }
    kind_ = -1;
}

}  // namespace lb
