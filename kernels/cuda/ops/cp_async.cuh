/* The ops' global -> shared copies that bypass registers (cp.async, sm_80+):
 * a kernel issues a tile's copies, commits them as a group, and waits for
 * the group before the barrier that makes the tile visible, so the next
 * tile's loads are in flight while this one computes. */
#ifndef MBD_OPS_CP_ASYNC_CUH
#define MBD_OPS_CP_ASYNC_CUH

/* 16 bytes, both addresses 16-byte aligned; cached in L2 only. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
/* 4 bytes, both addresses 4-byte aligned. */
__device__ __forceinline__ void cp_async4(void *dst, const void *src) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Waits until at most NP of this thread's committed groups are pending. */
template <int NP>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(NP) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

#endif
