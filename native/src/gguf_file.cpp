// gguf_file.cpp: see gguf_file.hpp. Uses ggml's gguf.h for the header, POSIX mmap for the data.
#include "gguf_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "error.hpp"
#include "gguf.h"

namespace lb {

namespace {

bool is_integer_type(gguf_type t) {
    switch (t) {
        case GGUF_TYPE_BOOL: case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
        case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
            return true;
        default:
            return false;
    }
}

}  // namespace

GgufFile::GgufFile(const std::string & path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY);
    if (fd_ < 0) {
        throw Error(LB_E_IO, "cannot open " + where() + ": " + std::strerror(errno) + "; check the path");
    }
    struct stat st {};
    check(fstat(fd_, &st) == 0 && S_ISREG(st.st_mode), LB_E_IO, where() + " is not a regular file");
    size_ = size_t(st.st_size);
    char magic[4] = {0, 0, 0, 0};
    check(pread(fd_, magic, 4, 0) == 4 && std::memcmp(magic, "GGUF", 4) == 0, LB_E_FORMAT,
          where() + " is not a GGUF file (no GGUF magic); pass a .gguf model converted by llama.cpp");

    gguf_init_params gp = {/*no_alloc=*/true, /*ctx=*/nullptr};
    gguf_.reset(gguf_init_from_file(path.c_str(), gp));
    check(gguf_ != nullptr, LB_E_FORMAT, where() + " has a corrupt or truncated GGUF header; re-download or re-convert it");

    // Every tensor's bytes must lie inside the file: a cut-off download fails here, not in a kernel.
    const size_t data_offset = gguf_get_data_offset(gguf_.get());
    for (int64_t i = 0; i < gguf_get_n_tensors(gguf_.get()); ++i) {
        const size_t end = data_offset + gguf_get_tensor_offset(gguf_.get(), i) + gguf_get_tensor_size(gguf_.get(), i);
        if (end > size_) {
            throw Error(LB_E_FORMAT, where() + " is truncated: tensor '" + gguf_get_tensor_name(gguf_.get(), i) +
                                         "' ends at byte " + std::to_string(end) + " but the file has " +
                                         std::to_string(size_) + " bytes; re-download it");
        }
    }
    map_ = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        throw Error(LB_E_IO, "cannot mmap " + where() + ": " + std::strerror(errno));
    }
}

GgufFile::~GgufFile() {
    if (map_ && owns_map_) munmap(map_, size_);
    if (fd_ >= 0) close(fd_);
}

void * GgufFile::adopt_map(size_t * size) {
    owns_map_ = false;
    *size = size_;
    return map_;
}

int64_t GgufFile::key_id(const std::string & key, bool required) const {
    const int64_t id = gguf_find_key(gguf_.get(), key.c_str());
    check(id >= 0 || !required, LB_E_FORMAT, where() + " lacks metadata key " + key + "; re-convert the model");
    return id;
}

bool GgufFile::has_key(const std::string & key) const { return key_id(key, false) >= 0; }

bool GgufFile::is_array(const std::string & key) const {
    const int64_t id = key_id(key, false);
    return id >= 0 && gguf_get_kv_type(gguf_.get(), id) == GGUF_TYPE_ARRAY;
}

std::string GgufFile::get_str(const std::string & key) const {
    const int64_t id = key_id(key, true);
    check(gguf_get_kv_type(gguf_.get(), id) == GGUF_TYPE_STRING, LB_E_FORMAT, where() + ": metadata " + key + " is not a string; re-convert the model");
    return gguf_get_val_str(gguf_.get(), id);
}

uint32_t GgufFile::get_u32(const std::string & key, bool required, uint32_t dflt) const {
    const int64_t id = key_id(key, required);
    if (id < 0) return dflt;
    int64_t v = -1;
    switch (gguf_get_kv_type(gguf_.get(), id)) {
        case GGUF_TYPE_UINT8:  v = gguf_get_val_u8(gguf_.get(), id); break;
        case GGUF_TYPE_INT8:   v = gguf_get_val_i8(gguf_.get(), id); break;
        case GGUF_TYPE_UINT16: v = gguf_get_val_u16(gguf_.get(), id); break;
        case GGUF_TYPE_INT16:  v = gguf_get_val_i16(gguf_.get(), id); break;
        case GGUF_TYPE_UINT32: v = gguf_get_val_u32(gguf_.get(), id); break;
        case GGUF_TYPE_INT32:  v = gguf_get_val_i32(gguf_.get(), id); break;
        case GGUF_TYPE_UINT64: v = int64_t(gguf_get_val_u64(gguf_.get(), id)); break;
        case GGUF_TYPE_INT64:  v = gguf_get_val_i64(gguf_.get(), id); break;
        case GGUF_TYPE_ARRAY: {
            // a per-layer array read as a scalar is only valid when every entry agrees
            const std::vector<int64_t> a = get_ints(key);
            check(!a.empty(), LB_E_FORMAT, where() + ": metadata " + key + " is an empty array; re-convert the model");
            for (int64_t x : a) check(x == a[0], LB_E_UNSUPPORTED, where() + ": per-layer " + key + " is not supported; re-convert the model with one value for all layers");
            v = a[0];
            break;
        }
        default:
            throw Error(LB_E_FORMAT, where() + ": metadata " + key + " is not an integer; re-convert the model");
    }
    check(v >= 0 && v <= int64_t(INT32_MAX), LB_E_FORMAT, where() + ": metadata " + key + " is out of range; re-convert the model");
    return uint32_t(v);
}

float GgufFile::get_f32(const std::string & key, bool required, float dflt) const {
    const int64_t id = key_id(key, required);
    if (id < 0) return dflt;
    double v = 0.0;
    switch (gguf_get_kv_type(gguf_.get(), id)) {
        case GGUF_TYPE_FLOAT32: v = gguf_get_val_f32(gguf_.get(), id); break;
        case GGUF_TYPE_FLOAT64: v = gguf_get_val_f64(gguf_.get(), id); break;
        default: throw Error(LB_E_FORMAT, where() + ": metadata " + key + " is not a float; re-convert the model");
    }
    // no model hyperparameter is legitimately inf or NaN (or beyond float range)
    check(std::isfinite(float(v)), LB_E_FORMAT,
          where() + ": metadata " + key + " is not a finite number; re-convert the model");
    return float(v);
}

std::vector<int64_t> GgufFile::get_ints(const std::string & key) const {
    const int64_t id = key_id(key, true);
    check(gguf_get_kv_type(gguf_.get(), id) == GGUF_TYPE_ARRAY, LB_E_FORMAT, where() + ": metadata " + key + " is not an array; re-convert the model");
    // the element type first: gguf_get_arr_data aborts on a string array
    const gguf_type t = gguf_get_arr_type(gguf_.get(), id);
    check(is_integer_type(t), LB_E_FORMAT,
          where() + ": metadata array " + key + " holds " + gguf_type_name(t) + " values, not integers; re-convert the model");
    const size_t n = gguf_get_arr_n(gguf_.get(), id);
    const void * data = gguf_get_arr_data(gguf_.get(), id);
    std::vector<int64_t> out(n);
    for (size_t i = 0; i < n; ++i) {
        switch (t) {
            case GGUF_TYPE_BOOL:   out[i] = ((const int8_t *) data)[i] != 0; break;
            case GGUF_TYPE_UINT8:  out[i] = ((const uint8_t *) data)[i]; break;
            case GGUF_TYPE_INT8:   out[i] = ((const int8_t *) data)[i]; break;
            case GGUF_TYPE_UINT16: out[i] = ((const uint16_t *) data)[i]; break;
            case GGUF_TYPE_INT16:  out[i] = ((const int16_t *) data)[i]; break;
            case GGUF_TYPE_UINT32: out[i] = ((const uint32_t *) data)[i]; break;
            case GGUF_TYPE_INT32:  out[i] = ((const int32_t *) data)[i]; break;
            case GGUF_TYPE_UINT64: out[i] = int64_t(((const uint64_t *) data)[i]); break;
            case GGUF_TYPE_INT64:  out[i] = ((const int64_t *) data)[i]; break;
            default: throw Error(LB_E_FORMAT, where() + ": metadata array " + key + " is not integer");
        }
    }
    return out;
}

int64_t GgufFile::find_tensor(const std::string & name) const { return gguf_find_tensor(gguf_.get(), name.c_str()); }

const int64_t * GgufFile::tensor_ne(int64_t id) const { return gguf_get_tensor_ne(gguf_.get(), id); }

ggml_type GgufFile::tensor_type(int64_t id) const { return gguf_get_tensor_type(gguf_.get(), id); }

const void * GgufFile::tensor_data(int64_t id) const {
    return (const char *) map_ + gguf_get_data_offset(gguf_.get()) + gguf_get_tensor_offset(gguf_.get(), id);
}

}  // namespace lb
