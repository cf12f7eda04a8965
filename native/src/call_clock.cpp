// call_clock.cpp: see call_clock.hpp.
#include "call_clock.hpp"

namespace lb {

void CallClock::begin(int32_t kind) {
    kind_ = kind;
    now_ = lb_call_times{};
    begin_ = clock::now();
}

ggml_status CallClock::compute(ggml_backend_t backend, ggml_cgraph * gf) {
    const clock::time_point t0 = clock::now();
    const ggml_status st = ggml_backend_graph_compute_async(backend, gf);
    const clock::time_point t1 = clock::now();
    ggml_backend_synchronize(backend);
    const clock::time_point t2 = clock::now();
    if (kind_ < 0) return st;  // a graph outside an ABI call (none today): not timed
    if (now_.graphs++ == 0) first_launch_ = t0;
    now_.launch_ms += ms(t1 - t0);
    now_.wait_ms += ms(t2 - t1);
    last_wait_ = t2;
    return st;
}

void CallClock::end(bool ok) {
    const clock::time_point t = clock::now();
    if (kind_ < 0) return;
    now_.total_ms = ms(t - begin_);
    if (now_.graphs > 0) {
        now_.before_ms = ms(first_launch_ - begin_);
        now_.after_ms = ms(t - last_wait_);
    } else {
        now_.before_ms = now_.total_ms;  // no graph ran: all of it came before one would have
    }
    if (ok) last_[size_t(kind_)] = now_;
    kind_ = -1;
}

}  // namespace lb
