// json.hpp: config.json and safetensors headers through nlohmann/json (from the pinned sdist), with
// the engine's conventions on top: a bounded nesting depth, one-line errors, int64-only integers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lb::json {

using Value = nlohmann::json;

// Parses one JSON document (RFC 8259: no comments, no NaN, UTF-8). Throws std::runtime_error
// "invalid JSON at byte N: <problem>" (one line) on any syntax error or nesting past a sane depth.
Value parse(const char * data, size_t size);

// Member `key` of an object, or nullptr when absent or when `v` is not an object.
const Value * find(const Value & v, const std::string & key);

// The value as an int64 when it was written as an integer that fits one; nullopt otherwise
// (fractions, exponents, integers past int64, other types).
std::optional<int64_t> as_integer(const Value & v);

// Type name for error messages: "an integer", "a number", "a string", ...
const char * type_name(const Value & v);

}  // namespace lb::json
