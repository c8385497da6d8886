// Four-bit weights for the fused decoding step (fused_step.cpp; attnlab.accel.fused's "int4"),
// in GGUF's Q4_0 layout (llama.cpp's block_q4_0): each row cut into blocks of kQ4Block = 32
// values, a block stored as 16 bytes of nibbles q in 0..15 and one scale d, w = d (q - 8). Byte i
// of a block holds value i in its low nibble and value i + 16 in its high one. ggml stores d in
// fp16; here it is that fp16 value widened to fp32 (exactly), a row's scales beside its nibbles.
//
// The products multiply integers, as ggml's vec_dot_q4_0_q8_0 does: the activations are quantized
// per block of 32 too (`Q8Activations`: e = max |x| / 127, p = round(x / e), int8), and a block's
// sum of (q - 8) p is exact in int32; the float work is one scale d e per block. Written three
// times: AVX-512 (the sums in VNNI's dot-product instruction where the CPU has it, else in
// AVX-512 BW's), AVX2 (what `make test-avx2` builds and tests), and plain C++ for any other CPU,
// which `portable_q4()` also selects on any CPU (the tests compare the three). The integer sums
// are the same in every path; only the order of the float additions differs.
//
// A product of 16 rows or more widens the weights to fp32 instead (`widen_q4`) and multiplies
// the rows as they are, unquantized: there the multiply-adds cost more than reading the weights.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "quantized.h"

namespace attnlab {

constexpr int64_t kQ4Block = 32;       // values per scale (Q4_0's QK4_0)
constexpr int64_t kQ4BlockBytes = 16;  // bytes of nibbles per block
constexpr int kLanes = 8;              // int32 lanes of a block's sums (a 256-bit vector)

// Whether the products over four-bit weights take the plain C++ path on any CPU (the tests set
// it to check that path against the vector ones on the same machine).
inline bool& portable_q4() {
  static bool portable = false;
  return portable;
}

// `rows` rows of activations (in wide, a multiple of kQ4Block) quantized per block, as ggml's
// quantize_row_q8_0 does but with an fp32 scale: e = max |x| / 127, p = round(x e^-1) (ties to
// even). Laid out for the vector paths: each block's scale repeated in its kLanes lanes, and
// -8 times the sum of its p in the first lane (zeros in the others), which the block's integer
// dot product starts from, so that it sums (q - 8) p with q read as unsigned nibbles.
struct Q8Activations {
  int64_t rows = 0, in = 0, blocks = 0;
  std::vector<int8_t> p;         // (rows, in)
  std::vector<float> scale;      // (rows, blocks * kLanes)
  std::vector<int32_t> offset;   // (rows, blocks * kLanes)
  // What the K-quants' products (quantizedk.h) add: e times the sum of a block's p, and Q6_K's
  // -32 times the sum of each half's p in lanes 0 and 4 (its sub-blocks are 16 values).
  std::vector<float> sum;        // (rows, blocks)
  std::vector<int32_t> offset6;  // (rows, blocks * kLanes)

  Q8Activations(const float* x, int64_t rows_, int64_t in_)
      : rows(rows_), in(in_), blocks(in_ / kQ4Block), p(rows_ * in_),
        scale(rows_ * blocks * kLanes), offset(rows_ * blocks * kLanes, 0), sum(rows_ * blocks),
        offset6(rows_ * blocks * kLanes, 0) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < blocks; ++k) quantize_block(x + r * in + k * kQ4Block, r, k);
  }

  const int8_t* row(int64_t r, int64_t k) const { return p.data() + r * in + k * kQ4Block; }
  const float* scales(int64_t r, int64_t k) const { return scale.data() + (r * blocks + k) * kLanes; }
  const int32_t* offsets(int64_t r, int64_t k) const { return offset.data() + (r * blocks + k) * kLanes; }
  const int32_t* offsets6(int64_t r, int64_t k) const { return offset6.data() + (r * blocks + k) * kLanes; }
  const float* sums(int64_t r, int64_t k) const { return sum.data() + r * blocks + k; }

 private:
  void quantize_block(const float* x, int64_t r, int64_t k) {
    float amax = 0.f;
    for (int i = 0; i < kQ4Block; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float e = amax / 127.f, inv = e > 0.f ? 1.f / e : 0.f;
    int8_t* q = p.data() + r * in + k * kQ4Block;
    int32_t half[2] = {0, 0};
    for (int i = 0; i < kQ4Block; ++i) {
      q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inv));
      half[i / 16] += q[i];
    }
    const int64_t at = (r * blocks + k) * kLanes;
    for (int l = 0; l < kLanes; ++l) scale[at + l] = e;
    offset[at] = -8 * (half[0] + half[1]);
    offset6[at] = -32 * half[0], offset6[at + kLanes / 2] = -32 * half[1];
    sum[r * blocks + k] = e * static_cast<float>(half[0] + half[1]);
  }
};

// One block's sum of (q - 8) p: nibbles qs (16 bytes), activations p (32).
inline int32_t dot_q4_block(const uint8_t* qs, const int8_t* p) {
  int32_t s = 0;
  for (int i = 0; i < 16; ++i) s += ((qs[i] & 15) - 8) * p[i] + ((qs[i] >> 4) - 8) * p[i + 16];
  return s;
}

// acc[b] = sum over the blocks k of d_k e_bk (sum of (q - 8) p_b): one weight row (nibbles qs,
// scales d) against the B rows of activations from `first`, in plain C++.
template <int B>
void dot_rows_q4_portable(const uint8_t* qs, const float* d, const Q8Activations& a, int64_t first, float* acc) {
  for (int b = 0; b < B; ++b) acc[b] = 0.f;
  for (int64_t k = 0; k < a.blocks; ++k)
    for (int b = 0; b < B; ++b)
      acc[b] += d[k] * a.scales(first + b, k)[0] * static_cast<float>(dot_q4_block(qs + k * kQ4BlockBytes, a.row(first + b, k)));
}

#if defined(__AVX2__) && defined(__FMA__)
// A block's 32 weights as unsigned bytes 0..15, in the activations' order (values 0..15, the low
// nibbles, then 16..31, the high ones).
inline __m256i q4_nibbles(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(15));
}

// total + d e (sum of (q - 8) p) for one block, in 8 float lanes: the integer sums in 16-bit
// pairs (at most 2 * 15 * 127, no saturation), then in 32-bit lanes, from the block's offset.
inline __m256 q4_block8(__m256i w, const Q8Activations& a, int64_t r, int64_t k, float d, __m256 total) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.row(r, k)));
  __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  s = _mm256_add_epi32(s, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.offsets(r, k))));
  const __m256 de = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_loadu_ps(a.scales(r, k)));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), de, total);
}

inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// `dot_rows_q4_portable` 8 lanes wide, blocks from `from` on; one row takes two blocks per
// iteration into separate accumulators (one block's additions not waiting on the other's).
template <int B>
void dot_rows_q4_avx2(const uint8_t* qs, const float* d, const Q8Activations& a, int64_t first, int64_t from,
                      float* acc) {
  constexpr int U = B == 1 ? 2 : 1;
  __m256 total[B][U];
  for (int b = 0; b < B; ++b)
    for (int u = 0; u < U; ++u) total[b][u] = _mm256_setzero_ps();
  int64_t k = from;
  for (; k + U <= a.blocks; k += U)
    for (int u = 0; u < U; ++u) {
      const __m256i w = q4_nibbles(qs + (k + u) * kQ4BlockBytes);
      for (int b = 0; b < B; ++b) total[b][u] = q4_block8(w, a, first + b, k + u, d[k + u], total[b][u]);
    }
  for (; k < a.blocks; ++k) {
    const __m256i w = q4_nibbles(qs + k * kQ4BlockBytes);
    for (int b = 0; b < B; ++b) total[b][0] = q4_block8(w, a, first + b, k, d[k], total[b][0]);
  }
  for (int b = 0; b < B; ++b) {
    __m256 t = total[b][0];
    for (int u = 1; u < U; ++u) t = _mm256_add_ps(t, total[b][u]);
    acc[b] += sum8(t);
  }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
// Two blocks' 64 weights as unsigned bytes, in the activations' order: the 128-bit lanes of
// [nibbles k, nibbles k+1, same >> 4] reordered to block k's low, high, block k+1's low, high.
inline __m512i q4_nibbles2(const uint8_t* qs) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
  return _mm512_and_si512(_mm512_shuffle_i64x2(both, both, 0xD8), _mm512_set1_epi8(15));
}

// Two blocks' integer sums (8 lanes each), from their offsets.
inline __m512i q4_sums2(__m512i w, const Q8Activations& a, int64_t r, int64_t k) {
  const __m512i x = _mm512_loadu_si512(a.row(r, k));
  const __m512i offset = _mm512_loadu_si512(a.offsets(r, k));
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(offset, w, x);
#else
  return _mm512_add_epi32(offset, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#endif
}

// `dot_rows_q4_portable` 16 lanes wide, two blocks at a time; an odd last block goes to the AVX2
// code. One row takes four pairs per iteration into separate accumulators, two rows two.
template <int B>
void dot_rows_q4_avx512(const uint8_t* qs, const float* d, const Q8Activations& a, int64_t first, float* acc) {
  constexpr int U = B == 1 ? 4 : B <= 2 ? 2 : 1;
  const __m512i halves = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512 total[B][U];
  for (int b = 0; b < B; ++b)
    for (int u = 0; u < U; ++u) total[b][u] = _mm512_setzero_ps();
  const int64_t pairs = a.blocks / 2;
  auto pair = [&](int64_t m, int u) {  // blocks 2m and 2m + 1 into the accumulators u
    const int64_t k = 2 * m;
    const __m512i w = q4_nibbles2(qs + k * kQ4BlockBytes);
    const __m128 dd = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(d + k)));
    const __m512 dw = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(dd));  // d_k x8, d_k+1 x8
    for (int b = 0; b < B; ++b) {
      const __m512 de = _mm512_mul_ps(dw, _mm512_loadu_ps(a.scales(first + b, k)));
      total[b][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_sums2(w, a, first + b, k)), de, total[b][u]);
    }
  };
  int64_t m = 0;
  for (; m + U <= pairs; m += U)
    for (int u = 0; u < U; ++u) pair(m + u, u);
  for (; m < pairs; ++m) pair(m, 0);
  for (int b = 0; b < B; ++b) {
    __m512 t = total[b][0];
    for (int u = 1; u < U; ++u) t = _mm512_add_ps(t, total[b][u]);
    acc[b] = _mm512_reduce_add_ps(t);
  }
  if (a.blocks % 2) dot_rows_q4_avx2<B>(qs, d, a, first, a.blocks - 1, acc);
}
#endif

// acc[b] = the product of one four-bit weight row (nibbles qs, scales d; a.in wide) with rows
// first .. first + B - 1 of the quantized activations: the widest path this build has, or the
// plain one where `portable_q4()`.
template <int B>
void dot_rows_q4(const uint8_t* qs, const float* d, const Q8Activations& a, int64_t first, float* acc) {
  if (portable_q4()) return dot_rows_q4_portable<B>(qs, d, a, first, acc);
#if defined(__AVX512F__) && defined(__AVX512BW__)
  dot_rows_q4_avx512<B>(qs, d, a, first, acc);
#elif defined(__AVX2__) && defined(__FMA__)
  for (int b = 0; b < B; ++b) acc[b] = 0.f;
  dot_rows_q4_avx2<B>(qs, d, a, first, 0, acc);
#else
  dot_rows_q4_portable<B>(qs, d, a, first, acc);
#endif
}

// Which path `dot_rows_q4` takes in this build (unless `portable_q4()`), for the tests to check.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr const char* kQ4Path = "avx512-vnni";
#elif defined(__AVX512F__) && defined(__AVX512BW__)
constexpr const char* kQ4Path = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kQ4Path = "avx2";
#else
constexpr const char* kQ4Path = "portable";
#endif

// The values of `rows` four-bit weight rows (in wide) as fp32, d (q - 8): what the streamed
// products' weights are, for the matrix product of many rows (fused_step.cpp, `widened_linear`).
inline void widen_q4(const uint8_t* qs, const float* scales, int64_t rows, int64_t in, float* out) {
  const int64_t blocks = in / kQ4Block;
  for (int64_t j = 0; j < rows; ++j)
    for (int64_t k = 0; k < blocks; ++k) {
      const float s = scales[j * blocks + k];
      const uint8_t* q = qs + (j * blocks + k) * kQ4BlockBytes;
      float* o = out + j * in + k * kQ4Block;
#pragma omp simd
      for (int i = 0; i < 16; ++i) {
        o[i] = s * static_cast<float>((q[i] & 15) - 8);
        o[i + 16] = s * static_cast<float>((q[i] >> 4) - 8);
      }
    }
}

}  // namespace attnlab
