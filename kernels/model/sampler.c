/* Greedy and seeded sampling (see sampler.h). Probabilities are computed in
 * double from f32 logits in a fixed order, so the pick depends only on the
 * logits' bits, the settings, the seed and the step. */
#include "kernels/model/sampler.h"

#include <math.h>
#include <stdlib.h>

struct cand {
  float l;   /* logit */
  int32_t i; /* token */
};

struct mbd_sampler {
  int64_t vocab;
  struct cand *cand; /* [vocab] candidates (logit, index) */
  double *prob;      /* [vocab] candidate weights */
};

void mbd_sampling_greedy(mbd_sampling *s) {
  s->temperature = 0.0f;
  s->top_k = 0;
  s->top_p = 1.0f;
  s->seed = 0;
}

int mbd_sampling_check(const mbd_sampling *s, mbd_error *err) {
  if (isnan(s->temperature) || s->temperature < 0.0f || isinf(s->temperature))
    return mbd_error_set(err, MBD_E_INVALID, "sampling: temperature must be finite and >= 0");
  if (!(s->top_p > 0.0f) || isinf(s->top_p))
    return mbd_error_set(err, MBD_E_INVALID,
                         "sampling: top_p must be > 0 (values >= 1 keep every token)");
  return MBD_OK;
}

/* The rule itself, one element at a time. */
static int32_t argmax_scalar(const float *logits, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
  return (int32_t)best;
}

#define ARGMAX_LANES 8

/* The same answer with ARGMAX_LANES independent chains (lane l sees the
 * indices = l mod lanes and keeps its first maximum), merged by value, then
 * index: a dependent compare per element was ~1 ns, and a GENERATE's first
 * token is picked from a whole vocabulary on the host. Where no element
 * beats -inf (all -inf or NaN) the scalar rule decides. */
int32_t mbd_sampler_argmax(const float *logits, int64_t V) {
  float m[ARGMAX_LANES];
  int64_t idx[ARGMAX_LANES];
  for (int l = 0; l < ARGMAX_LANES; l++) {
    m[l] = -INFINITY;
    idx[l] = -1;
  }
  int64_t full = V - V % ARGMAX_LANES;
  for (int64_t i = 0; i < full; i += ARGMAX_LANES)
    for (int l = 0; l < ARGMAX_LANES; l++)
      if (logits[i + l] > m[l]) {
        m[l] = logits[i + l];
        idx[l] = i + l;
      }
  for (int64_t i = full; i < V; i++)
    if (logits[i] > m[i - full]) {
      m[i - full] = logits[i];
      idx[i - full] = i;
    }
  int64_t best = -1;
  for (int l = 0; l < ARGMAX_LANES; l++)
    if (idx[l] >= 0 &&
        (best < 0 || m[l] > logits[best] || (m[l] == logits[best] && idx[l] < best)))
      best = idx[l];
  return best < 0 ? argmax_scalar(logits, V) : (int32_t)best;
}

static uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double mbd_sampler_uniform(uint64_t seed, uint64_t step) {
  uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(step ^ 0x5851f42d4c957f2dull));
  return (double)(r >> 11) * 0x1p-53;
}

int mbd_sampler_new(int64_t vocab, mbd_sampler **out, mbd_error *err) {
  *out = NULL;
  if (vocab <= 0 || vocab > INT32_MAX)
    return mbd_error_set(err, MBD_E_INVALID, "sampler: bad vocabulary size %lld", (long long)vocab);
  mbd_sampler *s = calloc(1, sizeof(*s));
  if (s) {
    s->cand = malloc((size_t)vocab * sizeof(struct cand));
    s->prob = malloc((size_t)vocab * sizeof(double));
  }
  if (!s || !s->cand || !s->prob) {
    mbd_sampler_destroy(&s);
    return mbd_error_set(err, MBD_E_NOMEM, "sampler: out of memory");
  }
  s->vocab = vocab;
  *out = s;
  return MBD_OK;
}

void mbd_sampler_destroy(mbd_sampler **ps) {
  if (!ps || !*ps) return;
  free((*ps)->cand);
  free((*ps)->prob);
  free(*ps);
  *ps = NULL;
}

/* Total order: larger logit first, then lower index; NaN last. */
static int cmp_cand(const void *a, const void *b) {
  const struct cand *ca = a, *cb = b;
  int32_t i = ca->i, j = cb->i;
  float x = ca->l, y = cb->l;
  int xn = isnan(x), yn = isnan(y);
  if (xn != yn) return xn - yn;
  if (!xn && x != y) return x > y ? -1 : 1;
  return (i > j) - (i < j);
}

int mbd_sampler_pick(mbd_sampler *s, const mbd_sampling *p, uint64_t step, const float *logits,
                     int32_t *out, mbd_error *err) {
  int rc = mbd_sampling_check(p, err);
  if (rc) return rc;
  int64_t V = s->vocab;
  int32_t best = mbd_sampler_argmax(logits, V);
  if (p->temperature <= 0.0f || isnan(logits[best])) {
    *out = best;
    return MBD_OK;
  }
  int64_t n = V;
  for (int64_t i = 0; i < V; i++) {
    s->cand[i].l = logits[i];
    s->cand[i].i = (int32_t)i;
  }
  int truncate = (p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f;
  if (truncate) {
    qsort(s->cand, (size_t)V, sizeof(struct cand), cmp_cand);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
  }
  double mx = logits[best], T = p->temperature, total = 0.0;
  for (int64_t i = 0; i < n; i++) {
    float l = s->cand[i].l;
    double w = isnan(l) ? 0.0 : exp(((double)l - mx) / T);
    s->prob[i] = w;
    total += w;
  }
  if (p->top_p < 1.0f) {
    double keep = (double)p->top_p * total, cum = 0.0;
    int64_t k = 0;
    while (k < n) {
      cum += s->prob[k++];
      if (cum >= keep) break;
    }
    n = k;
    total = cum;
  }
  double u = mbd_sampler_uniform(p->seed, step) * total, cum = 0.0;
  int32_t pick = s->cand[n - 1].i;
  for (int64_t i = 0; i < n; i++) {
    cum += s->prob[i];
    if (u < cum) {
      pick = s->cand[i].i;
      break;
    }
  }
  *out = pick;
  return MBD_OK;
}
