// Training kernels for the CPU, fp32: attnlab.accel.kernels.
//
// The parts of a small Transformer's training step where PyTorch's CPU operators are far from
// what the machine can do (a profile of a 4-layer, 128-wide GPT, block 64, batch 12: the matrix
// products near the fp32 peak, everything around them as long again):
// - GELU and its derivative, elementwise: PyTorch's tanh-GELU does not vectorize well (BENCHMARKS.md, "Tuned CPU paths");
//   here tanh, erf and exp are polynomials that vectorize (vecmath.h).
// - Self-attention forward and backward straight from the fused q/k/v projection's output
//   (B, T, 3C), head h the columns [h*D, (h+1)*D) of each third, to (B, T, C) with the heads
//   side by side: no head split, no transposes, no copies. Per (sequence, head), tiles of queries
//   against the keys in a transposed local copy, so every inner loop runs along keys or along the
//   head dimension in vector registers. The backward recomputes the weights from the forward's
//   log-sum-exp of each query (as FlashAttention does) instead of storing (T, T), for blocks of
//   queries, then sums the key and value gradients over each block a tile of keys at a time.
// - A whole pre-norm block, forward and backward, in one call each (PreNormBlock, at the end).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "vecmath.h"

namespace {

using attnlab::vexp;

constexpr int64_t kElementGrain = 1 << 14;

void check_float_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// One vector of the widest registers the build's CPU has (-march=native): 16 floats with AVX-512,
// 8 with AVX2, 4 on SSE or NEON. A wider vector type than the registers is no help: on AVX2 GCC
// keeps a 16-float one on the stack and assembles it from 64-bit pieces, which made attention
// many times slower than PyTorch's kernel there (BENCHMARKS.md, "Tuned CPU paths").
#if defined(__AVX512F__)
constexpr int kLane = 16;
#elif defined(__AVX__)
constexpr int kLane = 8;
#else
constexpr int kLane = 4;
#endif
// The vector registers the build has: 32 with AVX-512, 16 with AVX2 (and SSE; NEON's 32 aside).
// kSums: the sums a tile of queries keeps over a whole head (R x D / kLane, below), 32: the tile
// goes through the head's columns in chunks that fit the registers (kHeadChunk). kMaxTile: the
// most queries in a tile. With AVX-512, 8: faster than 4-query tiles (16 sums, each tile's columns
// in one pass), every loaded key or value row serving twice the queries. With AVX2, 4, at D = 64
// too, rather than 2, which halves how often the keys and values are read (8 sums in one pass were
// slower than 16 through the stack, and 32 in chunks faster again); 8 is not measured there. The
// measurements: BENCHMARKS.md, "Tuned CPU paths".
#if defined(__AVX512F__)
constexpr int kRegisters = 32, kMaxTile = 8;
#else
constexpr int kRegisters = 16, kMaxTile = 4;
#endif
constexpr int kSums = 32;

typedef float Lanes __attribute__((vector_size(kLane * sizeof(float))));

inline Lanes load(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, Lanes v) { __builtin_memcpy(p, &v, sizeof v); }

// Attention works on tiles of R queries of one (sequence, head): every key or value row loaded
// serves R queries, and the per-row loop overheads are shared by R rows. Queries past the last
// row of a tile repeat that row and are never written.
template <int D>
constexpr int kTile = std::clamp(kSums / (D / kLane), 1, kMaxTile);  // R x D/kLane = kSums sums over a head

// The weighted sums and the key and value gradients go through a head's D floats in chunks of W
// vectors, so that a tile's R x W sums, the W vectors it loads and a broadcast weight all stay in
// registers: the largest W dividing V = D / kLane with (R + 1) W < kRegisters. On AVX-512 that is
// all of D = 16 or 32 for 8 queries, half of D = 64 (8 queries) or of D = 128 (4 queries); on AVX2
// a quarter of D = 64 at a time for 4 queries.
template <int R, int V>
constexpr int kHeadChunk = [] {
  int w = V;
  while (w > 1 && ((R + 1) * w >= kRegisters || V % w != 0)) --w;
  return w;
}();

// The weights a tile's products read, a(r, t) for row r of the tile and term t: R rows of their
// own (queries, scores of a query), or R neighbouring columns of a matrix, rows ld apart (the
// weights of R keys in the scores of consecutive queries).
struct Rows {
  const float* const* rows;
  float operator()(int r, int64_t t) const { return rows[r][t]; }
};

struct Columns {
  const float* w;
  int64_t ld;
  float operator()(int r, int64_t t) const { return w[t * ld + r]; }
};

// out[r] = scale * sum_{t < K} a(r, t) b_t (or out[r] += that) for the R rows of the weights a
// and the K rows b_t (kLane V floats each, `stride` apart), out's rows ld apart: a small product
// held in R x V registers, every loaded b_t serving R rows, the R x V sums independent so that
// their multiply-adds overlap. The attention's scores (a: queries, b: the keys transposed, lanes
// along keys, no horizontal sums) and its weighted sums of rows (a: weights, b: values or keys;
// or a: a key's weights over queries, b: queries or output gradients) are all this.
template <int R, int V, bool Add = false, typename Weights>
inline void tile_product(const Weights& a, const float* b, int64_t stride, int64_t K, float scale, float* out,
                         int64_t ld) {
  Lanes acc[R][V] = {};
  for (int64_t t = 0; t < K; ++t) {
    Lanes bt[V];
#pragma GCC unroll 8
    for (int c = 0; c < V; ++c) bt[c] = load(b + t * stride + c * kLane);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float at = a(r, t);
#pragma GCC unroll 8
      for (int c = 0; c < V; ++c) acc[r][c] += at * bt[c];
    }
  }
  // Scaled once at the end, not every a(r, t) (one multiply fewer beside each broadcast).
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < V; ++c) {
      float* o = out + r * ld + c * kLane;
      store(o, Add ? load(o) + acc[r][c] * scale : acc[r][c] * scale);
    }
}

// s[r][j] = scale * q_r . k_j for R queries and the keys of blocks [0, nb) of kLane, with the keys
// transposed in kt (D rows, ldk floats apart); s is R rows of ld floats.
template <int D, int R>
inline void score_tile(const float* const* q, const float* kt, int64_t ldk, int64_t nb, float scale, float* s,
                       int64_t ld) {
  constexpr int N = R <= 2 ? 4 : 2;
  int64_t b = 0;
  for (; b + N <= nb; b += N) tile_product<R, N>(Rows{q}, kt + b * kLane, ldk, D, scale, s + b * kLane, ld);
  for (; b < nb; ++b) tile_product<R, 1>(Rows{q}, kt + b * kLane, ldk, D, scale, s + b * kLane, ld);
}

// o[r] = sum_{j < n} w[r][j] x_j for R rows of weights (ld apart) and the n rows x_j (D floats,
// `stride` apart); o is R rows of D.
template <int D, int R>
inline void weighted_tile(const float* w, int64_t ld, const float* x, int64_t stride, int64_t n, float* o) {
  constexpr int V = D / kLane, W = kHeadChunk<R, V>;
  const float* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w + r * ld;
  for (int c = 0; c < V; c += W) tile_product<R, W>(Rows{rows}, x + c * kLane, stride, n, 1.f, o + c * kLane, D);
}

// y_r += sum_{t < n} w[t][r] x_t for the R rows y_r (D floats each, contiguous), the weights of R
// neighbouring keys in n consecutive queries' rows of w (ld apart) and those queries' rows x_t
// (`stride` apart): one tile of keys' share of the key and value gradients.
template <int D, int R>
inline void key_tile(const float* w, int64_t ld, const float* x, int64_t stride, int64_t n, float* y) {
  constexpr int V = D / kLane, W = kHeadChunk<R, V>;
  for (int c = 0; c < V; c += W)
    tile_product<R, W, true>(Columns{w, ld}, x + c * kLane, stride, n, 1.f, y + c * kLane, D);
}

#if defined(__AVX__)
// The 8 x 8 block of rows r[0..8) transposed in place, in registers.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}
#endif

// xt (D, Tp) = the T rows of x (D floats, `stride` apart) transposed, its rows ld >= Tp floats
// apart; columns [T, Tp) are zero.
// With AVX, 8 x 8 blocks through registers: element by element, the strided loads were a tenth
// of the attention forward's time at T = 256, D = 64 (perf, AVX2).
template <int D>
void transpose(const float* x, int64_t stride, int64_t T, int64_t Tp, int64_t ld, float* xt) {
  int64_t j0 = 0;
#if defined(__AVX__)
  for (; j0 + 8 <= T; j0 += 8)
    for (int d0 = 0; d0 < D; d0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(x + (j0 + i) * stride + d0);
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(xt + (d0 + i) * ld + j0, r[i]);
    }
#endif
  for (int d = 0; d < D; ++d) {
    float* row = xt + d * ld;
#pragma omp simd
    for (int64_t j = j0; j < T; ++j) row[j] = x[j * stride + d];
    std::fill(row + T, row + Tp, 0.f);
  }
}

int64_t padded(int64_t T) { return (T + kLane - 1) / kLane * kLane; }

// The row stride of the transposed keys and values: one block longer than the rows. A score tile
// reads a column block of D rows; at a power-of-two stride (T = 256: 1 KiB) those rows fall in a
// few of L1's sets and evict each other (the scores ran at half the weighted sums' speed, AVX2).
int64_t transposed_stride(int64_t T) { return padded(T) + kLane; }

// s[j] = exp(s[j] - max) for the n scores of a row and 0 for the rest of its `width` (a multiple
// of kLane: the blocks the scores were computed in); returns their sum, and the max in m. In
// vector registers throughout: a scalar max and a reduction loop around exp did not vectorize.
inline float softmax_numerators(float* s, int64_t n, int64_t width, float& m) {
  if (n == 0) {  // a padding row
    std::fill(s, s + width, 0.f);
    m = 0.f;
    return 1.f;
  }
  std::fill(s + n, s + width, -std::numeric_limits<float>::infinity());  // exp gives 0 there
  Lanes top = load(s);
  for (int64_t b = kLane; b < width; b += kLane) {
    const Lanes x = load(s + b);
    top = x > top ? x : top;
  }
  m = top[0];
  for (int l = 1; l < kLane; ++l) m = std::max(m, top[l]);
#pragma omp simd
  for (int64_t j = 0; j < width; ++j) s[j] = vexp(s[j] - m);
  Lanes acc = {};
  for (int64_t b = 0; b < width; b += kLane) acc += load(s + b);
  float total = 0.f;
  for (int l = 0; l < kLane; ++l) total += acc[l];
  return total;
}

// dst[0, D) = src[0, D) in vector registers. A head's row is 64 to 512 bytes: std::copy made each
// one a call to memmove, a visible share of the attention backward's perf samples (BENCHMARKS.md, "Tuned CPU paths").
template <int D>
inline void copy_row(const float* src, float* dst) {
  for (int c = 0; c < D; c += kLane) store(dst + c, load(src + c));
}

// One (sequence, head) of the fused q/k/v (B, T, 3C): where its queries, keys and values start
// (positions 3C floats apart), and its keys transposed into kt (D, Tp), rows ld apart.
struct Head {
  const float *q, *k, *v;
};

template <int D>
Head head(const float* base, int64_t bh, int64_t T, int64_t H, int64_t Tp, int64_t ld, float* kt) {
  const int64_t b = bh / H, h = bh % H, C = H * D;
  const float* q = base + b * T * 3 * C + h * D;
  transpose<D>(q + C, 3 * C, T, Tp, ld, kt);
  return {q, q + C, q + 2 * C};
}

template <int D>
void attention_forward_heads(const float* base, int64_t B, int64_t T, int64_t H, bool causal, float* out,
                             float* lse) {
  constexpr int R = kTile<D>;
  const int64_t C = H * D, Tp = padded(T), Tk = transposed_stride(T);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * Tk), s(R * Tp), o(R * D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const auto [q, k, v] = head<D>(base, bh, T, H, Tp, Tk, kt.data());
      for (int64_t i0 = 0; i0 < T; i0 += R) {
        const int64_t rows = std::min<int64_t>(R, T - i0), keys = causal ? i0 + rows : T;
        const int64_t nb = (keys + kLane - 1) / kLane;
        const float* qr[R];
        for (int r = 0; r < R; ++r) qr[r] = q + std::min(i0 + r, T - 1) * 3 * C;
        score_tile<D, R>(qr, kt.data(), Tk, nb, scale, s.data(), Tp);
        float sum[R];
        for (int r = 0; r < R; ++r) {
          const int64_t n = r < rows ? (causal ? i0 + r + 1 : T) : 0;
          float m;
          sum[r] = softmax_numerators(s.data() + r * Tp, n, nb * kLane, m);
          if (r < rows) lse[bh * T + i0 + r] = m + std::log(sum[r]);
        }
        weighted_tile<D, R>(s.data(), Tp, v, 3 * C, keys, o.data());
        for (int r = 0; r < rows; ++r) {
          float* dst = out + (b * T + i0 + r) * C + h * D;
          const float inv = 1.f / sum[r];
#pragma omp simd
          for (int d = 0; d < D; ++d) dst[d] = o[r * D + d] * inv;
        }
      }
    }
  });
}

// The queries the backward takes at a time. Their weights and score gradients are kept (twice
// kQueryBlock x T floats) so that each tile of keys then sums its key and value gradients over all
// of them in registers. A tile of queries at a time, adding its share to every key's gradient
// rows in memory, was much of the backward (BENCHMARKS.md, "Tuned CPU paths"). Linear in T, and a
// multiple of every tile size.
constexpr int64_t kQueryBlock = 64;

template <int D>
void attention_backward_heads(const float* base, const float* dy, const float* out, const float* lse, int64_t B,
                              int64_t T, int64_t H, bool causal, float* dbase) {
  constexpr int R = kTile<D>;
  static_assert(kQueryBlock % R == 0, "a block of queries is whole tiles");
  const int64_t C = H * D, Tp = padded(T), Tk = transposed_stride(T);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    // dk and dv have R - 1 rows past T, for a last tile of keys that T does not fill; never copied.
    std::vector<float> kt(D * Tk), vt(D * Tk), dk((T + R) * D), dv((T + R) * D), p(kQueryBlock * Tk),
        ds(kQueryBlock * Tk), dq(R * D);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const auto [q, k, v] = head<D>(base, bh, T, H, Tp, Tk, kt.data());
      transpose<D>(v, 3 * C, T, Tp, Tk, vt.data());
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t a = 0; a < T; a += kQueryBlock) {
        const int64_t a1 = std::min(T, a + kQueryBlock);
        for (int64_t i0 = a; i0 < a1; i0 += R) {
          const int64_t rows = std::min<int64_t>(R, T - i0), keys = causal ? i0 + rows : T;
          const int64_t nb = (keys + kLane - 1) / kLane;
          float* pi = p.data() + (i0 - a) * Tk;
          float* dsi = ds.data() + (i0 - a) * Tk;
          const float *qr[R], *dyr[R];
          for (int r = 0; r < R; ++r) {
            const int64_t i = std::min(i0 + r, T - 1);
            qr[r] = q + i * 3 * C;
            dyr[r] = dy + (b * T + i) * C + h * D;
          }
          // The weights again, from the saved log-sum-exp (p_j = exp(s_j - lse_i)), and
          // dP_j = dy_i . v_j through the transposed values.
          score_tile<D, R>(qr, kt.data(), Tk, nb, scale, pi, Tk);
          score_tile<D, R>(dyr, vt.data(), Tk, nb, 1.f, dsi, Tk);
          for (int r = 0; r < R; ++r) {
            float* pr = pi + r * Tk;
            float* dsr = dsi + r * Tk;
            const int64_t n = r < rows ? (causal ? i0 + r + 1 : T) : 0;
            if (n > 0) {
              const float l = lse[bh * T + i0 + r];
              // Softmax backward: dS_j = p_j (dP_j - sum_j p_j dP_j), and that sum is dy_i . y_i.
              const float* y_i = out + (b * T + i0 + r) * C + h * D;
              float dot = 0.f;
#pragma omp simd reduction(+ : dot)
              for (int d = 0; d < D; ++d) dot += dyr[r][d] * y_i[d];
#pragma omp simd
              for (int64_t j = 0; j < n; ++j) {
                pr[j] = vexp(pr[j] - l);
                dsr[j] = pr[j] * (dsr[j] - dot) * scale;
              }
            }
            // Later keys, or a padding row: no weight, no gradient. The key tiles below read the
            // zeros above the diagonal (keys j in the tile of a query i < j).
            std::fill(pr + n, pr + keys, 0.f);
            std::fill(dsr + n, dsr + keys, 0.f);
          }
          weighted_tile<D, R>(dsi, Tk, k, 3 * C, keys, dq.data());
          for (int r = 0; r < rows; ++r)
            copy_row<D>(dq.data() + r * D, dbase + (b * T + i0 + r) * 3 * C + h * D);
        }
        // The block's share of dK_j = sum_i dS_ij q_i and dV_j = sum_i P_ij dy_i, over its queries
        // i >= j when causal: tiles of keys, aligned with the query tiles, start at their own.
        const int64_t keys = causal ? a1 : T;
        for (int64_t j0 = 0; j0 < keys; j0 += R) {
          const int64_t i0 = causal ? std::max(a, j0) : a, w0 = (i0 - a) * Tk + j0;
          key_tile<D, R>(ds.data() + w0, Tk, q + i0 * 3 * C, 3 * C, a1 - i0, dk.data() + j0 * D);
          key_tile<D, R>(p.data() + w0, Tk, dy + (b * T + i0) * C + h * D, C, a1 - i0, dv.data() + j0 * D);
        }
      }
      for (int64_t j = 0; j < T; ++j) {
        float* row = dbase + (b * T + j) * 3 * C + h * D;
        copy_row<D>(dk.data() + j * D, row + C);
        copy_row<D>(dv.data() + j * D, row + 2 * C);
      }
    }
  });
}

// The head sizes the kernels are built for; the Python side sends others to PyTorch.
#define ATTNLAB_HEAD_DIMS(D, CALL) \
  switch (D) {                     \
    case 16: CALL(16); break;      \
    case 32: CALL(32); break;      \
    case 64: CALL(64); break;      \
    case 128: CALL(128); break;    \
    default: TORCH_CHECK(false, "head size ", D, " is not one of 16, 32, 64, 128"); \
  }

std::vector<at::Tensor> attention_forward(const at::Tensor& qkv, int64_t n_heads, bool causal) {
  check_float_cpu(qkv, "qkv");
  TORCH_CHECK(qkv.dim() == 3 && qkv.size(2) % (3 * n_heads) == 0, "qkv must be (B, T, 3C) with C divisible by heads");
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_heads, D = C / H;
  at::Tensor y = at::empty({B, T, C}, qkv.options());
  at::Tensor lse = at::empty({B, H, T}, qkv.options());
#define ATTNLAB_FORWARD(d) \
  attention_forward_heads<d>(qkv.data_ptr<float>(), B, T, H, causal, y.data_ptr<float>(), lse.data_ptr<float>())
  ATTNLAB_HEAD_DIMS(D, ATTNLAB_FORWARD)
#undef ATTNLAB_FORWARD
  return {y, lse};
}

at::Tensor attention_backward(const at::Tensor& grad_y, const at::Tensor& qkv, const at::Tensor& y,
                              const at::Tensor& lse, int64_t n_heads, bool causal) {
  for (const auto& [t, name] : {std::pair{&grad_y, "grad_y"}, {&qkv, "qkv"}, {&y, "y"}, {&lse, "lse"}})
    check_float_cpu(*t, name);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_heads, D = C / H;
  TORCH_CHECK(grad_y.sizes() == y.sizes() && y.size(0) == B && y.size(1) == T && y.size(2) == C,
              "grad_y and y must be (B, T, C) of qkv's (B, T, 3C)");
  at::Tensor dqkv = at::empty_like(qkv);
#define ATTNLAB_BACKWARD(d)                                                                                  \
  attention_backward_heads<d>(qkv.data_ptr<float>(), grad_y.data_ptr<float>(), y.data_ptr<float>(),           \
                              lse.data_ptr<float>(), B, T, H, causal, dqkv.data_ptr<float>())
  ATTNLAB_HEAD_DIMS(D, ATTNLAB_BACKWARD)
#undef ATTNLAB_BACKWARD
  return dqkv;
}


// -- A whole pre-norm block ------------------------------------------------------------------------
//
// x + Attention(LN1(x)), then + FFN(LN2(.)), forward and backward in one call each. Around the
// products (PyTorch's, MKL's) the rest is loops over the rows: LayerNorm with its statistics kept
// for the backward, bias and residual added in place, the activation, attention, and the bias
// and LayerNorm gradients as column sums. The activations the backward needs live in buffers the
// block keeps between steps, so a step allocates nothing but its outputs and the gradients
// (fresh allocations of this size are fresh pages from the kernel, faulted in at every step).

constexpr int64_t kRowGrain = 16;

// g = act(h) for n elements, split between the threads.
void activation_forward(const float* h, float* g, int64_t n, int64_t act) {
  at::parallel_for(0, n, kElementGrain,
                   [&](int64_t begin, int64_t end) { attnlab::activate(h + begin, g + begin, end - begin, act); });
}

// dh = dg * act'(h) for n elements (dh may be dg), split between the threads.
void activation_backward(const float* h, const float* dg, float* dh, int64_t n, int64_t act) {
  at::parallel_for(0, n, kElementGrain, [&](int64_t begin, int64_t end) {
    attnlab::activate_backward(h + begin, dg + begin, dh + begin, end - begin, act);
  });
}

// g = act(h) and, over h, slope = act'(h) for n elements, split between the threads.
void activation_with_slope(float* h, float* g, int64_t n, int64_t act) {
  at::parallel_for(0, n, kElementGrain, [&](int64_t begin, int64_t end) {
    attnlab::activate_with_slope(h + begin, g + begin, h + begin, end - begin, act);
  });
}

// dh = dg * slope for n elements, in dg's place, split between the threads.
void scale_by_slope(float* dg, const float* slope, int64_t n) {
  at::parallel_for(0, n, kElementGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) dg[i] *= slope[i];
  });
}

// GELU of x, and its backward, for attnlab.accel.kernels.gelu.
at::Tensor gelu_forward(const at::Tensor& x, bool approximate_tanh) {
  check_float_cpu(x, "x");
  at::Tensor y = at::empty_like(x);
  activation_forward(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),
                     approximate_tanh ? attnlab::kGeluTanh : attnlab::kGelu);
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x, bool approximate_tanh) {
  check_float_cpu(grad, "grad");
  check_float_cpu(x, "x");
  TORCH_CHECK(grad.sizes() == x.sizes(), "grad and x must have the same shape");
  at::Tensor dx = at::empty_like(x);
  activation_backward(x.data_ptr<float>(), grad.data_ptr<float>(), dx.data_ptr<float>(), x.numel(),
                      approximate_tanh ? attnlab::kGeluTanh : attnlab::kGelu);
  return dx;
}

// (act(x), act'(x)) as the fused block's forward computes them, to test them on their own.
std::vector<at::Tensor> activation_and_slope(const at::Tensor& x, int64_t act) {
  check_float_cpu(x, "x");
  TORCH_CHECK(act >= attnlab::kGelu && act <= attnlab::kRelu, "unknown activation code ", act);
  at::Tensor slope = x.contiguous().clone(), y = at::empty_like(slope);
  activation_with_slope(slope.data_ptr<float>(), y.data_ptr<float>(), slope.numel(), act);
  return {y, slope};
}

// y = LN(x) * w + b over rows of C, keeping each row's mean and 1/std.
void layer_norm(const float* x, const float* w, const float* b, int64_t N, int64_t C, float eps, float* y,
                float* mean, float* rstd) {
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * C;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const float m = sum / C;
      float var = 0.f;
#pragma omp simd reduction(+ : var)
      for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
      const float s = 1.f / std::sqrt(var / C + eps);
      float* yr = y + r * C;
      if (b) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c] + b[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * w[c];
      }
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

// out (C,) = the sum of the N rows of a.
void column_sums(const float* a, int64_t N, int64_t C, float* out) {
  at::parallel_for(0, C, kLane, [&](int64_t begin, int64_t end) {
    std::fill(out + begin, out + end, 0.f);
    for (int64_t r = 0; r < N; ++r) {
      const float* ar = a + r * C;
#pragma omp simd
      for (int64_t c = begin; c < end; ++c) out[c] += ar[c];
    }
  });
}

// dx = base + the gradient through LN of dy (base may be dx: the residual's gradient, added in the
// same pass rather than copied in first); dw, db (db may be null) = its parameters' gradients.
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                         int64_t N, int64_t C, const float* base, float* dx, float* dw, float* db) {
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* dyr = dy + r * C;
      const float* xr = x + r * C;
      const float m = mean[r], s = rstd[r];
      float a = 0.f, bsum = 0.f;  // mean of dxhat and of dxhat * xhat, times C
#pragma omp simd reduction(+ : a, bsum)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyr[c] * w[c];
        a += g;
        bsum += g * (xr[c] - m) * s;
      }
      a /= C;
      bsum /= C;
      const float* br = base + r * C;
      float* dxr = dx + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] = br[c] + s * (dyr[c] * w[c] - a - (xr[c] - m) * s * bsum);
    }
  });
  // The parameters' gradients are sums down the columns: each thread takes whole columns.
  at::parallel_for(0, C, kLane, [&](int64_t begin, int64_t end) {
    std::fill(dw + begin, dw + end, 0.f);
    for (int64_t r = 0; r < N; ++r) {
      const float* dyr = dy + r * C;
      const float* xr = x + r * C;
      const float m = mean[r], s = rstd[r];
#pragma omp simd
      for (int64_t c = begin; c < end; ++c) dw[c] += dyr[c] * (xr[c] - m) * s;
    }
  });
  if (db) column_sums(dy, N, C, db);
}

// out = a b into a contiguous out, as zeros plus the product (beta = 1): for beta = 0 MKL clears the
// output in a pass of its own (3% of a block's perf samples at 4x4x128); a memset does it for
// less, ~1% of the block's forward + backward there (benchmarks/kernels_ab.py, both orders).
void product(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(out.is_contiguous(), "product: out must be contiguous");
  std::memset(out.data_ptr<float>(), 0, out.numel() * sizeof(float));
  at::addmm_out(out, out, a, b, 1, 1);
}

// out = a w^T + bias + residual (either may be null; residual has out's rows). out is filled with
// bias + residual first and the product accumulated into it: MKL zero-fills the output of a
// plain product, so adding the bias after would cost that pass and one more.
void product_plus(at::Tensor& out, const at::Tensor& a, const at::Tensor& w, const float* bias, const float* residual) {
  if (!bias && !residual) {
    product(out, a, w.t());
    return;
  }
  const int64_t N = out.size(0), C = out.size(1);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = o + r * C;
      const float* x = residual ? residual + r * C : nullptr;
      if (bias && x) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) row[c] = bias[c] + x[c];
      } else {
        std::copy(bias ? bias : x, (bias ? bias : x) + C, row);
      }
    }
  });
  at::addmm_out(out, out, a, w.t(), 1, 1);
}

// Per part past the first, a set of the block's parameter gradients: that part's share.
using PartialSets = std::vector<std::vector<at::Tensor>>;

// The backward's scratch buffers, shared by every block: blocks run their backward one at a time,
// and one set that stays in cache beats one set per block.
struct Scratch {
  std::mutex lock;
  at::Tensor dg, dln, datt, dqkv;
  PartialSets partial;  // a single block's

  static at::Tensor& fit(at::Tensor& t, at::IntArrayRef shape, const at::TensorOptions& o) {
    if (!t.defined() || t.sizes() != shape) t = at::empty(shape, o);
    return t;
  }
};

Scratch& scratch() {
  static Scratch s;
  return s;
}

const float* ptr_or_null(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }
float* mutable_or_null(at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

// The parameters of a block, in the order of attnlab/accel/kernels.py: LN1 weight and bias, q/k/v
// weight and bias, output weight and bias, LN2 weight and bias, FFN weights and biases. A bias
// is an empty tensor when the block has none.
enum Param { kLn1W, kLn1B, kQkvW, kQkvB, kOutW, kOutB, kLn2W, kLn2B, kFc1W, kFc1B, kFc2W, kFc2B, kParams };

// f(b0, b1) over the sequences [0, B) in one part per thread, each part single-threaded (a
// product, or an at::parallel_for, inside a parallel region runs on the calling thread). A block
// is independent per sequence up to its parameters' gradients, so each thread takes its
// sequences through the whole block with no synchronisation between the ~20 steps of a block's
// backward; where every step was split between the threads, they waited on each other at every
// one. f's third argument numbers the parts, from 0, below at::get_num_threads().
template <class F>
void by_sequences(int64_t B, const F& f) {
  const int64_t threads = at::get_num_threads();
  if (threads < 2 || B < 2 || at::in_parallel_region()) {
    f(0, B, 0);
    return;
  }
  const int64_t per = (B + threads - 1) / threads;
  at::parallel_for(0, B, per, [&](int64_t b0, int64_t b1) {
    at::NoGradGuard no_grad;  // grad mode is per thread: the worker's is on (the weights require grad)
    f(b0, b1, b0 / per);  // parts are at least `per` long: distinct numbers
  });
}

// grads[1 + i] += partial[k - 1][i] for each part k > 0 that ran: every parameter's gradient is the
// sum over the parts. One pass, split by elements between the threads.
void add_parts(std::vector<at::Tensor>& grads, const PartialSets& partial,
               const std::vector<char>& ran) {
  std::vector<std::pair<float*, std::vector<const float*>>> sums;
  std::vector<int64_t> ends;  // cumulative element counts
  int64_t total = 0;
  for (int i = 0; i < kParams; ++i) {
    if (!grads[1 + i].numel()) continue;
    std::vector<const float*> from;
    for (size_t k = 1; k < ran.size(); ++k)
      if (ran[k]) from.push_back(partial[k - 1][i].data_ptr<float>());
    sums.emplace_back(grads[1 + i].data_ptr<float>(), std::move(from));
    ends.push_back(total += grads[1 + i].numel());
  }
  at::parallel_for(0, total, kElementGrain, [&](int64_t begin, int64_t end) {
    for (size_t t = 0; t < sums.size(); ++t) {
      const int64_t start = t ? ends[t - 1] : 0, lo = std::max(begin, start), hi = std::min(end, ends[t]);
      if (lo >= hi) continue;
      float* g = sums[t].first - start;
      for (const float* f : sums[t].second) {
        f -= start;
#pragma omp simd
        for (int64_t e = lo; e < hi; ++e) g[e] += f[e];
      }
    }
  });
}

class PreNormBlock {
 public:
  PreNormBlock(int64_t n_heads, bool causal, int64_t act, double eps)
      : H_(n_heads), causal_(causal), act_(act), eps_(static_cast<float>(eps)) {}

  // x (B, T, C) -> the block's output (B, T, C); keeps what the backward needs until the next call.
  at::Tensor forward(const at::Tensor& x, const std::vector<at::Tensor>& p) {
    at::Tensor y = start_forward(x, p);
    by_sequences(B_, [&](int64_t b0, int64_t b1, int64_t) { forward_part(b0, b1, y); });
    return y;
  }

  // dy (B, T, C) -> [dx, then the gradient of each parameter (empty for a missing bias)].
  std::vector<at::Tensor> backward(const at::Tensor& dy) {
    Scratch& work = scratch();
    std::lock_guard<std::mutex> hold(work.lock);
    std::vector<at::Tensor> grads = start_backward(dy, work, work.partial);
    std::vector<char> ran(work.partial.size() + 1, 0);
    by_sequences(B_, [&](int64_t b0, int64_t b1, int64_t part) {
      backward_part(b0, b1, part, dy, work, grads, work.partial);
      ran[part] = 1;
    });
    finish_backward(grads, work.partial, ran);
    return grads;
  }

  // A forward in three steps, for PreNormStack to run several blocks' parts in one parallel
  // region: start_forward checks x and p, keeps them and returns the output, uninitialised;
  // forward_part(b0, b1, y) then fills y's rows of sequences [b0, b1) (it reads only x's rows of
  // those sequences, so a part may run as soon as the rows it reads are written).
  at::Tensor start_forward(const at::Tensor& x, const std::vector<at::Tensor>& p) {
    check_float_cpu(x, "x");
    TORCH_CHECK(x.dim() == 3, "x must be (B, T, C)");
    TORCH_CHECK(static_cast<int64_t>(p.size()) == kParams, "expected ", kParams, " parameters");
    for (const auto& t : p)
      if (t.numel()) check_float_cpu(t, "a block parameter");
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), F = p[kFc1W].size(0);
    TORCH_CHECK(C % H_ == 0, "width ", C, " is not divisible by ", H_, " heads");
    reserve(x, B, T, C, F);
    x_ = x;
    p_ = p;
    return at::empty({B, T, C}, x.options());
  }

  // The backward likewise: start_backward checks dy, fits the scratch buffers (held locked by the
  // caller) and `partial` (a set of parameter gradients per part past the first), and returns
  // [dx, parameter gradients], uninitialised; backward_part fills dx's rows of sequences [b0, b1)
  // and adds their share of the parameter gradients (into the gradients for part 0, into
  // partial[part - 1] for the others); finish_backward sums the parts that ran.
  std::vector<at::Tensor> start_backward(const at::Tensor& dy, Scratch& work, PartialSets& partial) {
    TORCH_CHECK(x_.defined(), "backward before forward");
    check_float_cpu(dy, "dy");
    TORCH_CHECK(dy.sizes() == x_.sizes(), "dy must have the shape of x");
    const int64_t N = B_ * T_;
    const auto o = dy.options();
    Scratch::fit(work.dg, {N, F_}, o);
    Scratch::fit(work.dln, {N, C_}, o);
    Scratch::fit(work.datt, {N, C_}, o);
    Scratch::fit(work.dqkv, {N, 3 * C_}, o);
    std::vector<at::Tensor> grads(kParams + 1);
    grads[0] = at::empty({B_, T_, C_}, o);
    for (int i = 0; i < kParams; ++i) grads[1 + i] = at::empty(p_[i].sizes(), o);  // empty for a missing bias
    partial.resize(std::max<int64_t>(at::get_num_threads() - 1, 0));
    for (auto& set : partial) {
      set.resize(kParams);
      for (int i = 0; i < kParams; ++i) Scratch::fit(set[i], p_[i].sizes(), o);
    }
    return grads;
  }

  void finish_backward(std::vector<at::Tensor>& grads, const PartialSets& partial, const std::vector<char>& ran) {
    add_parts(grads, partial, ran);
    x_ = at::Tensor();  // one backward per forward
    p_.clear();
  }

  int64_t batch() const { return B_; }

  // The forward of sequences [b0, b1).
  void forward_part(int64_t b0, int64_t b1, at::Tensor& y) {
    const auto& p = p_;
    const int64_t C = C_, F = F_, r0 = b0 * T_, rows = (b1 - b0) * T_;
    const float* x = x_.data_ptr<float>() + r0 * C;
    layer_norm(x, p[kLn1W].data_ptr<float>(), ptr_or_null(p[kLn1B]), rows, C, eps_, at_row(ln1_, r0),
               mean1_.data_ptr<float>() + r0, rstd1_.data_ptr<float>() + r0);
    at::Tensor qkv = part(qkv_, r0, rows);
    product_plus(qkv, part(ln1_, r0, rows), p[kQkvW], ptr_or_null(p[kQkvB]), nullptr);
    attend(b0, b1);
    at::Tensor x2 = part(x2_, r0, rows);
    product_plus(x2, part(att_, r0, rows), p[kOutW], ptr_or_null(p[kOutB]), x);
    layer_norm(at_row(x2_, r0), p[kLn2W].data_ptr<float>(), ptr_or_null(p[kLn2B]), rows, C, eps_, at_row(ln2_, r0),
               mean2_.data_ptr<float>() + r0, rstd2_.data_ptr<float>() + r0);
    at::Tensor h = part(h_, r0, rows);
    product_plus(h, part(ln2_, r0, rows), p[kFc1W], ptr_or_null(p[kFc1B]), nullptr);
    activation_with_slope(at_row(h_, r0), at_row(g_, r0), rows * F, act_);  // h_ now holds act'(h)
    at::Tensor y2d = part(y.view({B_ * T_, C}), r0, rows);
    product_plus(y2d, part(g_, r0, rows), p[kFc2W], ptr_or_null(p[kFc2B]), at_row(x2_, r0));
  }

  // The backward of sequences [b0, b1) as part `part`: their rows of dx (grads[0]), and their share
  // of each parameter's gradient, written to grads[1 + i] for part 0 and to partial[part - 1][i]
  // for the others.
  void backward_part(int64_t b0, int64_t b1, int64_t part_no, const at::Tensor& dy, Scratch& work,
                     std::vector<at::Tensor>& grads, PartialSets& partial) {
    std::vector<at::Tensor> out(kParams);
    for (int i = 0; i < kParams; ++i) out[i] = part_no == 0 ? grads[1 + i] : partial[part_no - 1][i];
    backward_rows(b0, b1, dy, work, grads[0], out);
  }

 private:
  void reserve(const at::Tensor& x, int64_t B, int64_t T, int64_t C, int64_t F) {
    const int64_t N = B * T;
    if (ln1_.defined() && B == B_ && T == T_ && C == C_ && F == F_) return;
    B_ = B, T_ = T, C_ = C, F_ = F;
    const auto o = x.options();
    ln1_ = at::empty({N, C}, o), ln2_ = at::empty({N, C}, o), x2_ = at::empty({N, C}, o), att_ = at::empty({N, C}, o);
    mean1_ = at::empty({N}, o), rstd1_ = at::empty({N}, o), mean2_ = at::empty({N}, o), rstd2_ = at::empty({N}, o);
    qkv_ = at::empty({N, 3 * C}, o), lse_ = at::empty({B, H_, T}, o);
    h_ = at::empty({N, F}, o), g_ = at::empty({N, F}, o);
  }

  // Rows [r0, r0 + rows) of a (N, k) buffer.
  static at::Tensor part(const at::Tensor& t, int64_t r0, int64_t rows) { return t.narrow(0, r0, rows); }

  static float* at_row(const at::Tensor& t, int64_t r0) { return t.data_ptr<float>() + r0 * t.size(1); }

  // The backward of sequences [b0, b1): their rows of dx, and their share of each parameter's
  // gradient written to `out`.
  void backward_rows(int64_t b0, int64_t b1, const at::Tensor& dy, Scratch& work, at::Tensor& dx,
                     std::vector<at::Tensor>& out) {
    const auto& p = p_;
    const int64_t C = C_, F = F_, r0 = b0 * T_, rows = (b1 - b0) * T_;
    const at::Tensor dyp = part(dy.view({B_ * T_, C}), r0, rows);
    at::Tensor dg = part(work.dg, r0, rows), dln = part(work.dln, r0, rows);
    at::Tensor datt = part(work.datt, r0, rows), dqkv = part(work.dqkv, r0, rows);
    at::Tensor dxp = part(dx.view({B_ * T_, C}), r0, rows);
    // y = x2 + g W2^T + b2
    product(out[kFc2W], dyp.t(), part(g_, r0, rows));
    if (out[kFc2B].numel()) column_sums(dyp.data_ptr<float>(), rows, C, out[kFc2B].data_ptr<float>());
    product(dg, dyp, p[kFc2W]);
    scale_by_slope(dg.data_ptr<float>(), at_row(h_, r0), rows * F);  // now dh
    product(out[kFc1W], dg.t(), part(ln2_, r0, rows));
    if (out[kFc1B].numel()) column_sums(dg.data_ptr<float>(), rows, F, out[kFc1B].data_ptr<float>());
    product(dln, dg, p[kFc1W]);
    // dx2 = dy + LN2'(dln2), in dx's rows
    layer_norm_backward(dln.data_ptr<float>(), at_row(x2_, r0), mean2_.data_ptr<float>() + r0,
                        rstd2_.data_ptr<float>() + r0, p[kLn2W].data_ptr<float>(), rows, C, dyp.data_ptr<float>(),
                        dxp.data_ptr<float>(), out[kLn2W].data_ptr<float>(), mutable_or_null(out[kLn2B]));
    // x2 = x + att Wo^T + bo
    product(out[kOutW], dxp.t(), part(att_, r0, rows));
    if (out[kOutB].numel()) column_sums(dxp.data_ptr<float>(), rows, C, out[kOutB].data_ptr<float>());
    product(datt, dxp, p[kOutW]);
    attend_backward(b0, b1, datt, dqkv);
    product(out[kQkvW], dqkv.t(), part(ln1_, r0, rows));
    if (out[kQkvB].numel()) column_sums(dqkv.data_ptr<float>(), rows, 3 * C, out[kQkvB].data_ptr<float>());
    product(dln, dqkv, p[kQkvW]);
    // dx = dx2 + LN1'(dln1)
    layer_norm_backward(dln.data_ptr<float>(), x_.data_ptr<float>() + r0 * C, mean1_.data_ptr<float>() + r0,
                        rstd1_.data_ptr<float>() + r0, p[kLn1W].data_ptr<float>(), rows, C, dxp.data_ptr<float>(),
                        dxp.data_ptr<float>(), out[kLn1W].data_ptr<float>(), mutable_or_null(out[kLn1B]));
  }

  void attend(int64_t b0, int64_t b1) {
    const int64_t D = C_ / H_, r0 = b0 * T_;
#define ATTNLAB_BLOCK_FORWARD(d)                                                                        \
  attention_forward_heads<d>(at_row(qkv_, r0), b1 - b0, T_, H_, causal_, at_row(att_, r0), \
                             lse_.data_ptr<float>() + b0 * H_ * T_)
    ATTNLAB_HEAD_DIMS(D, ATTNLAB_BLOCK_FORWARD)
#undef ATTNLAB_BLOCK_FORWARD
  }

  // dqkv (the part's rows) = the gradient of the q/k/v from datt, that of the attention's output.
  void attend_backward(int64_t b0, int64_t b1, const at::Tensor& datt, at::Tensor& dqkv) {
    const int64_t D = C_ / H_, r0 = b0 * T_;
#define ATTNLAB_BLOCK_BACKWARD(d)                                                                    \
  attention_backward_heads<d>(at_row(qkv_, r0), datt.data_ptr<float>(), at_row(att_, r0),            \
                              lse_.data_ptr<float>() + b0 * H_ * T_, b1 - b0, T_, H_, causal_, \
                              dqkv.data_ptr<float>())
    ATTNLAB_HEAD_DIMS(D, ATTNLAB_BLOCK_BACKWARD)
#undef ATTNLAB_BLOCK_BACKWARD
  }

  int64_t H_;
  bool causal_;
  int64_t act_;
  float eps_;
  int64_t B_ = 0, T_ = 0, C_ = 0, F_ = 0;
  at::Tensor x_;
  std::vector<at::Tensor> p_;
  // h_: fc1's output, then (from the activation on) the activation's slope there.
  at::Tensor ln1_, mean1_, rstd1_, qkv_, att_, lse_, x2_, ln2_, mean2_, rstd2_, h_, g_;
};

// A stack of pre-norm blocks (a GPT's), each taking the one before's output: the whole stack in
// one parallel region forward and one backward. Each thread takes its sequences through every
// block, as through one block's steps; called a block at a time, the threads met at the end of
// each block, and the Python between the calls (a few tens of microseconds each, slowed by caches
// the blocks had just filled) left one thread waiting.
class PreNormStack {
 public:
  PreNormStack(int64_t n_blocks, int64_t n_heads, bool causal, int64_t act, double eps)
      : blocks_(n_blocks, PreNormBlock(n_heads, causal, act, eps)), partial_(n_blocks) {
    TORCH_CHECK(n_blocks > 0, "a stack needs at least one block");
  }

  // x (B, T, C) and every block's parameters in turn, in PreNormBlock's order -> the last
  // block's output (B, T, C).
  at::Tensor forward(const at::Tensor& x, const std::vector<at::Tensor>& p) {
    const size_t n = blocks_.size();
    TORCH_CHECK(p.size() == n * kParams, "expected ", n * kParams, " parameters, ", kParams, " per block");
    std::vector<at::Tensor> ys(n);
    for (size_t i = 0; i < n; ++i) {
      ys[i] = blocks_[i].start_forward(i ? ys[i - 1] : x, {p.begin() + i * kParams, p.begin() + (i + 1) * kParams});
      // The blocks share one set of scratch buffers in the backward, fitted to the first.
      TORCH_CHECK(p[i * kParams + kFc1W].sizes() == p[kFc1W].sizes(), "every block of a stack must have the same FFN size");
    }
    by_sequences(blocks_[0].batch(), [&](int64_t b0, int64_t b1, int64_t) {
      for (size_t i = 0; i < n; ++i) blocks_[i].forward_part(b0, b1, ys[i]);
    });
    return ys.back();
  }

  // dy (B, T, C) -> [dx, then every block's parameter gradients in the order of forward's p].
  std::vector<at::Tensor> backward(const at::Tensor& dy) {
    const size_t n = blocks_.size();
    Scratch& work = scratch();
    std::lock_guard<std::mutex> hold(work.lock);
    std::vector<std::vector<at::Tensor>> grads(n);
    for (size_t i = n; i-- > 0;) grads[i] = blocks_[i].start_backward(i + 1 < n ? grads[i + 1][0] : dy, work, partial_[i]);
    std::vector<char> ran(partial_[0].size() + 1, 0);
    by_sequences(blocks_[0].batch(), [&](int64_t b0, int64_t b1, int64_t part) {
      for (size_t i = n; i-- > 0;)
        blocks_[i].backward_part(b0, b1, part, i + 1 < n ? grads[i + 1][0] : dy, work, grads[i], partial_[i]);
      ran[part] = 1;
    });
    std::vector<at::Tensor> out{grads[0][0]};
    for (size_t i = 0; i < n; ++i) {
      blocks_[i].finish_backward(grads[i], partial_[i], ran);
      out.insert(out.end(), grads[i].begin() + 1, grads[i].end());
    }
    return out;
  }

 private:
  std::vector<PreNormBlock> blocks_;
  std::vector<PartialSets> partial_;  // each block's: they are summed after every block's backward
};

// ---- The optimizer step: the gradients' global norm, then AdamW with the clipping folded in ----
//
// PyTorch's clip_grad_norm_ and fused AdamW take a small model's parameters one tensor at a time
// (a 4-layer, 128-wide GPT has 52), each a parallel region of its own (benchmarks/optimizer_step.py;
// BENCHMARKS.md, "Tuned CPU paths"). Here every tensor is cut into
// fixed chunks, and the threads share out the chunks of all tensors at once, evenly by elements.

constexpr int64_t kChunk = 1 << 13;

struct Chunk {
  int64_t tensor, begin, end;
};

std::vector<Chunk> chunks_of(const std::vector<at::Tensor>& ts) {
  std::vector<Chunk> out;
  for (int64_t i = 0; i < static_cast<int64_t>(ts.size()); ++i)
    for (int64_t b = 0; b < ts[i].numel(); b += kChunk) out.push_back({i, b, std::min(b + kChunk, ts[i].numel())});
  return out;
}

// f(c0, c1) for the threads' shares of the chunks, cut where their elements, not their count,
// split evenly: ClippingAdamW's groups put the weights (full chunks) first and the biases and
// LayerNorms (a small chunk each) last, and an even count gave one thread far more elements
// than the other.
template <class F>
void for_chunks(const std::vector<Chunk>& work, const F& f) {
  const int64_t parts = std::max<int64_t>(std::min<int64_t>(at::get_num_threads(), work.size()), 1);
  int64_t total = 0;
  for (const Chunk& c : work) total += c.end - c.begin;
  std::vector<int64_t> bounds(parts + 1, static_cast<int64_t>(work.size()));
  bounds[0] = 0;
  int64_t seen = 0, c = 0;
  for (int64_t k = 1; k < parts; ++k) {
    for (; c < static_cast<int64_t>(work.size()) && seen < total * k / parts; ++c) seen += work[c].end - work[c].begin;
    bounds[k] = c;
  }
  at::parallel_for(0, parts, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) f(bounds[k], bounds[k + 1]);
  });
}

// sqrt of the sum of the squares of every element of every tensor. Each chunk's sum is a double
// and the chunks are added in order, so the result does not depend on the number of threads.
double global_norm(const std::vector<at::Tensor>& grads) {
  for (const auto& g : grads) check_float_cpu(g, "gradient");
  const std::vector<Chunk> work = chunks_of(grads);
  std::vector<double> sums(work.size());
  for_chunks(work, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const float* g = grads[work[c].tensor].data_ptr<float>();
      Lanes acc = {};
      int64_t i = work[c].begin;
      for (; i + kLane <= work[c].end; i += kLane) {
        const Lanes v = load(g + i);
        acc += v * v;
      }
      double s = 0;
      for (int l = 0; l < kLane; ++l) s += acc[l];
      for (; i < work[c].end; ++i) s += static_cast<double>(g[i]) * g[i];
      sums[c] = s;
    }
  });
  double total = 0;
  for (double s : sums) total += s;
  return std::sqrt(total);
}

// One AdamW step (Loshchilov & Hutter 2019) of every parameter, in place: the arithmetic of
// torch.optim.AdamW(fused=True) with amsgrad and maximize off, on the gradients times
// grad_factor (the clipping factor). Per tensor i, with its group's settings (lr, weight decay
// wd, b1, b2, eps at index i), its step count t (a float32 scalar, as PyTorch keeps it) goes up by
// one, then
//   p *= 1 - lr wd;  m += (1 - b1) (g - m);  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                const std::vector<at::Tensor>& steps, const std::vector<double>& lr,
                const std::vector<double>& weight_decay, const std::vector<double>& beta1,
                const std::vector<double>& beta2, const std::vector<double>& eps, double grad_factor) {
  const size_t n = params.size();
  for (const auto* v : {&lr, &weight_decay, &beta1, &beta2, &eps}) TORCH_CHECK(v->size() == n, "one setting per parameter");
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && steps.size() == n,
              "one gradient and state per parameter");
  struct Setting {
    float decay, step_size, inv_bc2_sqrt, b1, b2, eps;
  };
  std::vector<Setting> settings(n);
  for (size_t i = 0; i < n; ++i) {
    for (const auto* t : {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]}) check_float_cpu(*t, "AdamW tensor");
    TORCH_CHECK(grads[i].numel() == params[i].numel() && exp_avgs[i].numel() == params[i].numel() &&
                    exp_avg_sqs[i].numel() == params[i].numel(),
                "a gradient or state of another size than its parameter");
    TORCH_CHECK(steps[i].numel() == 1 && steps[i].scalar_type() == at::kFloat && steps[i].device().is_cpu(),
                "a step count must be a float32 scalar on the CPU");
    float* step = steps[i].data_ptr<float>();
    *step += 1;
    const double bc1 = 1 - std::pow(beta1[i], static_cast<double>(*step));
    const double bc2 = 1 - std::pow(beta2[i], static_cast<double>(*step));
    settings[i] = {static_cast<float>(1 - lr[i] * weight_decay[i]),
                   static_cast<float>(lr[i] / bc1),
                   static_cast<float>(1 / std::sqrt(bc2)),
                   static_cast<float>(beta1[i]),
                   static_cast<float>(beta2[i]),
                   static_cast<float>(eps[i])};
  }
  const float factor = grad_factor;
  const std::vector<Chunk> work = chunks_of(params);
  for_chunks(work, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t t = work[c].tensor;
      const Setting s = settings[t];
      float* p = params[t].data_ptr<float>();
      const float* g = grads[t].data_ptr<float>();
      float* m = exp_avgs[t].data_ptr<float>();
      float* v = exp_avg_sqs[t].data_ptr<float>();
#pragma omp simd
      for (int64_t i = work[c].begin; i < work[c].end; ++i) {
        const float gi = g[i] * factor;
        const float mi = m[i] + (1 - s.b1) * (gi - m[i]);
        const float vi = s.b2 * v[i] + (1 - s.b2) * gi * gi;
        m[i] = mi, v[i] = vi;
        p[i] = p[i] * s.decay - s.step_size * mi / (std::sqrt(vi) * s.inv_bc2_sqrt + s.eps);
      }
    }
  });
}


// ---- Cross-entropy over a large vocabulary, from bf16 or fp32 logits ----
//
// A masked-LM step scores ~1,600 positions against 16,000 words. PyTorch's loss of bf16 logits
// (autocast) first copies them to fp32, writes the log-softmax (fp32 again), and its backward
// reads both and writes the gradient, a large share of the whole step (benchmarks/mlm_step.py;
// BENCHMARKS.md, "Tuned CPU paths"). Here each row is read into an fp32 scratch row, its
// log-sum-exp and loss computed there, and the backward writes the gradient straight in the
// logits' dtype: one read of the logits forward, one read and one write backward.

// bf16 <-> fp32 as bit operations, so that the loops vectorize. fp32 -> bf16 rounds to nearest
// even, as PyTorch's conversion does (NaN is not expected in a gradient and is not special-cased).
ATTNLAB_VECTOR_FN float bf16_to_float(uint16_t b) { return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16); }

ATTNLAB_VECTOR_FN uint16_t float_to_bf16(float f) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, f);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// The row loops run in 512-bit registers where the CPU has them: -march=native leaves GCC at 256
// bits (its default for some CPUs with AVX-512), and exp over 26M logits is this kernel's work.
// (Separate functions: the attribute does not reach into the parallel_for lambdas.)
#define ATTNLAB_WIDE __attribute__((target("prefer-vector-width=512"), noinline))

// Row r of the logits as fp32 in `row` (V floats).
ATTNLAB_WIDE void read_row(const at::Tensor& logits, int64_t r, float* row) {
  const int64_t V = logits.size(1);
  if (logits.scalar_type() == at::kFloat) {
    const float* x = logits.data_ptr<float>() + r * V;
    std::copy(x, x + V, row);
  } else {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(logits.data_ptr<at::BFloat16>()) + r * V;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) row[j] = bf16_to_float(x[j]);
  }
}

// log sum_j exp(row_j). (The max as a plain comparison: with std::max, or with the row's sum in
// the same loop, GCC's reduction ran several times slower.)
ATTNLAB_WIDE float row_lse(const float* row, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) m = m > row[j] ? m : row[j];
  float z = 0.f;
#pragma omp simd reduction(+ : z)
  for (int64_t j = 0; j < V; ++j) z += vexp(row[j] - m);
  return m + std::log(z);
}

ATTNLAB_WIDE float row_sum(const float* row, int64_t V) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < V; ++j) sum += row[j];
  return sum;
}

// row_j <- g exp(row_j - lse) - c, in place.
ATTNLAB_WIDE void scaled_softmax(float* row, int64_t V, float g, float lse, float c) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) row[j] = g * vexp(row[j] - lse) - c;
}

ATTNLAB_WIDE void write_bf16(const float* row, int64_t V, uint16_t* y) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) y[j] = float_to_bf16(row[j]);
}

void check_logits(const at::Tensor& logits, const at::Tensor& target) {
  TORCH_CHECK(logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous(),
              "logits must be a contiguous (N, V) CPU tensor");
  TORCH_CHECK(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16,
              "logits must be float32 or bfloat16");
  TORCH_CHECK(target.device().is_cpu() && target.scalar_type() == at::kLong && target.dim() == 1 &&
                  target.is_contiguous() && target.size(0) == logits.size(0),
              "target must be a contiguous (N,) int64 CPU tensor");
}

// Per row r with target t (rows whose target is ignore_index give 0 and are skipped):
//   lse = log sum_j exp(x_j),  loss = lse - (1 - s) x_t - s mean_j x_j   (s: label smoothing).
// Returns (loss (N,), lse (N,)), fp32. A target outside [0, V) is an error.
std::vector<at::Tensor> cross_entropy_forward(const at::Tensor& logits, const at::Tensor& target,
                                              int64_t ignore_index, double smoothing) {
  check_logits(logits, target);
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t* t = target.data_ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r)
    TORCH_CHECK(t[r] == ignore_index || (t[r] >= 0 && t[r] < V), "target ", t[r], " is outside [0, ", V, ")");
  at::Tensor loss = at::zeros({N}, logits.options().dtype(at::kFloat));
  at::Tensor lse = at::zeros({N}, logits.options().dtype(at::kFloat));
  float* out = loss.data_ptr<float>();
  float* lses = lse.data_ptr<float>();
  const float s = static_cast<float>(smoothing);
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(V);
    for (int64_t r = r0; r < r1; ++r) {
      if (t[r] == ignore_index) continue;
      read_row(logits, r, row.data());
      lses[r] = row_lse(row.data(), V);
      out[r] = lses[r] - (1.f - s) * row[t[r]] - (s > 0.f ? s * row_sum(row.data(), V) / V : 0.f);
    }
  });
  return {loss, lse};
}

// The gradient of sum_r grad[r] loss_r with respect to the logits, in their dtype:
//   grad[r] (softmax(x_r) - (1 - s) onehot(t_r) - s / V), rows with ignore_index zero.
at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& target,
                                  const at::Tensor& lse, int64_t ignore_index, double smoothing) {
  check_logits(logits, target);
  check_float_cpu(grad, "grad");
  check_float_cpu(lse, "lse");
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t* t = target.data_ptr<int64_t>();
  const float* g = grad.data_ptr<float>();
  const float* lses = lse.data_ptr<float>();
  const float s = static_cast<float>(smoothing);
  const bool bf16 = logits.scalar_type() == at::kBFloat16;
  at::Tensor dx = at::empty_like(logits);
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(V);
    for (int64_t r = r0; r < r1; ++r) {
      const bool ignored = t[r] == ignore_index;
      const float gr = ignored ? 0.f : g[r], l = lses[r], uniform = gr * s / V;
      read_row(logits, r, row.data());
      scaled_softmax(row.data(), V, gr, l, uniform);
      if (!ignored) row[t[r]] -= gr * (1.f - s);
      if (bf16) {
        write_bf16(row.data(), V, reinterpret_cast<uint16_t*>(dx.data_ptr<at::BFloat16>()) + r * V);
      } else {
        std::copy(row.begin(), row.end(), dx.data_ptr<float>() + r * V);
      }
    }
  });
  return dx;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.attr("vector_floats") = kLane;  // which branch this build took (16: AVX-512, 8: AVX, 4: SSE/NEON)
  m.def("gelu_forward", &gelu_forward, "GELU of x, exact or tanh-approximated");
  m.def("gelu_backward", &gelu_backward, "grad * GELU'(x)");
  m.def("activation_and_slope", &activation_and_slope, "(act(x), act'(x)) as the fused block's forward keeps them");
  m.def("attention_forward", &attention_forward, "self-attention of a (B, T, 3C) q/k/v: (y (B, T, C), lse (B, H, T))");
  m.def("attention_backward", &attention_backward, "the gradient of the q/k/v (B, T, 3C) from that of y");
  py::class_<PreNormBlock>(m, "PreNormBlock")
      .def(py::init<int64_t, bool, int64_t, double>())
      .def("forward", &PreNormBlock::forward)
      .def("backward", &PreNormBlock::backward);
  py::class_<PreNormStack>(m, "PreNormStack")
      .def(py::init<int64_t, int64_t, bool, int64_t, double>())
      .def("forward", &PreNormStack::forward)
      .def("backward", &PreNormStack::backward);
  m.def("global_norm", &global_norm, "the L2 norm of all the tensors' elements together");
  m.def("adamw_step", &adamw_step, "one AdamW step of every parameter, gradients times grad_factor");
  m.def("cross_entropy_forward", &cross_entropy_forward, "per-row cross-entropy of (N, V) logits: (loss, lse)");
  m.def("cross_entropy_backward", &cross_entropy_backward, "the gradient of the per-row losses' weighted sum");
}
