// json.cpp: nlohmann/json's parser, its exceptions turned into one-line std::runtime_errors.
#include "json.hpp"

#include <limits>
#include <stdexcept>

namespace lb::json {

namespace {

// Deep nesting only comes from hostile files; bound it so a crafted header cannot build a
// million-level tree (nlohmann parses iteratively, but the tree would still take the memory).
constexpr int kMaxDepth = 128;

// nlohmann's what() reads "[json.exception.parse_error.101] parse error at line 1, column 5: <problem>;
// last read: '<the file's bytes>'": keep the problem only. The byte offset locates it, and the file's
// bytes (any bytes, possibly not UTF-8) have no place in a one-line message.
std::string problem_of(const nlohmann::json::exception & e) {
    std::string what = e.what();
    const size_t colon = what.find(": ");
    if (colon != std::string::npos) what.erase(0, colon + 2);
    const size_t quote = what.find("; last read: ");
    if (quote != std::string::npos) what.erase(quote);
    return what;
}

}  // namespace

Value parse(const char * data, size_t size) {
    const auto bound_depth = [](int depth, nlohmann::json::parse_event_t event, Value &) {
        if ((event == nlohmann::json::parse_event_t::object_start ||
             event == nlohmann::json::parse_event_t::array_start) && depth > kMaxDepth) {
            throw std::runtime_error("nesting deeper than " + std::to_string(kMaxDepth));
        }
        return true;
    };
    try {
        return Value::parse(data, data + size, bound_depth);
    } catch (const nlohmann::json::parse_error & e) {
        throw std::runtime_error("invalid JSON at byte " + std::to_string(e.byte) + ": " + problem_of(e));
    } catch (const nlohmann::json::exception & e) {
        throw std::runtime_error("invalid JSON: " + problem_of(e));
    } catch (const std::runtime_error & e) {
        throw std::runtime_error(std::string("invalid JSON: ") + e.what());
    }
}

const Value * find(const Value & v, const std::string & key) {
    if (!v.is_object()) return nullptr;
    const auto it = v.find(key);
    return it == v.end() ? nullptr : &*it;
}

std::optional<int64_t> as_integer(const Value & v) {
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
        return int64_t(u);
    }
    if (v.is_number_integer()) return v.get<int64_t>();
    return std::nullopt;
}

const char * type_name(const Value & v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "a boolean";
    if (v.is_number()) return as_integer(v) ? "an integer" : "a number";
    if (v.is_string()) return "a string";
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    return "?";
}

}  // namespace lb::json
