// sample_draw.hpp: the host draw of the sampled calls (lb_sampling's drawn / uniforms, lb_sampling_draw).
//
// After a sampled forward has read back each row's C candidates (unordered), their processed
// logits l' and the row's log-normaliser lse, the token at the row's position q is drawn here with
// the uniform u(seed, q). This is lucebox/sampling.py's `draw` on the candidates (the reference the
// tests hold it to, token for token): the same order (l' best first, ties by token id), the same
// float64 operations in the same order, and the same exp and log (libm's, which Python's math.exp
// and math.log call too; numpy's own SIMD exp differs from it in the last bit of ~5% of values).
// When the candidates strictly better than the C-th (the trusted ones) do not decide the draw, the
// row's answer is -1 and the caller finishes it on the whole processed row (lb_processed_row).
#pragma once

#include <cstdint>
#include <vector>

#include "lucebox.h"

namespace lb {

// The draw's uniform in [0, 1) for (seed, position): SplitMix64's finaliser over a counter, 53
// random bits (lucebox/sampling.py `uniform` is the same function).
double sample_uniform(uint64_t seed, int64_t position);

// Throws lb::Error (LB_E_INVALID_ARG) unless s's draw settings and the buffers the draw reads and
// writes are valid for `rows` rows.
void check_draw(const lb_sampling & s, int64_t rows);

// Draws rows [0, rows) of s's candidates: drawn[r] = the token at position positions[r] (or -1:
// see above), uniforms[r] = its uniform. Scratch is kept between calls.
class Drawer {
public:
    void draw(const lb_sampling & s, int32_t rows, const int64_t * positions);

private:
    std::vector<int32_t> order_;
    std::vector<double> vals_, cum_;
    int32_t draw_row(const int32_t * ids, const float * logits, int32_t n, double lse, const lb_sampling & s,
                     double u);
};

}  // namespace lb
