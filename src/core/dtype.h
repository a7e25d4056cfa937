// Element types and their conversions to and from double (the reference executor's compute type).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace luminal {

enum class DType : uint8_t { F32, F16, BF16, I32, U8, Bool };  // U8 carries packed quantised weights

inline const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "?";
}

inline DType dtype_from_name(const std::string& n) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::U8, DType::Bool})
    if (n == dtype_name(d)) return d;
  throw std::invalid_argument("unknown dtype '" + n + "' (expected float32, float16, bfloat16, int32, uint8 or bool)");
}

inline size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: return 2;
    case DType::U8: case DType::Bool: return 1;
  }
  return 0;
}

inline bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

// IEEE half <-> float, round to nearest even.
inline uint16_t f32_to_f16(float f) {
  uint32_t x; std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));  // inf/nan
  if (mag >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: inf
  if (mag < 0x38800000u) {  // subnormal half (or zero)
    float a; std::memcpy(&a, &mag, 4);
    return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));  // 2^24 = 1 / smallest subnormal
  }
  uint32_t e = ((mag >> 23) - 112) << 10, m = (mag >> 13) & 0x3ffu;
  uint32_t h = e | m, rest = mag & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return uint16_t(sign | h);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float f;
  if (e == 0) {
    f = std::ldexp(float(m), -24);
    return sign ? -f : f;
  }
  uint32_t x = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x; std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

inline float bf16_to_f32(uint16_t b) {
  uint32_t x = uint32_t(b) << 16; float f; std::memcpy(&f, &x, 4); return f;
}

inline double load_as_double(const void* base, int64_t i, DType d) {
  switch (d) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
    case DType::Bool: return static_cast<const uint8_t*>(base)[i] ? 1.0 : 0.0;
  }
  return 0;
}

// Float results round through float32 first, as a float32 kernel would, then to the storage type.
inline void store_from_double(void* base, int64_t i, DType d, double v) {
  switch (d) {
    case DType::F32: static_cast<float*>(base)[i] = float(v); break;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(float(v)); break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(float(v)); break;
    case DType::I32: {
      // Truncate toward zero like a C cast; saturate instead of invoking undefined behaviour.
      double t = std::isnan(v) ? 0.0 : std::trunc(v);
      if (t > 2147483647.0) t = 2147483647.0;
      if (t < -2147483648.0) t = -2147483648.0;
      static_cast<int32_t*>(base)[i] = int32_t(t);
      break;
    }
    case DType::U8: {
      double t = std::isnan(v) ? 0.0 : std::trunc(v);  // wraps like a C cast of an in-range int
      static_cast<uint8_t*>(base)[i] = uint8_t(int64_t(t < -9e18 ? 0 : t > 9e18 ? 0 : t) & 0xff);
      break;
    }
    case DType::Bool: static_cast<uint8_t*>(base)[i] = v != 0.0; break;
  }
}

// The value a `d` element holds after storing `v` (constants are kept exactly as they will be read).
inline double round_to(DType d, double v) {
  uint32_t slot = 0;
  store_from_double(&slot, 0, d, v);
  return load_as_double(&slot, 0, d);
}

}  // namespace luminal
