// json.cpp: recursive-descent JSON parser. Strict: no comments, no trailing commas, no NaN.
#include "json.hpp"

#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace lb::json {

namespace {

// Deep nesting only comes from hostile files; bound it so recursion cannot exhaust the stack.
constexpr int kMaxDepth = 128;

class Parser {
public:
    Parser(const char * data, size_t size) : p_(data), begin_(data), end_(data + size) {}

    Value document() {
        skip_ws();
        Value v = value(0);
        skip_ws();
        if (p_ != end_) fail("unexpected data after the JSON value");
        return v;
    }

private:
    const char * p_;
    const char * begin_;
    const char * end_;

    [[noreturn]] void fail(const std::string & what) const {
        throw std::runtime_error("invalid JSON at byte " + std::to_string(p_ - begin_) + ": " + what);
    }

    void skip_ws() {
        while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
    }

    bool consume(const char * word) {
        const char * q = p_;
        for (; *word; ++word, ++q) {
            if (q >= end_ || *q != *word) return false;
        }
        p_ = q;
        return true;
    }

    Value value(int depth) {
        if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
        if (p_ >= end_) fail("unexpected end of input");
        Value v;
        switch (*p_) {
            case '{': object(v, depth); break;
            case '[': array(v, depth); break;
            case '"': v.type = Type::string; v.string = string(); break;
            case 't': if (!consume("true")) fail("bad literal"); v.type = Type::boolean; v.boolean = true; break;
            case 'f': if (!consume("false")) fail("bad literal"); v.type = Type::boolean; v.boolean = false; break;
            case 'n': if (!consume("null")) fail("bad literal"); break;
            default: number(v); break;
        }
        return v;
    }

    void object(Value & v, int depth) {
        v.type = Type::object;
        ++p_;  // '{'
        skip_ws();
        if (p_ < end_ && *p_ == '}') { ++p_; return; }
        for (;;) {
            skip_ws();
            if (p_ >= end_ || *p_ != '"') fail("expected a string key");
            std::string key = string();
            skip_ws();
            if (p_ >= end_ || *p_ != ':') fail("expected ':'");
            ++p_;
            skip_ws();
            v.object.emplace_back(std::move(key), value(depth + 1));
            skip_ws();
            if (p_ < end_ && *p_ == ',') { ++p_; continue; }
            if (p_ < end_ && *p_ == '}') { ++p_; return; }
            fail("expected ',' or '}'");
        }
    }

    void array(Value & v, int depth) {
        v.type = Type::array;
        ++p_;  // '['
        skip_ws();
        if (p_ < end_ && *p_ == ']') { ++p_; return; }
        for (;;) {
            skip_ws();
            v.array.push_back(value(depth + 1));
            skip_ws();
            if (p_ < end_ && *p_ == ',') { ++p_; continue; }
            if (p_ < end_ && *p_ == ']') { ++p_; return; }
            fail("expected ',' or ']'");
        }
    }

    unsigned hex4() {
        if (end_ - p_ < 4) fail("truncated \\u escape");
        unsigned cp = 0;
        for (int i = 0; i < 4; ++i, ++p_) {
            const char c = *p_;
            cp <<= 4;
            if (c >= '0' && c <= '9') cp |= unsigned(c - '0');
            else if (c >= 'a' && c <= 'f') cp |= unsigned(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F') cp |= unsigned(c - 'A' + 10);
            else fail("bad hex digit in \\u escape");
        }
        return cp;
    }

    static void put_utf8(std::string & out, unsigned cp) {
        if (cp < 0x80) {
            out += char(cp);
        } else if (cp < 0x800) {
            out += char(0xC0 | (cp >> 6));
            out += char(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += char(0xE0 | (cp >> 12));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        } else {
            out += char(0xF0 | (cp >> 18));
            out += char(0x80 | ((cp >> 12) & 0x3F));
            out += char(0x80 | ((cp >> 6) & 0x3F));
            out += char(0x80 | (cp & 0x3F));
        }
    }

    std::string string() {
        ++p_;  // opening quote
        std::string out;
        for (;;) {
            if (p_ >= end_) fail("unterminated string");
            const char c = *p_++;
            if (c == '"') return out;
            if ((unsigned char) c < 0x20) fail("control character in string");
            if (c != '\\') { out += c; continue; }
            if (p_ >= end_) fail("unterminated escape");
            const char e = *p_++;
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
                        if (!consume("\\u")) fail("unpaired surrogate");
                        const unsigned lo = hex4();
                        if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp < 0xE000) {
                        fail("unpaired surrogate");
                    }
                    put_utf8(out, cp);
                    break;
                }
                default: fail("bad escape");
            }
        }
    }

    void number(Value & v) {
        const char * start = p_;
        bool integral = true;
        if (p_ < end_ && *p_ == '-') ++p_;
        if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) fail("expected a value");
        if (*p_ == '0') {
            ++p_;
        } else {
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        }
        if (p_ < end_ && *p_ == '.') {
            integral = false;
            ++p_;
            if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) fail("expected digits after '.'");
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        }
        if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
            integral = false;
            ++p_;
            if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
            if (p_ >= end_ || !(*p_ >= '0' && *p_ <= '9')) fail("expected exponent digits");
            while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
        }
        // strtod/strtoll need a terminated copy: the input buffer is not NUL-terminated.
        const std::string text(start, p_);
        v.type = Type::number;
        v.number = std::strtod(text.c_str(), nullptr);
        if (integral) {
            errno = 0;
            const long long i = std::strtoll(text.c_str(), nullptr, 10);
            if (errno == 0) {
                v.is_integer = true;
                v.integer = i;
            }
        }
    }
};

}  // namespace

const Value * Value::find(const std::string & key) const {
    if (type != Type::object) return nullptr;
    const Value * found = nullptr;
    for (const auto & kv : object) {
        if (kv.first == key) found = &kv.second;
    }
    return found;
}

Value parse(const char * data, size_t size) {
    return Parser(data, size).document();
}

const char * type_name(const Value & v) {
    switch (v.type) {
        case Type::null: return "null";
        case Type::boolean: return "a boolean";
        case Type::number: return v.is_integer ? "an integer" : "a number";
        case Type::string: return "a string";
        case Type::array: return "an array";
        case Type::object: return "an object";
    }
    return "?";
}

}  // namespace lb::json
