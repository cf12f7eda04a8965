// memory_plan.hpp: lb_memory_plan, what lb_load would hold at most, computed from the layouts and
// graph builders the engine itself uses (caches.cpp, target_graph.cpp, commit_graph.cpp, the draft)
// with no memory placed: tensors are laid out, then every graph is sized by ggml's allocator.
#pragma once

#include "lucebox.h"

namespace lb {

// Throws lb::Error as lb_load would for the same params (bad values, files, shapes, device).
lb_memory plan_memory(const lb_params & p, const lb_plan_shape & s);

}  // namespace lb
