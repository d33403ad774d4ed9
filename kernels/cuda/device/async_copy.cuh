/* Shared-memory mbarriers (the GEMM family's rings, device/gemm_kernels.cu,
 * and the persistent decode's, decode_persistent.cu) and the 1D bulk copies
 * of the copy engine (sm_90) that the persistent decode streams its slices
 * with. Addresses are shared-window (u32). */
#ifndef MBD_ASYNC_COPY_CUH
#define MBD_ASYNC_COPY_CUH

#include <stdint.h>

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  do {
    asm volatile(
        "{\n.reg .pred q;\nmbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2, %3;\n"
        "selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity), "r"(0x989680u) /* suspend up to 10 ms: sleep, don't poll */
        : "memory");
  } while (!ok);
}
/* bytes (a multiple of 16, both addresses 16-byte aligned) from global to
 * shared memory; completion is counted in bytes on the mbarrier. */
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

#endif
