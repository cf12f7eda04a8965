// penalty_window.hpp: each sampled row's penalty window, as distinct (token, count) pairs.
//
// Row r's window is the last N tokens before the position it samples: the caller's history (the
// tokens before this call, lb_sampling.history), then this call's tokens on the row's path: a
// verify node's root path (its ancestors and itself, never its flat predecessors), or every token
// of the call up to the row (prefill, step). The device applies one factor per distinct token (the
// count scales the frequency penalty), so a row is kept as its distinct tokens, ascending, with
// their counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lb {

// This call's tokens: toks[0..n), and for a verify tree each node's parent (nullptr: a chain).
struct CallTokens {
    const int32_t * toks = nullptr;
    const int32_t * parents = nullptr;
    int32_t n = 0;
};

class PenaltyWindows {
public:
    // The windows of the call's last `rows` tokens, N = last_n (history: the last N - 1 are read).
    void build(const int32_t * history, int64_t n_history, const CallTokens & call, int32_t rows, int32_t last_n);

    int32_t size(int32_t row) const { return sizes_[size_t(row)]; }  // distinct tokens of the row
    const int32_t * tokens(int32_t row) const { return tokens_.data() + size_t(row) * size_t(width_); }
    const int32_t * counts(int32_t row) const { return counts_.data() + size_t(row) * size_t(width_); }

private:
    int32_t width_ = 0;  // N: the most distinct tokens a row can have
    std::vector<int32_t> window_, tokens_, counts_, sizes_;
};

}  // namespace lb
