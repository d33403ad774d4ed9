/* bf16 / f16 <-> f32 conversions, round-to-nearest-even, NaN-preserving.
 * Header-only so the CPU kernels inline them; bit-exact with CUDA's
 * __float2bfloat16_rn / __float2half_rn and PyTorch's .to(). */
#ifndef MBD_HALF_H
#define MBD_HALF_H

#include <stdint.h>
#include <string.h>

static inline float mbd_bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t mbd_f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float mbd_bf16_to_f32(uint16_t h) { return mbd_bits_to_f32((uint32_t)h << 16); }

static inline uint16_t mbd_f32_to_bf16(float f) {
  uint32_t u = mbd_f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float mbd_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  return mbd_bits_to_f32(u);
}

static inline uint16_t mbd_f32_to_f16(float f) {
  uint32_t u = mbd_f32_to_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);        /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);       /* overflow -> inf (RNE) */
  if (a < 0x38800000u) {                                          /* subnormal or zero */
    if (a < 0x33000000u) return (uint16_t)sign;                   /* < half of min subnormal */
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

#endif
