// error.hpp: the engine's one exception type. It carries an LB_E_* status so the C boundary
// (api.cpp) can return it unchanged; the message is the one-line text lb_last_error() shows.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "lucebox.h"

namespace lb {

struct Error : std::runtime_error {
    int32_t status;  // LB_E_*
    Error(int32_t status_, const std::string & message) : std::runtime_error(message), status(status_) {}
};

// Throws Error(status, message) unless ok. Keeps argument checks to one line each.
inline void check(bool ok, int32_t status, const std::string & message) {
    if (!ok) throw Error(status, message);
}

}  // namespace lb
