// sample_draw.cpp: see sample_draw.hpp. Every floating-point step below mirrors one line of
// lucebox/sampling.py `_draw_candidates`; CMakeLists.txt compiles this file with -ffp-contract=off
// so no multiply-add is fused where Python rounds twice.
#include "sample_draw.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "error.hpp"

namespace lb {

namespace {

uint64_t mix64(uint64_t z) {  // SplitMix64's finaliser: a bijection with good avalanche
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void check_arg(bool ok, const std::string & message) { check(ok, LB_E_INVALID_ARG, message); }

// The rank of the drawn candidate among vals[0..n) (best first), or -1 when the trusted prefix
// (candidates strictly better than the last, which a tie may hide behind) does not decide it.
int32_t drawn_rank(const double * vals, int32_t n, double lse, const lb_sampling & s, double u,
                   std::vector<double> & cum) {
    const double last = vals[n - 1];
    if (s.temperature == 0.0) return vals[0] > last ? 0 : -1;  // greedy on l': the best, lowest id among equals
    int32_t limit = -1;  // length of the kept prefix; -1 = not bounded yet (the whole vocabulary)
    int32_t kept = 0;
    if (s.top_k > 0) {
        if (s.top_k >= n || !(vals[s.top_k - 1] > last)) return -1;
        limit = kept = s.top_k;
    } else {
        kept = n - 1;
        while (kept > 0 && !(vals[kept - 1] > last)) --kept;
    }
    // p_j = exp((v_j - v_0) / T - lse) over the kept prefix, then their running sums
    const double v0 = vals[0], temp = s.temperature;
    cum.resize(size_t(kept));
    double total = 0.0;
    for (int32_t j = 0; j < kept; ++j) {
        cum[size_t(j)] = std::exp((vals[j] - v0) / temp - lse);
        total += cum[size_t(j)];
    }
    if (limit >= 0) {  // top-p and the draw see the top-k renormalised
        if (!(total > 0.0)) return -1;  // all underflowed: only with an lse no device returns
        for (double & p : cum) p /= total;
    }
    for (int32_t j = 1; j < kept; ++j) cum[size_t(j)] += cum[size_t(j - 1)];
    if (s.top_p < 1.0) {  // the smallest prefix with mass >= top_p
        int32_t reach = int32_t(std::lower_bound(cum.begin(), cum.end(), s.top_p) - cum.begin()) + 1;
        if (reach > kept) {
            if (limit < 0) return -1;
            reach = kept;
        }
        limit = reach;
    }
    if (s.min_p > 0.0) {  // p_j >= min_p * p_0
        const double log_min_p = std::log(s.min_p);
        int32_t passing = 0;
        for (int32_t j = 0; j < kept; ++j) passing += (vals[j] - v0) / temp >= log_min_p ? 1 : 0;
        if (limit < 0 && passing == kept) return -1;  // the next token might pass too
        limit = limit < 0 ? passing : std::min(limit, passing);
    }
    if (limit < 0) {  // no filter: the draw runs over the whole vocabulary, candidates first
        const int32_t i = int32_t(std::upper_bound(cum.begin(), cum.end(), u) - cum.begin());
        return i < kept ? i : -1;
    }
    const double target = u * cum[size_t(limit - 1)];
    const int32_t i = int32_t(std::upper_bound(cum.begin(), cum.begin() + limit, target) - cum.begin());
    return std::min(i, limit - 1);
}

}  // namespace

double sample_uniform(uint64_t seed, int64_t position) {
    const uint64_t key = mix64(seed ^ 0x5851F42D4C957F2Dull);
    const uint64_t z = mix64(key + (uint64_t(position) + 1) * 0x9E3779B97F4A7C15ull);
    return double(z >> 11) * (1.0 / 9007199254740992.0);  // 53 bits / 2^53
}

void check_draw(const lb_sampling & s, int64_t rows) {
    check_arg(std::isfinite(s.temperature) && s.temperature >= 0.0,
              "lb_sampling.temperature = " + std::to_string(s.temperature) + " must be finite and >= 0 (0: greedy)");
    check_arg(s.top_k >= 0, "lb_sampling.top_k = " + std::to_string(s.top_k) + " must be >= 0 (0: off)");
    check_arg(s.top_p > 0.0 && s.top_p <= 1.0,
              "lb_sampling.top_p = " + std::to_string(s.top_p) + " must be in (0, 1] (1: off)");
    check_arg(s.min_p >= 0.0 && s.min_p <= 1.0,
              "lb_sampling.min_p = " + std::to_string(s.min_p) + " must be in [0, 1] (0: off)");
    check_arg(s.n_candidates >= 1, "lb_sampling.n_candidates = " + std::to_string(s.n_candidates) + " must be >= 1");
    check_arg(s.cand_ids && s.cand_logits && s.row_max && s.row_lse && s.drawn && s.uniforms,
              "lb_sampling: cand_ids, cand_logits, row_max, row_lse, drawn and uniforms must not be NULL");
    check_arg(rows <= s.rows_cap, "lb_sampling.rows_cap = " + std::to_string(s.rows_cap) + " but this call has " +
                                      std::to_string(rows) + " rows");
}

void Drawer::draw(const lb_sampling & s, int32_t rows, const int64_t * positions) {
    const int32_t n = s.n_candidates;
    order_.resize(size_t(n));
    vals_.resize(size_t(n));
    for (int32_t r = 0; r < rows; ++r) {
        const double u = sample_uniform(s.seed, positions[r]);
        s.uniforms[r] = u;
        s.drawn[r] = draw_row(s.cand_ids + size_t(r) * size_t(n), s.cand_logits + size_t(r) * size_t(n), n,
                              double(s.row_lse[r]), s, u);
    }
}

// One row: its candidates best first (ties by token id), then the draw on them.
int32_t Drawer::draw_row(const int32_t * ids, const float * logits, int32_t n, double lse, const lb_sampling & s,
                         double u) {
    // a non-finite value (a broken model) would break the order and the sums: the whole row decides
    if (!std::isfinite(lse)) return -1;
    for (int32_t j = 0; j < n; ++j) {
        if (!std::isfinite(logits[j])) return -1;
    }
    std::iota(order_.begin(), order_.end(), 0);
    std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && ids[a] < ids[b]);
    });
    for (int32_t j = 0; j < n; ++j) vals_[size_t(j)] = double(logits[order_[size_t(j)]]);
    const int32_t rank = drawn_rank(vals_.data(), n, lse, s, u, cum_);
    return rank < 0 ? -1 : ids[order_[size_t(rank)]];
}

}  // namespace lb
