// file_io.cpp: see file_io.hpp.
#include "file_io.hpp"

#include <sys/stat.h>

#include "error.hpp"

namespace lb {

File open_binary(const std::string & path, const std::string & fix) {
    File f(std::fopen(path.c_str(), "rb"));
    if (!f) throw Error(LB_E_IO, "cannot open " + path + ": " + fix);
    return f;
}

std::string read_text_file(const std::string & path, const std::string & fix) {
    File f = open_binary(path, fix);
    std::string text;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) text.append(buf, n);
    if (std::ferror(f.get())) throw Error(LB_E_IO, "cannot read " + path);
    return text;
}

bool is_file(const std::string & path) {
    struct stat st{};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace lb
