/* Numeric route identity: everything that can change the bits a worker returns.
 *
 * The canonical encoding is a versioned, line-oriented text with a fixed key
 * order ("mambad-route/3\nbackend=cuda\n..."), so it is stable across builds
 * and readable in `mambad status --full`; SHA-256 of it is the route id.
 * docs/route.md explains each field. */
#ifndef MBD_ROUTE_H
#define MBD_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum mbd_gemm_mode {
  MBD_GEMM_DETERMINISTIC = 0, /* project kernels only; cuBLAS never called */
  MBD_GEMM_CUBLAS_FAST = 1,   /* TF32 tensor-op math, CUBLAS_COMPUTE_32F */
  MBD_GEMM_CUBLAS_PEDANTIC = 2,
} mbd_gemm_mode;

/* Storage dtype policy of weights/activations in GEMMs. */
typedef enum mbd_dtype_policy {
  MBD_POLICY_F32 = 0,  /* exact: one FMA per K step, ascending K */
  MBD_POLICY_TF32 = 1, /* inputs rounded once to TF32, fixed order */
  MBD_POLICY_BF16 = 2, /* bf16 storage, f32 accumulation */
  MBD_POLICY_F16 = 3,  /* f16 storage, f32 accumulation */
} mbd_dtype_policy;

typedef enum mbd_family { MBD_FAMILY_INFERENCE = 0, MBD_FAMILY_TRIAD = 1 } mbd_family;
typedef enum mbd_backend_kind { MBD_BACKEND_CPU = 0, MBD_BACKEND_CUDA = 1 } mbd_backend_kind;

/* Which kernels a decode step may run. */
typedef enum mbd_decode_path {
  MBD_DECODE_PER_OP = 0,      /* one launch per op at every batch size (the CPU's only path) */
  MBD_DECODE_PERSISTENT = 1,  /* CUDA: small batches run every layer in one persistent launch
                                 where it fits (kernels/cuda/decode_persistent.h) */
} mbd_decode_path;

/* Storage dtype of the recurrent state in a model's state slots. The
 * arithmetic stays f32; bf16 rounds each updated state entry once (the
 * state contract of docs/route.md, "Mamba-2 with a bf16 state" and "Mamba-1
 * with a bf16 state"). */
typedef enum mbd_state_dtype {
  MBD_STATE_F32 = 0,  /* f32 state (the default; every backend and family) */
  MBD_STATE_BF16 = 1, /* bf16 SSM state: Mamba-1 and Mamba-2 on CUDA only */
} mbd_state_dtype;

#define MBD_ROUTE_FORMAT_VERSION 3

typedef struct mbd_route_identity {
  mbd_gemm_mode mode;
  mbd_dtype_policy policy;
  mbd_state_dtype state;  /* storage dtype of the recurrent state */
  mbd_family family;
  mbd_backend_kind backend;
  char isa[32];           /* CPU: ISA level the kernels use ("x86-64-v3"); CUDA: "sm_90a" */
  char kernel_digest[65]; /* hex SHA-256 of the kernel machine code actually loaded */
  char compiler[64];      /* compiler identity that built the kernels */
  char device_name[96];   /* "NVIDIA H200"; "cpu" for the CPU backend */
  int cc_major, cc_minor; /* compute capability; 0.0 on CPU */
  int sm_count;           /* multiprocessors; 0 on CPU */
  char libraries[64];     /* bit-relevant library versions ("cublas 13.0.0"); "" in deterministic mode */
  int dispatch_rev;       /* revision of the tile/dispatch policy */
  mbd_decode_path decode; /* which decode kernels may run */
  int64_t state_capacity; /* session state slots the context is sized for */
} mbd_route_identity;

/* Mode / policy / family / backend / decode path names and parsers. Parsers reject unknown or
 * non-UTF-8 strings with MBD_E_INVALID naming every valid value. */
const char *mbd_gemm_mode_name(mbd_gemm_mode m);
int mbd_gemm_mode_parse(const char *s, mbd_gemm_mode *out, mbd_error *err);
/* The GEMM mode a program runs: `flag` (the command line's value, NULL when
 * not given) wins, else the environment's MBD_GEMM_MODE when set and non-empty,
 * else deterministic. An invalid value is MBD_E_INVALID naming where it came
 * from and the three valid modes. Every program that takes --gemm-mode uses it. */
int mbd_gemm_mode_resolve(const char *flag, mbd_gemm_mode *out, mbd_error *err);
const char *mbd_dtype_policy_name(mbd_dtype_policy p);
int mbd_dtype_policy_parse(const char *s, mbd_dtype_policy *out, mbd_error *err);
const char *mbd_family_name(mbd_family f);
int mbd_family_parse(const char *s, mbd_family *out, mbd_error *err);
const char *mbd_backend_name(mbd_backend_kind b);
int mbd_backend_parse(const char *s, mbd_backend_kind *out, mbd_error *err);
const char *mbd_decode_path_name(mbd_decode_path d);
int mbd_decode_path_parse(const char *s, mbd_decode_path *out, mbd_error *err);
const char *mbd_state_dtype_name(mbd_state_dtype d);
int mbd_state_dtype_parse(const char *s, mbd_state_dtype *out, mbd_error *err);
/* Where state dtype d is served, for refusals ("Mamba-1 and Mamba-2 on CUDA
 * only"): the one wording; the families' GPU table (kernels/cuda/gpu_family.h
 * state_dtypes) holds the capability itself. */
const char *mbd_state_dtype_where(mbd_state_dtype d);

/* Canonical encoding into buf (NUL-terminated); *len excludes the NUL.
 * MBD_E_TOO_LARGE when cap is too small (1 KiB always suffices). */
int mbd_route_encode(const mbd_route_identity *r, char *buf, size_t cap, size_t *len,
                     mbd_error *err);
/* Parses a canonical encoding back (for the broker and status). */
int mbd_route_decode(const char *buf, size_t len, mbd_route_identity *out, mbd_error *err);
/* Route id = SHA-256 of the canonical encoding, as 64 lower-case hex chars. */
void mbd_route_id_hex(const mbd_route_identity *r, char out[65]);

/* What a request asks for: an exact id, or constraints. Empty string / -1 = any. */
typedef struct mbd_route_want {
  char route_id[65];    /* exact id or prefix of >= 8 hex chars; "" = any */
  char backend[8];      /* "cpu" | "cuda" | "" */
  char gemm_mode[24];   /* "deterministic" | "cublas-fast" | "cublas-pedantic" | "" */
  char dtype[8];        /* "f32" | "tf32" | "bf16" | "f16" | "" */
  char state[8];        /* state storage dtype: "f32" | "bf16" | "" */
  char family[12];      /* "inference" | "triad" | "" */
  char device_name[96]; /* exact device name or "" */
} mbd_route_want;

/* True when route r (with id hex `id`) satisfies every set field of w. */
bool mbd_route_matches(const mbd_route_want *w, const mbd_route_identity *r, const char *id);
/* Human summary of w for NO_ROUTE messages ("backend=cuda dtype=bf16"; "any"). */
void mbd_route_want_format(const mbd_route_want *w, char *buf, size_t cap);

#endif
