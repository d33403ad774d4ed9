/* What the Mamba-2 scans share (ssd_chunk.cu, ssd_prefill.cu, ssd_scan.cu):
 * a step's dt and dA, small shared-memory reads, how a state entry is
 * stored between launches and rounded after each step, the device's SM
 * count, and the environment's measurement knobs. */
#ifndef MBD_OPS_SSD_COMMON_CUH
#define MBD_OPS_SSD_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/mops_arith.cuh"

/* A step's dt from its raw value and the head's dt_bias, clamped to [lo,
 * hi], and dA = exp(dt A): the CPU step's roundings (kernels/cpu/ssd_step.c). */
__device__ __forceinline__ float ssd_dt(float raw, float bias, float lo, float hi) {
  float dt = mbd_pm_softplus(__fadd_rn(raw, bias));
  if (dt < lo) dt = lo;
  if (dt > hi) dt = hi;
  return dt;
}
__device__ __forceinline__ float ssd_da(float dt, float a) { return mbd_pm_expf(__fmul_rn(dt, a)); }

/* R consecutive floats from shared memory (aligned to min(R, 4) floats). */
template <int R>
__device__ __forceinline__ void ssd_ldr(float (&v)[R], const float *p) {
  if constexpr (R == 8) {
    const float4 q = *(const float4 *)p, u = *(const float4 *)(p + 4);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w, v[4] = u.x, v[5] = u.y, v[6] = u.z, v[7] = u.w;
  } else if constexpr (R == 4) {
    const float4 q = *(const float4 *)p;
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else if constexpr (R == 2) {
    const float2 q = *(const float2 *)p;
    v[0] = q.x, v[1] = q.y;
  } else {
    v[0] = p[0];
  }
}

/* How the state is stored between launches (float or bf16): round is the
 * value kept after a step; load and store move NL entries (NL a multiple
 * of 16 bytes' entries when vec: p then 16-byte aligned). */
template <typename ST>
struct ssd_slot;
template <>
struct ssd_slot<float> {
  static __device__ __forceinline__ float round(float v) { return v; }
  template <int NL>
  static __device__ __forceinline__ void load(float (&st)[NL], const float *p, bool vec) {
    if (vec && NL % 4 == 0) {
#pragma unroll
      for (int i = 0; i < NL; i += 4) {
        const float4 v = *(const float4 *)(p + i);
        st[i] = v.x, st[i + 1] = v.y, st[i + 2] = v.z, st[i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < NL; i++) st[i] = p[i];
    }
  }
  template <int NL>
  static __device__ __forceinline__ void store(float *p, const float (&st)[NL], bool vec) {
    if (vec && NL % 4 == 0) {
#pragma unroll
      for (int i = 0; i < NL; i += 4)
        *(float4 *)(p + i) = make_float4(st[i], st[i + 1], st[i + 2], st[i + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < NL; i++) p[i] = st[i];
    }
  }
};
template <>
struct ssd_slot<__nv_bfloat16> {
  /* Rounded to bf16, as stored, in one conversion to nearest even:
   * cvt.rn.bf16x2.f32 of (v, 0) puts bf16(v) in the upper half over a zero
   * lower half, which is bf16(v) widened to f32, so no unpacking follows
   * (the step's per-entry path is bound by issued instructions). */
  static __device__ __forceinline__ float round(float v) {
    uint32_t u;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(v), "f"(0.0f));
    return __uint_as_float(u);
  }
  template <int NL>
  static __device__ __forceinline__ void load(float (&st)[NL], const __nv_bfloat16 *p, bool vec) {
    if (vec && NL % 8 == 0) {
#pragma unroll
      for (int i = 0; i < NL; i += 8) {
        const uint4 v = *(const uint4 *)(p + i);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
          st[i + 2 * q] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[q] & 0xffffu)));
          st[i + 2 * q + 1] = __bfloat162float(__ushort_as_bfloat16((unsigned short)(w[q] >> 16)));
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < NL; i++) st[i] = __bfloat162float(p[i]);
    }
  }
  /* exact: the values are rounded already */
  template <int NL>
  static __device__ __forceinline__ void store(__nv_bfloat16 *p, const float (&st)[NL],
                                               bool vec) {
    if (vec && NL % 8 == 0) {
#pragma unroll
      for (int i = 0; i < NL; i += 8) {
        unsigned w[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
          w[q] = (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(st[i + 2 * q])) |
                 (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(st[i + 2 * q + 1])) << 16;
        *(uint4 *)(p + i) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < NL; i++) p[i] = __float2bfloat16_rn(st[i]);
    }
  }
};

/* The device's SM count, read once (132 where it cannot be read). */
static inline int ssd_sms(void) {
  static int sms;
  if (!sms) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;
    sms = v;
  }
  return sms;
}

/* MBD_SSD, read at each launch (so that a bench compares in one process):
 * measurement knobs of the launch shape (ssd_chunk.cu, ssd_prefill.cu,
 * ssd_scan.cu say which). Same bits whatever it says. */
static inline bool ssd_env_is(const char *v) {
  const char *e = getenv("MBD_SSD");
  return e && strcmp(e, v) == 0;
}

#endif
