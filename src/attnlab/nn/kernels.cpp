// Training kernels for the CPU, fp32: attnlab.nn.kernels.
//
// Two pieces of a small Transformer's training step where PyTorch's CPU operators are far from
// what the machine can do (a profile of a 4-layer, 128-wide GPT, block 64, batch 12: the matrix
// products near the fp32 peak, these two at ~40% of the rest of the step):
// - GELU and its derivative, elementwise: PyTorch's tanh-GELU runs at ~1 ns an element; here
//   tanh, erf and exp are polynomials that vectorize (vecmath.h).
// - Self-attention forward and backward straight from the fused q/k/v projection's output
//   (B, T, 3C), head h the columns [h*D, (h+1)*D) of each third, to (B, T, C) with the heads
//   side by side: no head split, no transposes, no copies. Per (sequence, head), queries one at
//   a time against the keys in a transposed local copy, so every inner loop runs along keys or
//   along the head dimension in 16-float lanes. The backward recomputes the weights from the
//   forward's log-sum-exp of each query (as FlashAttention does) instead of storing (T, T).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <limits>
#include <vector>

#include "vecmath.h"

namespace {

using attnlab::gelu;
using attnlab::gelu_grad;
using attnlab::gelu_tanh;
using attnlab::gelu_tanh_grad;
using attnlab::vexp;

constexpr int64_t kElementGrain = 1 << 14;

void check_float_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

at::Tensor gelu_forward(const at::Tensor& x, bool approximate_tanh) {
  check_float_cpu(x, "x");
  at::Tensor y = at::empty_like(x);
  const float* src = x.data_ptr<float>();
  float* dst = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    if (approximate_tanh) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dst[i] = gelu_tanh(src[i]);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dst[i] = gelu(src[i]);
    }
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x, bool approximate_tanh) {
  check_float_cpu(grad, "grad");
  check_float_cpu(x, "x");
  TORCH_CHECK(grad.sizes() == x.sizes(), "grad and x must have the same shape");
  at::Tensor dx = at::empty_like(x);
  const float* g = grad.data_ptr<float>();
  const float* src = x.data_ptr<float>();
  float* dst = dx.data_ptr<float>();
  at::parallel_for(0, x.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
    if (approximate_tanh) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dst[i] = g[i] * gelu_tanh_grad(src[i]);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dst[i] = g[i] * gelu_grad(src[i]);
    }
  });
  return dx;
}

constexpr int kLane = 16;  // floats in one vector

// 16 floats as one value: GCC and Clang keep it in a register (AVX-512) or two (AVX2), where a
// float[16] accumulator in a loop goes through memory at every step.
typedef float Lanes __attribute__((vector_size(64)));

inline Lanes load(const float* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

inline void store(float* p, Lanes v) { __builtin_memcpy(p, &v, sizeof v); }

// s[j] = scale * q . k_j for the keys of N blocks of 16, with the keys transposed in kt (D, Tp):
// lanes run along keys, and the N blocks' sums are independent, so their multiply-adds overlap.
template <int D, int N>
inline void score_blocks(const float* q, const float* kt, int64_t Tp, float scale, float* s) {
  Lanes acc[N] = {};
  for (int d = 0; d < D; ++d) {
    const float qd = q[d] * scale;
    const float* row = kt + d * Tp;
#pragma GCC unroll 4
    for (int u = 0; u < N; ++u) acc[u] += qd * load(row + u * kLane);
  }
#pragma GCC unroll 4
  for (int u = 0; u < N; ++u) store(s + u * kLane, acc[u]);
}

template <int D>
inline void scores(const float* q, const float* kt, int64_t Tp, int64_t nb, float scale, float* s) {
  int64_t b = 0;
  for (; b + 4 <= nb; b += 4) score_blocks<D, 4>(q, kt + b * kLane, Tp, scale, s + b * kLane);
  for (; b + 2 <= nb; b += 2) score_blocks<D, 2>(q, kt + b * kLane, Tp, scale, s + b * kLane);
  for (; b < nb; ++b) score_blocks<D, 1>(q, kt + b * kLane, Tp, scale, s + b * kLane);
}

// o = sum_j w[j] x_j over the n rows x_j (D floats, `stride` apart), in two interleaved sums so
// that consecutive rows' multiply-adds do not wait on each other.
template <int D>
inline void weighted_rows(const float* w, const float* x, int64_t stride, int64_t n, float* o) {
  constexpr int V = D / kLane;
  Lanes acc0[V] = {}, acc1[V] = {};
  int64_t j = 0;
  for (; j + 2 <= n; j += 2) {
    const float w0 = w[j], w1 = w[j + 1];
    const float* x0 = x + j * stride;
    const float* x1 = x0 + stride;
#pragma GCC unroll 8
    for (int c = 0; c < V; ++c) {
      acc0[c] += w0 * load(x0 + c * kLane);
      acc1[c] += w1 * load(x1 + c * kLane);
    }
  }
  if (j < n)
#pragma GCC unroll 8
    for (int c = 0; c < V; ++c) acc0[c] += w[j] * load(x + j * stride + c * kLane);
#pragma GCC unroll 8
  for (int c = 0; c < V; ++c) store(o + c * kLane, acc0[c] + acc1[c]);
}

// y_j += w[j] x for the n rows y_j (D floats each, contiguous): the backward's key and value
// gradients, one query's share of them.
template <int D>
inline void add_scaled(const float* w, const float* x, int64_t n, float* y) {
  constexpr int V = D / kLane;
  Lanes xv[V];
#pragma GCC unroll 8
  for (int c = 0; c < V; ++c) xv[c] = load(x + c * kLane);
  for (int64_t j = 0; j < n; ++j) {
    float* yj = y + j * D;
#pragma GCC unroll 8
    for (int c = 0; c < V; ++c) store(yj + c * kLane, load(yj + c * kLane) + w[j] * xv[c]);
  }
}

// xt (D, Tp) = the T rows of x (D floats, `stride` apart) transposed; columns past T are zero.
template <int D>
void transpose(const float* x, int64_t stride, int64_t T, int64_t Tp, float* xt) {
  std::fill(xt, xt + D * Tp, 0.f);
  for (int64_t j = 0; j < T; ++j)
    for (int d = 0; d < D; ++d) xt[d * Tp + j] = x[j * stride + d];
}

int64_t padded(int64_t T) { return (T + kLane - 1) / kLane * kLane; }

template <int D>
void attention_forward_heads(const float* base, int64_t B, int64_t T, int64_t H, bool causal, float* out,
                             float* lse) {
  const int64_t C = H * D, Tp = padded(T);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * Tp), s(Tp);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q = base + b * T * 3 * C + h * D;
      const float* k = q + C;
      const float* v = q + 2 * C;
      transpose<D>(k, 3 * C, T, Tp, kt.data());
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T, nb = (n + kLane - 1) / kLane;
        scores<D>(q + i * 3 * C, kt.data(), Tp, nb, scale, s.data());
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < n; ++j) {
          s[j] = vexp(s[j] - m);
          sum += s[j];
        }
        float* o = out + (b * T + i) * C + h * D;
        weighted_rows<D>(s.data(), v, 3 * C, n, o);
        const float inv = 1.f / sum;
#pragma omp simd
        for (int d = 0; d < D; ++d) o[d] *= inv;
        lse[bh * T + i] = m + std::log(sum);
      }
    }
  });
}

template <int D>
void attention_backward_heads(const float* base, const float* dy, const float* out, const float* lse, int64_t B,
                              int64_t T, int64_t H, bool causal, float* dbase) {
  const int64_t C = H * D, Tp = padded(T);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> kt(D * Tp), vt(D * Tp), dk(T * D), dv(T * D), p(Tp), ds(Tp);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q = base + b * T * 3 * C + h * D;
      const float* k = q + C;
      const float* v = q + 2 * C;
      transpose<D>(k, 3 * C, T, Tp, kt.data());
      transpose<D>(v, 3 * C, T, Tp, vt.data());
      std::fill(dk.begin(), dk.end(), 0.f);
      std::fill(dv.begin(), dv.end(), 0.f);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T, nb = (n + kLane - 1) / kLane;
        const float* q_i = q + i * 3 * C;
        const float* dy_i = dy + (b * T + i) * C + h * D;
        const float* y_i = out + (b * T + i) * C + h * D;
        // The weights again, from the saved log-sum-exp: p_j = exp(s_j - lse_i).
        scores<D>(q_i, kt.data(), Tp, nb, scale, p.data());
        const float l = lse[bh * T + i];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) p[j] = vexp(p[j] - l);
        // dP_j = dy_i . v_j, through the transposed values.
        scores<D>(dy_i, vt.data(), Tp, nb, 1.f, ds.data());
        // Softmax backward: dS_j = p_j (dP_j - sum_j p_j dP_j), and that sum is dy_i . y_i.
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int d = 0; d < D; ++d) dot += dy_i[d] * y_i[d];
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) ds[j] = p[j] * (ds[j] - dot) * scale;
        weighted_rows<D>(ds.data(), k, 3 * C, n, dbase + (b * T + i) * 3 * C + h * D);
        add_scaled<D>(ds.data(), q_i, n, dk.data());
        add_scaled<D>(p.data(), dy_i, n, dv.data());
      }
      for (int64_t j = 0; j < T; ++j) {
        float* row = dbase + (b * T + j) * 3 * C + h * D;
        std::copy(dk.begin() + j * D, dk.begin() + (j + 1) * D, row + C);
        std::copy(dv.begin() + j * D, dv.begin() + (j + 1) * D, row + 2 * C);
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

// Activation codes, as in attnlab/decode/fused.py.
enum Activation : int64_t { kGelu = 0, kGeluTanh = 1, kRelu = 2 };

void activation_forward(const float* h, float* g, int64_t n, int64_t act) {
  at::parallel_for(0, n, kElementGrain, [&](int64_t begin, int64_t end) {
    if (act == kGelu) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) g[i] = gelu(h[i]);
    } else if (act == kGeluTanh) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) g[i] = gelu_tanh(h[i]);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) g[i] = h[i] > 0.f ? h[i] : 0.f;
    }
  });
}

// dh = dg * act'(h), in place in dg.
void activation_backward(const float* h, float* dg, int64_t n, int64_t act) {
  at::parallel_for(0, n, kElementGrain, [&](int64_t begin, int64_t end) {
    if (act == kGelu) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dg[i] *= gelu_grad(h[i]);
    } else if (act == kGeluTanh) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dg[i] *= gelu_tanh_grad(h[i]);
    } else {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) dg[i] = h[i] > 0.f ? dg[i] : 0.f;
    }
  });
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

// dx += the gradient through LN of dy; dw, db (db may be null) = its parameters' gradients.
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd, const float* w,
                         int64_t N, int64_t C, float* dx, float* dw, float* db) {
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
      float* dxr = dx + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] += s * (dyr[c] * w[c] - a - (xr[c] - m) * s * bsum);
    }
  });
  // The parameters' gradients are sums down the columns: each thread takes whole columns.
  at::parallel_for(0, C, kLane, [&](int64_t begin, int64_t end) {
    std::fill(dw + begin, dw + end, 0.f);
    if (db) std::fill(db + begin, db + end, 0.f);
    for (int64_t r = 0; r < N; ++r) {
      const float* dyr = dy + r * C;
      const float* xr = x + r * C;
      const float m = mean[r], s = rstd[r];
#pragma omp simd
      for (int64_t c = begin; c < end; ++c) dw[c] += dyr[c] * (xr[c] - m) * s;
      if (db) {
#pragma omp simd
        for (int64_t c = begin; c < end; ++c) db[c] += dyr[c];
      }
    }
  });
}

// out[r] += bias (may be null) and residual[r] (may be null), for the N rows of C.
void add_rows(float* out, const float* bias, const float* residual, int64_t N, int64_t C) {
  if (!bias && !residual) return;
  at::parallel_for(0, N, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* o = out + r * C;
      if (bias) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] += bias[c];
      }
      if (residual) {
        const float* x = residual + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] += x[c];
      }
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

const float* ptr_or_null(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }
float* mutable_or_null(at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

// The parameters of a block, in the order of attnlab/nn/kernels.py: LN1 weight and bias, q/k/v
// weight and bias, output weight and bias, LN2 weight and bias, FFN weights and biases. A bias
// is an empty tensor when the block has none.
enum Param { kLn1W, kLn1B, kQkvW, kQkvB, kOutW, kOutB, kLn2W, kLn2B, kFc1W, kFc1B, kFc2W, kFc2B, kParams };

class PreNormBlock {
 public:
  PreNormBlock(int64_t n_heads, bool causal, int64_t act, double eps)
      : H_(n_heads), causal_(causal), act_(act), eps_(static_cast<float>(eps)) {}

  // x (B, T, C) -> the block's output (B, T, C); keeps what the backward needs until the next call.
  at::Tensor forward(const at::Tensor& x, const std::vector<at::Tensor>& p) {
    check_float_cpu(x, "x");
    TORCH_CHECK(x.dim() == 3, "x must be (B, T, C)");
    TORCH_CHECK(static_cast<int64_t>(p.size()) == kParams, "expected ", kParams, " parameters");
    for (const auto& t : p)
      if (t.numel()) check_float_cpu(t, "a block parameter");
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2), N = B * T, F = p[kFc1W].size(0);
    TORCH_CHECK(C % H_ == 0, "width ", C, " is not divisible by ", H_, " heads");
    reserve(x, B, T, C, F);
    x_ = x;
    p_ = p;
    const at::Tensor x2d = x.view({N, C});
    layer_norm(x.data_ptr<float>(), p[kLn1W].data_ptr<float>(), ptr_or_null(p[kLn1B]), N, C, eps_,
               ln1_.data_ptr<float>(), mean1_.data_ptr<float>(), rstd1_.data_ptr<float>());
    at::mm_out(qkv_, ln1_, p[kQkvW].t());
    add_rows(qkv_.data_ptr<float>(), ptr_or_null(p[kQkvB]), nullptr, N, 3 * C);
    attend();
    at::mm_out(x2_, att_, p[kOutW].t());
    add_rows(x2_.data_ptr<float>(), ptr_or_null(p[kOutB]), x.data_ptr<float>(), N, C);
    layer_norm(x2_.data_ptr<float>(), p[kLn2W].data_ptr<float>(), ptr_or_null(p[kLn2B]), N, C, eps_,
               ln2_.data_ptr<float>(), mean2_.data_ptr<float>(), rstd2_.data_ptr<float>());
    at::mm_out(h_, ln2_, p[kFc1W].t());
    add_rows(h_.data_ptr<float>(), ptr_or_null(p[kFc1B]), nullptr, N, F);
    activation_forward(h_.data_ptr<float>(), g_.data_ptr<float>(), N * F, act_);
    at::Tensor y = at::empty({B, T, C}, x.options());
    at::Tensor y2d = y.view({N, C});
    at::mm_out(y2d, g_, p[kFc2W].t());
    add_rows(y.data_ptr<float>(), ptr_or_null(p[kFc2B]), x2_.data_ptr<float>(), N, C);
    (void)x2d;
    return y;
  }

  // dy (B, T, C) -> [dx, then the gradient of each parameter (empty for a missing bias)].
  std::vector<at::Tensor> backward(const at::Tensor& dy) {
    TORCH_CHECK(x_.defined(), "backward before forward");
    check_float_cpu(dy, "dy");
    TORCH_CHECK(dy.sizes() == x_.sizes(), "dy must have the shape of x");
    const auto& p = p_;
    const int64_t B = x_.size(0), T = x_.size(1), C = x_.size(2), N = B * T, F = h_.size(1);
    std::vector<at::Tensor> grads(kParams + 1);
    auto bias_grad = [&](Param which, const at::Tensor& d, int64_t cols) {
      if (!p[which].numel()) return at::Tensor(at::empty({0}, d.options()));
      at::Tensor g = at::empty({cols}, d.options());
      column_sums(d.data_ptr<float>(), N, cols, g.data_ptr<float>());
      return g;
    };
    const at::Tensor dy2d = dy.view({N, C});
    // y = x2 + g W2^T + b2
    grads[1 + kFc2W] = at::mm(dy2d.t(), g_);
    grads[1 + kFc2B] = bias_grad(kFc2B, dy2d, C);
    at::mm_out(dg_, dy2d, p[kFc2W]);
    activation_backward(h_.data_ptr<float>(), dg_.data_ptr<float>(), N * F, act_);  // now dh
    grads[1 + kFc1W] = at::mm(dg_.t(), ln2_);
    grads[1 + kFc1B] = bias_grad(kFc1B, dg_, F);
    at::mm_out(dln_, dg_, p[kFc1W]);
    // dx2 = dy + LN2'(dln2)
    at::Tensor dx2 = dy2d.clone();
    grads[1 + kLn2W] = at::empty({C}, dy.options());
    grads[1 + kLn2B] = p[kLn2B].numel() ? at::empty({C}, dy.options()) : at::empty({0}, dy.options());
    layer_norm_backward(dln_.data_ptr<float>(), x2_.data_ptr<float>(), mean2_.data_ptr<float>(),
                        rstd2_.data_ptr<float>(), p[kLn2W].data_ptr<float>(), N, C, dx2.data_ptr<float>(),
                        grads[1 + kLn2W].data_ptr<float>(), mutable_or_null(grads[1 + kLn2B]));
    // x2 = x + att Wo^T + bo
    grads[1 + kOutW] = at::mm(dx2.t(), att_);
    grads[1 + kOutB] = bias_grad(kOutB, dx2, C);
    at::mm_out(datt_, dx2, p[kOutW]);
    attend_backward();
    grads[1 + kQkvW] = at::mm(dqkv_.t(), ln1_);
    grads[1 + kQkvB] = bias_grad(kQkvB, dqkv_, 3 * C);
    at::mm_out(dln_, dqkv_, p[kQkvW]);
    // dx = dx2 + LN1'(dln1)
    at::Tensor dx = dx2;  // dx2 is not needed past here: LN1's gradient is added into it
    grads[1 + kLn1W] = at::empty({C}, dy.options());
    grads[1 + kLn1B] = p[kLn1B].numel() ? at::empty({C}, dy.options()) : at::empty({0}, dy.options());
    layer_norm_backward(dln_.data_ptr<float>(), x_.data_ptr<float>(), mean1_.data_ptr<float>(),
                        rstd1_.data_ptr<float>(), p[kLn1W].data_ptr<float>(), N, C, dx.data_ptr<float>(),
                        grads[1 + kLn1W].data_ptr<float>(), mutable_or_null(grads[1 + kLn1B]));
    grads[0] = dx.view({B, T, C});
    x_ = at::Tensor();  // one backward per forward
    p_.clear();
    return grads;
  }

 private:
  void reserve(const at::Tensor& x, int64_t B, int64_t T, int64_t C, int64_t F) {
    const int64_t N = B * T;
    if (ln1_.defined() && B == B_ && T == T_ && C == C_ && F == F_) return;
    B_ = B, T_ = T, C_ = C, F_ = F;
    const auto o = x.options();
    ln1_ = at::empty({N, C}, o), ln2_ = at::empty({N, C}, o), x2_ = at::empty({N, C}, o), att_ = at::empty({N, C}, o);
    mean1_ = at::empty({N}, o), rstd1_ = at::empty({N}, o), mean2_ = at::empty({N}, o), rstd2_ = at::empty({N}, o);
    qkv_ = at::empty({N, 3 * C}, o), dqkv_ = at::empty({N, 3 * C}, o), lse_ = at::empty({B, H_, T}, o);
    h_ = at::empty({N, F}, o), g_ = at::empty({N, F}, o), dg_ = at::empty({N, F}, o);
    dln_ = at::empty({N, C}, o), datt_ = at::empty({N, C}, o);
  }

  void attend() {
    const int64_t D = C_ / H_;
#define ATTNLAB_BLOCK_FORWARD(d)                                                                          \
  attention_forward_heads<d>(qkv_.data_ptr<float>(), B_, T_, H_, causal_, att_.data_ptr<float>(), \
                             lse_.data_ptr<float>())
    ATTNLAB_HEAD_DIMS(D, ATTNLAB_BLOCK_FORWARD)
#undef ATTNLAB_BLOCK_FORWARD
  }

  void attend_backward() {
    const int64_t D = C_ / H_;
#define ATTNLAB_BLOCK_BACKWARD(d)                                                                         \
  attention_backward_heads<d>(qkv_.data_ptr<float>(), datt_.data_ptr<float>(), att_.data_ptr<float>(), \
                              lse_.data_ptr<float>(), B_, T_, H_, causal_, dqkv_.data_ptr<float>())
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
  at::Tensor ln1_, mean1_, rstd1_, qkv_, att_, lse_, x2_, ln2_, mean2_, rstd2_, h_, g_;
  at::Tensor dg_, dln_, datt_, dqkv_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gelu_forward", &gelu_forward, "GELU of x, exact or tanh-approximated");
  m.def("gelu_backward", &gelu_backward, "grad * GELU'(x)");
  m.def("attention_forward", &attention_forward, "self-attention of a (B, T, 3C) q/k/v: (y (B, T, C), lse (B, H, T))");
  m.def("attention_backward", &attention_backward, "the gradient of the q/k/v (B, T, 3C) from that of y");
  py::class_<PreNormBlock>(m, "PreNormBlock")
      .def(py::init<int64_t, bool, int64_t, double>())
      .def("forward", &PreNormBlock::forward)
      .def("backward", &PreNormBlock::backward);
}
