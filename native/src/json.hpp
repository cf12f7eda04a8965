// json.hpp: a small strict JSON reader (RFC 8259) for config.json and safetensors headers.
// No third-party JSON library is available to the build, and we only ever read small documents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lb::json {

enum class Type { null, boolean, number, string, array, object };

struct Value {
    Type type = Type::null;
    bool boolean = false;
    double number = 0.0;
    bool is_integer = false;   // number written without fraction/exponent and fits int64
    int64_t integer = 0;       // valid when is_integer
    std::string string;
    std::vector<Value> array;
    std::vector<std::pair<std::string, Value>> object;  // file order; duplicate keys: last wins in find()

    bool is_null() const { return type == Type::null; }
    bool is_object() const { return type == Type::object; }
    bool is_array() const { return type == Type::array; }
    bool is_string() const { return type == Type::string; }
    bool is_number() const { return type == Type::number; }
    bool is_bool() const { return type == Type::boolean; }

    // Member `key` of an object, or nullptr when absent or when this is not an object.
    const Value * find(const std::string & key) const;
};

// Parses one JSON document (surrounding whitespace allowed). Throws std::runtime_error with the
// byte offset of the first problem.
Value parse(const char * data, size_t size);

// Human-readable name of a type, for error messages ("an integer", "a string", ...).
const char * type_name(const Value & v);

}  // namespace lb::json
