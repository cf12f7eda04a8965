// draft_error.hpp: the draft module throws the engine's lb::Error (error.hpp); this alias only keeps
// older includes compiling. api.cpp's separate `catch (const lb::DraftError &)` can go.
#pragma once

#include "error.hpp"

namespace lb {
using DraftError = Error;
}  // namespace lb
