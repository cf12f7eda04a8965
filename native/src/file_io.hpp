// file_io.hpp: opening and reading files with the engine's one-line LB_E_IO errors.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

namespace lb {

struct FileCloser {
    void operator()(std::FILE * f) const { if (f) std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Opens `path` for binary reading. Throws Error(LB_E_IO, "cannot open PATH: <fix>").
File open_binary(const std::string & path, const std::string & fix);

// The whole file (a config or an index: small). Throws Error(LB_E_IO) when missing or unreadable.
std::string read_text_file(const std::string & path, const std::string & fix);

// True when `path` is a regular file.
bool is_file(const std::string & path);

}  // namespace lb
