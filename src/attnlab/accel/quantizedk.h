// GGUF's K-quant super-blocks for the fused decoding step (fused_step.cpp; attnlab.accel.fused's
// "q4_k"), byte for byte ggml's (ggml-common.h; gguf-py's gguf.quants dequantizes them):
// - Q4_K, block_q4_K (144 bytes for 256 values): f16 d, f16 dmin, 12 bytes packing 8 six-bit
//   scales sc and 8 six-bit mins m, then 128 bytes of nibbles. Sub-block j (values 32j .. 32j + 31)
//   is w = d sc_j q - dmin m_j, q in 0..15; byte i of the 32 bytes [32 (j / 2), 32 (j / 2) + 32)
//   holds value i of sub-block j in its low nibble for even j, in its high one for odd j.
// - Q6_K, block_q6_K (210 bytes for 256 values): ql[128], qh[64], int8 scales[16], f16 d. Value v of
//   half n (128 values), group g (32 values), v = 128 n + 32 g + i, has its low four bits in
//   ql[64 n + 32 (g % 2) + i] (the low nibble for g < 2, the high one after), its top two in bits
//   2g, 2g + 1 of qh[32 n + i]; w = d scales[v / 16] (q - 32), q in 0..63.
// A weight of these formats is a row of super-blocks per output row, each row of its own kind
// (`kQ4K`, `kQ6K`: llama.cpp's Q4_K_M keeps some rows at six bits); rows are as many bytes apart
// as the widest kind takes.
//
// The products multiply integers, as ggml's do, but with the activations quantized per block of 32
// as for Q4_0 (`Q8Activations`, e = max |x| / 127) rather than ggml's q8_K (one scale per 256):
// the same code and a finer rounding. A block's (sub-block's, for Q6_K's 16) integer sum is
// exact; the float work is a scale per 32 values. Q4_K's mins come from each block's e sum p,
// computed once per row of activations. Written twice: 256-bit vectors (AVX2; the sums in
// AVX-512 VNNI's dot-product instruction where the build has it) and plain C++, which
// `portable_q4()` also selects. AVX-512 builds run the 256-bit code.
#pragma once

#include <cstring>

#include "quantized4.h"

namespace attnlab {

constexpr int64_t kQK = 256;         // values per super-block (ggml's QK_K)
constexpr int64_t kQKBlocks = 8;     // activation blocks of 32 per super-block
constexpr uint8_t kQ4K = 0, kQ6K = 1;  // a row's kind
constexpr int64_t kQ4KBytes = 144, kQ6KBytes = 210;

inline int64_t k_bytes(uint8_t kind) { return kind == kQ6K ? kQ6KBytes : kQ4KBytes; }

// IEEE half precision to fp32, exactly (subnormals included): ggml's f16 scales.
inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exponent = (h >> 10) & 31, mantissa = h & 1023;
  if (exponent == 0) return (sign ? -1.f : 1.f) * std::ldexp(static_cast<float>(mantissa), -24);
  const uint32_t bits = sign | (exponent == 31 ? 0x7f800000u | (mantissa << 13) : ((exponent + 112) << 23) | (mantissa << 13));
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Q4_K's eight six-bit scales and mins from their 12 bytes: the first four of each in the low six
// bits of bytes 0-3 (scales) and 4-7 (mins); the last four's low nibbles in bytes 8-11 (scales low,
// mins high), their top two bits in the top two bits of bytes 0-3 (scales) and 4-7 (mins).
inline void q4k_scales(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63, m[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Q6_K's code of value i of group g (0..7 over the super-block) from its ql and qh bytes.
inline int q6k_code(const uint8_t* ql, const uint8_t* qh, int g, int i) {
  const int half = g / 4, group = g % 4;
  const int low = (ql[64 * half + 32 * (group % 2) + i] >> (4 * (group / 2))) & 15;
  return low | (((qh[32 * half + i] >> (2 * group)) & 3) << 4);
}

// acc[b] += one Q4_K super-block times the activations' blocks k0 .. k0 + 7 of rows first + b.
template <int B>
void q4k_block_portable(const uint8_t* blk, const Q8Activations& a, int64_t first, int64_t k0, float* acc) {
  const float d = half_to_float(blk), dmin = half_to_float(blk + 2);
  uint8_t sc[8], m[8];
  q4k_scales(blk + 4, sc, m);
  for (int j = 0; j < 8; ++j) {
    const uint8_t* q = blk + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int b = 0; b < B; ++b) {
      const int8_t* p = a.row(first + b, k0 + j);
      int32_t s = 0;
      for (int i = 0; i < 32; ++i) s += ((q[i] >> shift) & 15) * p[i];
      acc[b] += d * sc[j] * a.scales(first + b, k0 + j)[0] * static_cast<float>(s) - dmin * m[j] * a.sums(first + b, k0 + j)[0];
    }
  }
}

// acc[b] += one Q6_K super-block times the activations' blocks k0 .. k0 + 7 of rows first + b.
template <int B>
void q6k_block_portable(const uint8_t* blk, const Q8Activations& a, int64_t first, int64_t k0, float* acc) {
  const uint8_t *ql = blk, *qh = blk + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = half_to_float(blk + 208);
  for (int g = 0; g < 8; ++g)
    for (int b = 0; b < B; ++b) {
      const int8_t* p = a.row(first + b, k0 + g);
      int32_t s[2] = {0, 0};  // the two sub-blocks of 16
      for (int i = 0; i < 32; ++i) s[i / 16] += (q6k_code(ql, qh, g, i) - 32) * p[i];
      acc[b] += d * a.scales(first + b, k0 + g)[0] * static_cast<float>(sc[2 * g] * s[0] + sc[2 * g + 1] * s[1]);
    }
}

#if defined(__AVX2__) && defined(__FMA__)
// start + the sums of four adjacent products w x (unsigned by signed bytes) in each int32 lane.
inline __m256i u8s8_sums(__m256i w, __m256i x, __m256i start) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(start, w, x);
#else
  return _mm256_add_epi32(start, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// `q4k_block_portable` in 8 float lanes: total[b] gathers the scaled sums, mins[b] the mins' terms.
template <int B>
void q4k_block_avx2(const uint8_t* blk, const Q8Activations& a, int64_t first, int64_t k0, __m256* total,
                    __m256* mins) {
  const float d = half_to_float(blk), dmin = half_to_float(blk + 2);
  alignas(8) uint8_t sc[8], m[8];
  q4k_scales(blk + 4, sc, m);
  const __m256i m32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
  const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(m32));  // dmin m_j, j = 0..7
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int c = 0; c < 4; ++c) {
    const __m256i v = load256(blk + 16 + 32 * c);
    const __m256i w[2] = {_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4)};
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * c + h;
      const __m256 ds = _mm256_set1_ps(d * sc[j]);
      for (int b = 0; b < B; ++b) {
        const __m256i s = u8s8_sums(w[h], load256(a.row(first + b, k0 + j)), _mm256_setzero_si256());
        const __m256 de = _mm256_mul_ps(ds, _mm256_loadu_ps(a.scales(first + b, k0 + j)));
        total[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), de, total[b]);
      }
    }
  }
  for (int b = 0; b < B; ++b) mins[b] = _mm256_fmadd_ps(dm, _mm256_loadu_ps(a.sums(first + b, k0)), mins[b]);
}

// `q6k_block_portable` in 8 float lanes: a group's 32 codes as bytes in the activations' order,
// their sums with the -32 offsets (`Q8Activations::offsets6`) in lanes 0-3 (values 0-15) and 4-7.
template <int B>
void q6k_block_avx2(const uint8_t* blk, const Q8Activations& a, int64_t first, int64_t k0, __m256* total) {
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = half_to_float(blk + 208);
  const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; ++n) {
    const __m256i ql[2] = {load256(blk + 64 * n), load256(blk + 64 * n + 32)}, qh = load256(blk + 128 + 32 * n);
    for (int g = 0; g < 4; ++g) {
      const __m256i low = _mm256_and_si256(_mm256_srl_epi16(ql[g % 2], _mm_cvtsi32_si128(4 * (g / 2))), low4);
      const __m256i high = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * g)), two);
      const __m256i w = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
      const int64_t k = k0 + 4 * n + g;
      const int s = 2 * (4 * n + g);
      const __m256 ds = _mm256_set_m128(_mm_set1_ps(d * sc[s + 1]), _mm_set1_ps(d * sc[s]));
      for (int b = 0; b < B; ++b) {
        const __m256i sums = u8s8_sums(w, load256(a.row(first + b, k)), load256(a.offsets6(first + b, k)));
        const __m256 de = _mm256_mul_ps(ds, _mm256_loadu_ps(a.scales(first + b, k)));
        total[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), de, total[b]);
      }
    }
  }
}

template <int B>
void dot_rows_k_avx2(const uint8_t* row, uint8_t kind, const Q8Activations& a, int64_t first, float* acc) {
  __m256 total[B], mins[B];
  for (int b = 0; b < B; ++b) total[b] = _mm256_setzero_ps(), mins[b] = _mm256_setzero_ps();
  const int64_t bytes = k_bytes(kind);
  for (int64_t k0 = 0; k0 < a.blocks; k0 += kQKBlocks, row += bytes)
    if (kind == kQ6K)
      q6k_block_avx2<B>(row, a, first, k0, total);
    else
      q4k_block_avx2<B>(row, a, first, k0, total, mins);
  for (int b = 0; b < B; ++b) acc[b] = sum8(total[b]) - sum8(mins[b]);
}
#endif

// acc[b] = the product of one K-quant weight row (its super-blocks `row`, of kind `kind`; a.in
// wide) with rows first .. first + B - 1 of the quantized activations.
template <int B>
void dot_rows_k(const uint8_t* row, uint8_t kind, const Q8Activations& a, int64_t first, float* acc) {
#if defined(__AVX2__) && defined(__FMA__)
  if (!portable_q4()) return dot_rows_k_avx2<B>(row, kind, a, first, acc);
#endif
  for (int b = 0; b < B; ++b) acc[b] = 0.f;
  const int64_t bytes = k_bytes(kind);
  for (int64_t k0 = 0; k0 < a.blocks; k0 += kQKBlocks, row += bytes)
    if (kind == kQ6K)
      q6k_block_portable<B>(row, a, first, k0, acc);
    else
      q4k_block_portable<B>(row, a, first, k0, acc);
}

// Which path `dot_rows_k` takes in this build (unless `portable_q4()`), for the tests to check.
#if defined(__AVX2__) && defined(__FMA__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
constexpr const char* kQKPath = "avx2-vnni";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kQKPath = "avx2";
#else
constexpr const char* kQKPath = "portable";
#endif

// The fp32 values of one K-quant row (in wide), as gguf.quants.dequantize computes them:
// (d sc) q - (dmin m) for Q4_K, (d scale) (q - 32) for Q6_K.
inline void widen_k(const uint8_t* row, uint8_t kind, int64_t in, float* out) {
  for (int64_t k = 0; k < in / kQK; ++k, row += k_bytes(kind), out += kQK) {
    if (kind == kQ6K) {
      const auto* sc = reinterpret_cast<const int8_t*>(row + 192);
      const float d = half_to_float(row + 208);
      for (int g = 0; g < 8; ++g)
        for (int i = 0; i < 32; ++i)
          out[32 * g + i] = d * sc[2 * g + i / 16] * static_cast<float>(q6k_code(row, row + 128, g, i) - 32);
      continue;
    }
    const float d = half_to_float(row), dmin = half_to_float(row + 2);
    uint8_t sc[8], m[8];
    q4k_scales(row + 4, sc, m);
    for (int j = 0; j < 8; ++j) {
      const float scale = d * sc[j], low = dmin * m[j];
      const uint8_t* q = row + 16 + 32 * (j / 2);
      for (int i = 0; i < 32; ++i) out[32 * j + i] = scale * static_cast<float>((q[i] >> (4 * (j % 2))) & 15) - low;
    }
  }
}

}  // namespace attnlab
