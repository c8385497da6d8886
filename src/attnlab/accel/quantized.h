// Matrix-vector products over weights stored in fewer bytes than fp32, for the fused decoding
// step (attnlab/accel/fused_step.cpp; attnlab.accel.fused.WEIGHT_FORMATS). Decoding one token
// reads every weight once, and at batch 1 the step's speed is how fast the weights stream from
// memory: 2 bytes a weight (bf16) or about 1 (int8) read that much faster than fp32's 4.
//
// - bf16: the upper 16 bits of an fp32 weight, widened back to fp32 as it is read (a shift); the
//   products run in fp32 with fp32 activations, so every CPU computes the same values, with or
//   without AVX-512 BF16 (whose dot-product instructions would round the activations to bf16 too).
// - int8, GGUF's q8_0 (llama.cpp's block_q8_0): each row cut into blocks of kQ8Block values, a
//   block stored as int8 q with one fp32 scale s, w = s q (attnlab.accel.fused.quantize_q8_0:
//   s = max |w| / 127, q = round(w / s)). The activations stay fp32: a block's q . x is summed in
//   fp32 and scaled once, s (q . x).
//
// Written three times, like the training kernels (kernels.cpp): AVX-512, AVX2 (what `make
// test-avx2` builds and tests) and plain C++ for any other CPU; the same sums in the same
// blocks, each lane accumulated in order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace attnlab {

constexpr int64_t kQ8Block = 32;  // values per scale (q8_0's QK8_0)

// The number of scales of a row of n values: one per block, the last one possibly short.
inline int64_t q8_blocks(int64_t n) { return (n + kQ8Block - 1) / kQ8Block; }

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kVecWidth = 16;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vset(float s) { return _mm512_set1_ps(s); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
// kVecWidth int8 or bf16 weights widened to fp32.
inline Vec vload_q8(const int8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}
inline Vec vload_bf16(const uint16_t* w) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kVecWidth = 8;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vset(float s) { return _mm256_set1_ps(s); }
inline float vsum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline Vec vload_q8(const int8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}
inline Vec vload_bf16(const uint16_t* w) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#else
// No vector unit this code knows: one float a "vector", the same loops.
using Vec = float;
constexpr int kVecWidth = 1;
inline Vec vzero() { return 0.f; }
inline Vec vload(const float* p) { return *p; }
inline Vec vfma(Vec a, Vec b, Vec c) { return a * b + c; }
inline Vec vset(float s) { return s; }
inline float vsum(Vec v) { return v; }
inline Vec vload_q8(const int8_t* q) { return static_cast<float>(*q); }
inline Vec vload_bf16(const uint16_t* w) { return bf16_to_float(*w); }
#endif

constexpr int kVecsPerBlock = kQ8Block / kVecWidth;

// acc[b] = sum over the row's blocks of s_k (q_k . x[b]_k) for the B rows of x (in wide), one
// int8 weight row q (in) with its scales: the weights are read and widened once for all rows.
// Rows of at most 2 take two blocks per iteration into separate accumulators, so that one
// block's additions do not wait on the previous one's; one row on AVX-512 takes eight, which
// made batch-1 decoding faster (the fused step on llamacpp_compare.py's shapes; AVX2's 16
// registers would not hold them). Blocks left over from the unrolled loop go one at a time.
template <int B>
void dot_rows_q8(const int8_t* q, const float* scales, const float* x, int64_t in, float* acc) {
  constexpr int U = B == 1 && kVecWidth == 16 ? 8 : B <= 2 ? 2 : 1;
  Vec total[B][U];
  for (int b = 0; b < B; ++b)
    for (int u = 0; u < U; ++u) total[b][u] = vzero();
  const int64_t full = in / kQ8Block;
  int64_t k = 0;
  for (; k + U <= full; k += U) {
    Vec w[U][kVecsPerBlock];
    for (int u = 0; u < U; ++u)
      for (int v = 0; v < kVecsPerBlock; ++v) w[u][v] = vload_q8(q + (k + u) * kQ8Block + v * kVecWidth);
    for (int b = 0; b < B; ++b)
      for (int u = 0; u < U; ++u) {
        const float* xb = x + b * in + (k + u) * kQ8Block;
        Vec s = vzero();
        for (int v = 0; v < kVecsPerBlock; ++v) s = vfma(w[u][v], vload(xb + v * kVecWidth), s);
        total[b][u] = vfma(vset(scales[k + u]), s, total[b][u]);
      }
  }
  for (; k < full; ++k)
    for (int b = 0; b < B; ++b) {
      const int8_t* qk = q + k * kQ8Block;
      const float* xb = x + b * in + k * kQ8Block;
      Vec s = vzero();
      for (int v = 0; v < kVecsPerBlock; ++v) s = vfma(vload_q8(qk + v * kVecWidth), vload(xb + v * kVecWidth), s);
      total[b][0] = vfma(vset(scales[k]), s, total[b][0]);
    }
  for (int b = 0; b < B; ++b) {
    Vec t = total[b][0];
    for (int u = 1; u < U; ++u) t = t + total[b][u];
    float sum = vsum(t);
    if (full * kQ8Block < in) {  // a short last block
      float s = 0.f;
      for (int64_t i = full * kQ8Block; i < in; ++i) s += q[i] * x[b * in + i];
      sum += scales[full] * s;
    }
    acc[b] = sum;
  }
}

// acc[b] = w . x[b] for the B rows of x (in wide) and one bf16 weight row w (in), widened to fp32.
template <int B>
void dot_rows_bf16(const uint16_t* w, const float* x, int64_t in, float* acc) {
  constexpr int U = B <= 2 ? 2 : 1, kStep = U * kVecWidth;
  Vec total[B][U];
  for (int b = 0; b < B; ++b)
    for (int u = 0; u < U; ++u) total[b][u] = vzero();
  int64_t i = 0;
  for (; i + kStep <= in; i += kStep) {
    Vec wv[U];
    for (int u = 0; u < U; ++u) wv[u] = vload_bf16(w + i + u * kVecWidth);
    for (int b = 0; b < B; ++b)
      for (int u = 0; u < U; ++u) total[b][u] = vfma(wv[u], vload(x + b * in + i + u * kVecWidth), total[b][u]);
  }
  for (int b = 0; b < B; ++b) {
    Vec t = total[b][0];
    for (int u = 1; u < U; ++u) t = t + total[b][u];
    float sum = vsum(t);
    for (int64_t j = i; j < in; ++j) sum += bf16_to_float(w[j]) * x[b * in + j];
    acc[b] = sum;
  }
}

// The values of `rows` int8 weight rows (in wide) with their scales, widened to fp32 as
// `dot_rows_q8` reads them: out[j, i] = s_k q[j, i] for i in block k. A product of many rows
// multiplies these by a matrix product (fused_step.cpp, `widened_linear`).
inline void widen_q8(const int8_t* q, const float* scales, int64_t rows, int64_t in, float* out) {
  const int64_t blocks = q8_blocks(in);
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t k = 0; k < blocks; ++k) {
      const float s = scales[j * blocks + k];
      const int64_t end = std::min(in, (k + 1) * kQ8Block);
#pragma omp simd
      for (int64_t i = k * kQ8Block; i < end; ++i) out[j * in + i] = s * static_cast<float>(q[j * in + i]);
    }
}

// n bf16 weights widened to fp32 (exactly: the upper 16 bits of each).
inline void widen_bf16(const uint16_t* w, int64_t n, float* out) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(w[i]);
}

}  // namespace attnlab
