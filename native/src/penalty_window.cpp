// penalty_window.cpp: see penalty_window.hpp.
#include "penalty_window.hpp"

#include <algorithm>

namespace lb {

void PenaltyWindows::build(const int32_t * history, int64_t n_history, const CallTokens & call, int32_t rows,
                           int32_t last_n) {
    width_ = last_n;
    tokens_.resize(size_t(rows) * size_t(last_n));
    counts_.resize(tokens_.size());
    sizes_.assign(size_t(rows), 0);
    const size_t width = size_t(last_n);
    for (int32_t r = 0; r < rows; ++r) {
        // newest first: the row's own token, its path back to the call's first token, then history
        window_.clear();
        int32_t i = call.n - rows + r;
        while (i >= 0 && window_.size() < width) {
            window_.push_back(call.toks[i]);
            i = call.parents ? call.parents[i] : i - 1;
        }
        for (int64_t h = n_history - 1; h >= 0 && window_.size() < width; --h) window_.push_back(history[h]);
        std::sort(window_.begin(), window_.end());
        int32_t * tok = tokens_.data() + size_t(r) * width;
        int32_t * cnt = counts_.data() + size_t(r) * width;
        int32_t k = 0;
        for (size_t j = 0; j < window_.size(); ++j) {
            if (k > 0 && tok[k - 1] == window_[j]) {
                ++cnt[k - 1];
            } else {
                tok[k] = window_[j];
                cnt[k++] = 1;
            }
        }
        sizes_[size_t(r)] = k;
    }
}

}  // namespace lb
