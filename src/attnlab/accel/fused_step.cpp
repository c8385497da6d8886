// Decoding steps in a single call each, for the CPU: attnlab.accel.fused.
//
// A step of a small model is ~100 PyTorch operators of a few microseconds each, and at batch 1
// their call overhead costs as much as the arithmetic. Here the same step is plain loops over
// fp32 buffers. Two steps share the pieces below:
// - GPTStep, a pre-norm GPT: per block a norm, the q/k/v product (rotated by RoPE where the
//   model has it), attention over the cache, the output product and residual, a norm, the
//   feed-forward layer and residual; then the final norm and the language-model head. The same
//   blocks prefill whole prompts, each into a cache row of its own (continuous batching's new
//   sequences, and its sliding windows), and extend one row by several tokens at once (`extend`:
//   speculative decoding's verification of its drafts). The parts are GPT-2's and today's: LayerNorm or RMSNorm;
//   learned, fixed or no positions at the input, or rotary ones; grouped-query attention (fewer
//   key/value heads than query heads); a dense, gated (SwiGLU, GeGLU, ...) or mixture-of-experts
//   feed-forward layer (Mixtral's top-k routing); biases or none; a tied or untied head.
// - DecoderStep, the encoder-decoder's decoder (pre- or post-norm): masked self-attention,
//   attention over the encoder memory, feed-forward, each with its residual and LayerNorm; then
//   the output projection. Built for beam search: rows are hypotheses that get reordered and
//   dropped at every step, so the caches are never moved. Each row's history is a table of the
//   cache rows that wrote each position (see `attend_cached`), and each row's source sentence an
//   index into the memory, both reordered in Python for the price of a few integers.
// The weight products read each weight row once for every row of the batch, so up to a few rows
// cost about what one does; past 8 rows the products go to oneDNN's (over reordered weights,
// where the caller gives them) or PyTorch's matrix product; bf16, int8, int4 and K-quant weights stream up
// to 15 rows and from 16 on are widened to fp32, a chunk at a time, for PyTorch's matrix product.
//
// Layouts are PyTorch's: weights (out, in) row-major, a row of the in-projection's output
// [q (H*D); k (KV*D); v (KV*D)] (see `Heads`), head h the columns [h*D, (h+1)*D) of each; the
// GPT's caches are attnlab.nn.KVCache's (B, KV, L, D), the decoder's its own (P, L, H, D) (see
// `attend`).

#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "quantized.h"
#include "quantized4.h"
#include "quantizedk.h"
#include "vecmath.h"

namespace {

constexpr int64_t kPerBlock = 13;  // tensors per block in `params`, in the order of fused.py
constexpr int64_t kProductsPerBlock = 4;  // qkv, attention output, fc1, fc2

const float* data_or_null(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

// acc[b] = W_row . x[b, :] for the B rows of x: the weight row is read once for all of them. The
// products run in 16-float lanes, U independent lanes per row (so that one row's additions do
// not wait on each other), B * U lanes in all; the tail past the last full lane is scalar.
template <int B, int U>
void dot_rows(const float* w, const float* x, int64_t in, float* acc) {
  constexpr int kLane = 16;
  float lanes[B][U][kLane] = {};
  int64_t i = 0;
  for (; i + U * kLane <= in; i += U * kLane)
    for (int b = 0; b < B; ++b)
      for (int u = 0; u < U; ++u)
#pragma omp simd
        for (int l = 0; l < kLane; ++l) lanes[b][u][l] += w[i + u * kLane + l] * x[b * in + i + u * kLane + l];
  for (int b = 0; b < B; ++b) {
    for (int u = 1; u < U; ++u)  // lane-wise first: one horizontal sum per row, not U
#pragma omp simd
      for (int l = 0; l < kLane; ++l) lanes[b][0][l] += lanes[b][u][l];
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int l = 0; l < kLane; ++l) s += lanes[b][0][l];
    for (int64_t t = i; t < in; ++t) s += w[t] * x[b * in + t];
    acc[b] = s;
  }
}

template <int B, int U>
void linear_rows(const float* W, const float* bias, const float* x, float* y, int64_t out, int64_t in) {
  // Rows per task: enough weights (~64k) that splitting across threads pays for itself.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / in);
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    float acc[B];
    for (int64_t j = begin; j < end; ++j) {
      dot_rows<B, U>(W + j * in, x, in, acc);
      const float b0 = bias ? bias[j] : 0.f;
      for (int b = 0; b < B; ++b) y[b * out + j] = acc[b] + b0;
    }
  });
}

// y[b, j] = bias[j] + W[j, :] . x[b, :] for every row b < B; W (out, in). Batches above 8 go
// through in groups of 8 (each group reads the weights once).
void linear(const float* W, const float* bias, const float* x, float* y, int64_t B, int64_t out, int64_t in) {
  for (int64_t b0 = 0; b0 < B; b0 += 8) {
    const int64_t n = std::min<int64_t>(8, B - b0);
    const float* xb = x + b0 * in;
    float* yb = y + b0 * out;
    switch (n) {
      case 1: linear_rows<1, 4>(W, bias, xb, yb, out, in); break;
      case 2: linear_rows<2, 2>(W, bias, xb, yb, out, in); break;
      case 3: linear_rows<3, 1>(W, bias, xb, yb, out, in); break;
      case 4: linear_rows<4, 1>(W, bias, xb, yb, out, in); break;
      case 5: linear_rows<5, 1>(W, bias, xb, yb, out, in); break;
      case 6: linear_rows<6, 1>(W, bias, xb, yb, out, in); break;
      case 7: linear_rows<7, 1>(W, bias, xb, yb, out, in); break;
      default: linear_rows<8, 1>(W, bias, xb, yb, out, in);
    }
  }
}

// A product's weight as the GPT step stores it (quantized.h, quantized4.h, quantizedk.h): values
// (out, in) in fp32, bf16 or int8, or int4's (out, in / 2) bytes of nibbles, or the K-quants'
// (out, in / 256 x the widest row kind's bytes) super-blocks; for int8 and int4 their scales (out,
// blocks) fp32, for the K-quants each row's kind (out,) uint8 (`attnlab::kQ4K`, `kQ6K`); an
// empty tensor for the others. A mixture's experts are (E, out, in) and (E, out, blocks) or (E,
// out), `expert` the one of them.
struct Weight {
  at::Tensor values, scales;
  int64_t columns_;

  Weight(at::Tensor v, at::Tensor s = at::Tensor())  // NOLINT: an fp32 tensor is a weight
      : values(std::move(v)), scales(std::move(s)), columns_(columns(values, scales)) {}

  int64_t out() const { return values.size(-2); }
  int64_t in() const { return columns_; }
  bool fp32() const { return values.scalar_type() == at::kFloat; }
  bool k() const { return is_k(scales); }
  // Whether a stored weight's values are bytes multiplied in integers (int4 or a K-quant).
  bool integer() const { return values.scalar_type() == at::kByte; }
  static bool is_k(const at::Tensor& scales) { return scales.defined() && scales.scalar_type() == at::kByte; }
  // A stored weight's columns: two a byte for int4's nibbles, 256 a super-block for the K-quants
  // (whose rows are as far apart as the widest kind among them takes), one a value for the others.
  static int64_t columns(const at::Tensor& values, const at::Tensor& scales) {
    if (values.scalar_type() != at::kByte) return values.size(-1);
    if (!is_k(scales)) return values.size(-1) * 2;
    const uint8_t* kinds = scales.data_ptr<uint8_t>();
    const bool six = std::find(kinds, kinds + scales.numel(), attnlab::kQ6K) != kinds + scales.numel();
    return values.size(-1) / (six ? attnlab::kQ6KBytes : attnlab::kQ4KBytes) * attnlab::kQK;
  }
  Weight expert(int64_t e) const {
    Weight w(values.select(0, e), scales.defined() && scales.numel() ? scales.select(0, e) : scales);
    w.columns_ = columns_;  // the rows' spacing is the whole tensor's
    return w;
  }
};

// `quantized_rows` for an int4 or K-quant weight: the B rows of x quantized per block once
// (quantized4.h), then every weight row multiplied with them in integers (quantizedk.h for the
// K-quants, each row by its kind).
template <int B>
void integer_rows(const Weight& W, const float* bias, const float* x, float* y) {
  const int64_t out = W.out(), in = W.in(), blocks = in / attnlab::kQ4Block, stride = W.values.size(-1);
  const attnlab::Q8Activations a(x, B, in);
  const auto* values = W.values.data_ptr<uint8_t>();
  const uint8_t* kinds = W.k() ? W.scales.data_ptr<uint8_t>() : nullptr;
  const float* scales = W.k() ? nullptr : W.scales.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / in);
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    float acc[B];
    for (int64_t j = begin; j < end; ++j) {
      if (kinds)
        attnlab::dot_rows_k<B>(values + j * stride, kinds[j], a, 0, acc);
      else
        attnlab::dot_rows_q4<B>(values + j * stride, scales + j * blocks, a, 0, acc);
      const float b0 = bias ? bias[j] : 0.f;
      for (int b = 0; b < B; ++b) y[b * out + j] = acc[b] + b0;
    }
  });
}

// y[b, j] = bias[j] + W[j, :] . x[b, :] for the B rows of x with a stored weight, each row of W
// widened as it is read (quantized.h; int4's and the K-quants' in integers, `integer_rows`), in
// parallel over W's rows as `linear_rows`.
template <int B>
void quantized_rows(const Weight& W, const float* bias, const float* x, float* y) {
  if (W.integer()) return integer_rows<B>(W, bias, x, y);
  const int64_t out = W.out(), in = W.in();
  const bool q8 = W.values.scalar_type() == at::kChar;
  const auto* values = static_cast<const uint8_t*>(W.values.data_ptr());
  const float* scales = q8 ? W.scales.data_ptr<float>() : nullptr;
  const int64_t row_bytes = in * W.values.element_size(), blocks = attnlab::q8_blocks(in);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / in);
  at::parallel_for(0, out, grain, [&](int64_t begin, int64_t end) {
    float acc[B];
    for (int64_t j = begin; j < end; ++j) {
      const uint8_t* row = values + j * row_bytes;
      if (q8)
        attnlab::dot_rows_q8<B>(reinterpret_cast<const int8_t*>(row), scales + j * blocks, x, in, acc);
      else
        attnlab::dot_rows_bf16<B>(reinterpret_cast<const uint16_t*>(row), x, in, acc);
      const float b0 = bias ? bias[j] : 0.f;
      for (int b = 0; b < B; ++b) y[b * out + j] = acc[b] + b0;
    }
  });
}

// `linear` for a bf16, int8 or int4 weight, any number of rows, in groups of 8: every group reads the
// weights once, and widening a weight costs less than the 8 rows' multiply-adds that share it.
// `product` hands it fewer than kWidenedMinRows rows; more go to `widened_linear`.
void quantized_linear(const Weight& W, const float* bias, const float* x, float* y, int64_t B) {
  const int64_t out = W.out(), in = W.in();
  for (int64_t b0 = 0; b0 < B; b0 += 8) {
    const int64_t n = std::min<int64_t>(8, B - b0);
    const float* xb = x + b0 * in;
    float* yb = y + b0 * out;
    switch (n) {
      case 1: quantized_rows<1>(W, bias, xb, yb); break;
      case 2: quantized_rows<2>(W, bias, xb, yb); break;
      case 3: quantized_rows<3>(W, bias, xb, yb); break;
      case 4: quantized_rows<4>(W, bias, xb, yb); break;
      case 5: quantized_rows<5>(W, bias, xb, yb); break;
      case 6: quantized_rows<6>(W, bias, xb, yb); break;
      case 7: quantized_rows<7>(W, bias, xb, yb); break;
      default: quantized_rows<8>(W, bias, xb, yb);
    }
  }
}

// Weights a chunk of `widened_linear` holds in fp32: 256K of them (1 MiB), a few hundred rows
// of a model's products, small enough to stay in the cache between the widening and the product.
constexpr int64_t kWidenedChunk = int64_t{1} << 18;

// Rows [begin, begin + n) of a stored weight widened to fp32 into out (n, in), exactly the values the
// streamed products read (quantized.h, quantized4.h, quantizedk.h), in parallel over the rows.
void widen(const Weight& W, int64_t begin, int64_t n, float* out) {
  const int64_t in = W.in();
  const bool q8 = W.values.scalar_type() == at::kChar;
  at::parallel_for(0, n, std::max<int64_t>(1, (int64_t{1} << 14) / in), [&](int64_t lo, int64_t hi) {
    const int64_t j = begin + lo;
    if (W.k()) {
      const int64_t stride = W.values.size(-1);
      for (int64_t r = lo; r < hi; ++r)
        attnlab::widen_k(W.values.data_ptr<uint8_t>() + (begin + r) * stride, W.scales.data_ptr<uint8_t>()[begin + r],
                         in, out + r * in);
    } else if (W.integer()) {
      attnlab::widen_q4(W.values.data_ptr<uint8_t>() + j * in / 2,
                        W.scales.data_ptr<float>() + j * (in / attnlab::kQ4Block), hi - lo, in, out + lo * in);
    } else if (q8) {
      attnlab::widen_q8(W.values.data_ptr<int8_t>() + j * in, W.scales.data_ptr<float>() + j * attnlab::q8_blocks(in),
                        hi - lo, in, out + lo * in);
    } else {
      attnlab::widen_bf16(reinterpret_cast<const uint16_t*>(W.values.data_ptr()) + j * in, (hi - lo) * in,
                          out + lo * in);
    }
  });
}

// `linear` for a bf16, int8 or int4 weight and many rows (a prompt's prefill, a large batch): there the
// cost is the multiply-adds, not reading the weights, and streamed in groups of 8 the weights
// were widened again for every group (64 times for a 512-token prompt). Here each weight is
// widened once, a chunk of kWidenedChunk at a time, and the chunk's outputs come from PyTorch's
// matrix product, as an fp32 weight's do past kStreamedMaxRows.
void widened_linear(const Weight& W, const at::Tensor& bias, const float* x, float* y, int64_t R) {
  const int64_t out = W.out(), in = W.in();
  const int64_t rows = std::min(out, std::max<int64_t>(16, kWidenedChunk / in / 16 * 16));
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor chunk = at::empty({rows, in}, opts);
  const at::Tensor xt = at::from_blob(const_cast<float*>(x), {R, in}, opts), yt = at::from_blob(y, {R, out}, opts);
  const bool biased = bias.defined() && bias.numel();
  for (int64_t j = 0; j < out; j += rows) {
    const int64_t n = std::min(rows, out - j);
    const at::Tensor w = chunk.narrow(0, 0, n);
    widen(W, j, n, w.data_ptr<float>());
    at::Tensor yj = yt.narrow(1, j, n);  // (R, n), rows `out` apart: the product writes in place
    if (biased)
      at::addmm_out(yj, bias.narrow(0, j, n), xt, w.t());
    else
      at::mm_out(yj, xt, w.t());
  }
}

// `linear` for a bf16 weight and many rows on a CPU whose oneDNN multiplies bf16 itself (AVX-512
// BF16, AMX): the caller passes the weight as `native` only there. The rows are rounded to bf16, as
// llama.cpp's bf16 products round them, oneDNN sums in fp32 and hands the outputs back in bf16;
// the streamed products and `widened_linear` keep the activations in fp32.
void native_bf16_linear(const at::Tensor& native, const at::Tensor& bias, const float* x, float* y, int64_t R) {
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor xt = at::from_blob(const_cast<float*>(x), {R, native.size(1)}, opts).to(at::kBFloat16);
  at::Tensor yt = at::from_blob(y, {R, native.size(0)}, opts);
  yt.copy_(at::mm(xt, native.t()));
  if (bias.defined() && bias.numel()) yt.add_(bias);
}

// LayerNorm of B rows of C (y may be x). The training kernels' (attnlab/accel/kernels.cpp) does the
// same per row with vectorized sums; these run in order, and the tests hold this step to 1e-5 of
// the model's own over 11 steps, which the vectorized sums miss (1.1e-5).
void layer_norm(const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t C, float eps) {
  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * C;
    float* yb = y + b * C;
    float mean = 0.f;
    for (int64_t i = 0; i < C; ++i) mean += xb[i];
    mean /= C;
    float var = 0.f;
    for (int64_t i = 0; i < C; ++i) var += (xb[i] - mean) * (xb[i] - mean);
    const float inv = 1.f / std::sqrt(var / C + eps);
    for (int64_t i = 0; i < C; ++i) yb[i] = (xb[i] - mean) * inv * w[i] + (bias ? bias[i] : 0.f);
  }
}

// RMSNorm (Zhang & Sennrich 2019) of B rows of C (y may be x): x / sqrt(mean(x^2) + eps) * w, in
// attnlab.nn.RMSNorm's order (the gain multiplies the normalised value).
void rms_norm(const float* x, const float* w, float* y, int64_t B, int64_t C, float eps) {
  for (int64_t b = 0; b < B; ++b) {
    const float* xb = x + b * C;
    float* yb = y + b * C;
    float squares = 0.f;
    for (int64_t i = 0; i < C; ++i) squares += xb[i] * xb[i];
    const float inv = 1.f / std::sqrt(squares / C + eps);
    for (int64_t i = 0; i < C; ++i) yb[i] = xb[i] * inv * w[i];
  }
}

// The GPT's norm, LayerNorm or RMSNorm, of B rows of C with gain w and bias b (none: empty).
void norm(bool rms, const float* x, const at::Tensor& w, const at::Tensor& b, float* y, int64_t B, int64_t C,
          float eps) {
  if (rms)
    rms_norm(x, w.data_ptr<float>(), y, B, C, eps);
  else
    layer_norm(x, w.data_ptr<float>(), data_or_null(b), y, B, C, eps);
}

// The heads of a self-attention layer: H query heads and KV key/value heads, D wide each. KV < H
// is grouped-query attention (Ainslie et al. 2023; KV = 1 multi-query): query head h reads
// key/value head h / (H / KV). A row of the in-projection's output is [q (H*D); k (KV*D); v (KV*D)].
struct Heads {
  int64_t H, KV, D;
  int64_t width() const { return (H + 2 * KV) * D; }
  int64_t group() const { return H / KV; }
};

// Where a key (or value) vector lives: strides, in floats, of a row, a position and a head.
struct Layout {
  int64_t row, pos, head;
};

// Scaled dot-product attention of one query per row and head: out[r, h*D:(h+1)*D] = sum over
// t < n of softmax_t(q[r, h] . k_t / sqrt(D)) v_t, where k_t and v_t are the head's key and
// value at position t of row row_of(r, t) of K and V. keep_of(r): null, or n bools, the
// positions row r may attend to; a query left with no key gets zeros (as the masked attention of
// attnlab.nn does). q (R, q_stride), head h at columns [h*D, (h+1)*D); out (R, H*D). Query head h
// reads key and value head h / group (grouped-query attention; group 1: a head each).
//
// Each task takes a run of (row, head) pairs and walks the positions in the outer loop, the heads
// of a row in the inner one: with the decoder's (row, position, head) caches, one position of one
// row is one contiguous read of all heads, where a loop per head would jump between rows (beam
// hypotheses) at every position and wait on memory each time.
template <class RowOf, class KeepOf>
void attend(const float* q, int64_t q_stride, const float* K, const float* V, Layout lay, int64_t n, RowOf row_of,
            KeepOf keep_of, float* out, int64_t R, int64_t H, int64_t D, int64_t group = 1) {
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, R * H, std::max<int64_t>(1, 16384 / (n * D)), [&](int64_t begin, int64_t end) {
    std::vector<float> p(H * n), top(H), sum(H);
    for (int64_t rh = begin; rh < end;) {
      const int64_t r = rh / H, h0 = rh % H, h1 = std::min(H, h0 + (end - rh));
      const bool* keep = keep_of(r);
      const float* qr = q + r * q_stride;
      std::fill(top.begin(), top.end(), -INFINITY);
      for (int64_t t = 0; t < n; ++t) {
        if (keep && !keep[t]) {
          for (int64_t h = h0; h < h1; ++h) p[h * n + t] = -INFINITY;
          continue;
        }
        const float* k = K + row_of(r, t) * lay.row + t * lay.pos;
        for (int64_t h = h0; h < h1; ++h) {
          const float *qh = qr + h * D, *kh = k + (h / group) * lay.head;
          float s = 0.f;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < D; ++d) s += qh[d] * kh[d];
          p[h * n + t] = s * scale;
          top[h] = std::max(top[h], s * scale);
        }
      }
      for (int64_t h = h0; h < h1; ++h) {
        float total = 0.f;
        if (top[h] != -INFINITY)
          for (int64_t t = 0; t < n; ++t) total += (p[h * n + t] = std::exp(p[h * n + t] - top[h]));
        sum[h] = total;
        std::fill_n(out + r * H * D + h * D, D, 0.f);
      }
      for (int64_t t = 0; t < n; ++t) {
        if (keep && !keep[t]) continue;
        const float* v = V + row_of(r, t) * lay.row + t * lay.pos;
        for (int64_t h = h0; h < h1; ++h) {
          if (sum[h] == 0.f) continue;
          const float w = p[h * n + t] / sum[h], *vh = v + (h / group) * lay.head;
          float* o = out + r * H * D + h * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) o[d] += w * vh[d];
        }
      }
      rh += h1 - h0;
    }
  });
}

// Write the keys and values of qkv row r (after its queries) at position `pos` of cache row
// `row`, head by head.
void write_key_value(const float* qkv, float* k_cache, float* v_cache, Layout lay, int64_t r, int64_t row, int64_t pos,
                     Heads heads) {
  const int64_t D = heads.D;
  const float* keys = qkv + r * heads.width() + heads.H * D;
  for (int64_t h = 0; h < heads.KV; ++h) {
    const int64_t slot = row * lay.row + pos * lay.pos + h * lay.head;
    std::copy_n(keys + h * D, D, k_cache + slot);
    std::copy_n(keys + (heads.KV + h) * D, D, v_cache + slot);
  }
}

// RoPE (Su et al. 2021) at one position, in attnlab.nn.rope_rotate's half-split layout: pair i of
// each of the n heads of x (D wide, one after another) is (x_i, x_{i+D/2}), turned by the angle
// whose cosine and sine are cos[i] and sin[i].
void rotate(float* x, int64_t n, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < n; ++h) {
    float *x1 = x + h * D, *x2 = x1 + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = x1[i], b = x2[i];
      x1[i] = a * cos[i] - b * sin[i];
      x2[i] = b * cos[i] + a * sin[i];
    }
  }
}

// Self-attention of one step over a cache of layout `lay` (positions 0..L-1). Write the R rows'
// keys and values (the second and third thirds of qkv) at position `pos` of cache rows 0..R-1,
// then attend from each row's query (the first third) to positions 0..pos. Position t < pos of
// row r is read from cache row origin[r * L + t] (beam search: the hypothesis row r continues
// wrote it, at step t), or from row r itself when origin is null; origin[r * L + pos] becomes r.
void attend_cached(const float* qkv, float* k_cache, float* v_cache, Layout lay, int64_t* origin, float* out,
                   int64_t R, int64_t H, int64_t L, int64_t D, int64_t pos) {
  const int64_t C = H * D;
  for (int64_t r = 0; r < R; ++r) {
    write_key_value(qkv, k_cache, v_cache, lay, r, r, pos, {H, H, D});
    if (origin) origin[r * L + pos] = r;
  }
  auto row_of = [&](int64_t r, int64_t t) { return origin ? origin[r * L + t] : r; };
  auto all = [](int64_t) -> const bool* { return nullptr; };
  attend(qkv, 3 * C, k_cache, v_cache, lay, pos + 1, row_of, all, out, R, H, D);
}

// x (R, in) W^T + bias through oneDNN's product over `packed`, the weight reordered once into its
// blocked layout (attnlab.accel.projection.reordered_weight): past a few rows it runs faster than
// PyTorch's matrix product here, which repacks the weight at every call (BENCHMARKS.md, "Tuned CPU
// paths").
at::Tensor packed_product(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(x);
  stack.emplace_back(packed);
  stack.emplace_back(bias.defined() && bias.numel() ? c10::IValue(bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

// Up to this many rows a product streams the weights itself (exported to Python, which makes
// reordered weights only for steps past it).
constexpr int64_t kStreamedMaxRows = 8;

// From this many rows on, a bf16, int8 or int4 product widens its weight for a matrix product: below
// it two streamed groups of 8 (9 to 15 rows) still ran faster (benchmarks/llamacpp_compare.py's
// shapes, one thread).
constexpr int64_t kWidenedMinRows = 16;

// y = x W^T + bias for x (R, in), W (out, in): the row-streaming kernel above for up to
// kStreamedMaxRows rows, where reading the weights is the cost; past that, where the arithmetic
// is, oneDNN's product over the reordered weight when there is one (an MKLDNN tensor), else PyTorch's.
// A bf16, int8 or int4 weight streams in groups of 8 rows (`quantized_linear`) up to kWidenedMinRows,
// and from there is widened to fp32 a chunk at a time for PyTorch's product (`widened_linear`),
// or, for bf16 where `packed` is the bf16 weight itself, multiplied in bf16 (`native_bf16_linear`).
void product(const Weight& weight, const at::Tensor& packed, const at::Tensor& bias, const float* x, float* y,
             int64_t R) {
  if (!weight.fp32()) {
    if (R < kWidenedMinRows)
      quantized_linear(weight, data_or_null(bias), x, y, R);
    else if (packed.defined() && packed.scalar_type() == at::kBFloat16)
      native_bf16_linear(packed, bias, x, y, R);
    else
      widened_linear(weight, bias, x, y, R);
    return;
  }
  const at::Tensor& W = weight.values;
  const int64_t out = W.size(0), in = W.size(1);
  if (R <= kStreamedMaxRows) {
    linear(W.data_ptr<float>(), data_or_null(bias), x, y, R, out, in);
    return;
  }
  const auto opts = W.options();
  at::Tensor xt = at::from_blob(const_cast<float*>(x), {R, in}, opts), yt = at::from_blob(y, {R, out}, opts);
  if (packed.defined() && packed.is_mkldnn())
    yt.copy_(packed_product(xt, packed, bias));
  else if (bias.defined() && bias.numel())
    at::addmm_out(yt, bias, xt, W.t());
  else
    at::mm_out(yt, xt, W.t());
}

void check_cpu_fp32(const std::vector<at::Tensor>& tensors, const char* what) {
  for (const auto& t : tensors)
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(), what,
                " must be contiguous fp32 CPU tensors");
}

// The token embedding (V, C) and position (P, C) tables a step reads its inputs from.
void check_tables(const at::Tensor& tokens, const at::Tensor& positions) {
  check_cpu_fp32({tokens, positions}, "the embedding and position tables");
  TORCH_CHECK(tokens.dim() == 2 && positions.dim() == 2 && positions.size(1) == tokens.size(1),
              "token_embedding must be (V, C) and positions (P, C)");
}

// x[b] = tokens[ids[b]] * scale + positions[pos_of(b)] for the B rows: a step's input.
template <class PosOf>
void embed(const at::Tensor& tokens, const at::Tensor& positions, const int64_t* ids, int64_t B, PosOf pos_of,
           float scale, float* x) {
  const int64_t C = tokens.size(1);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ids[b] >= 0 && ids[b] < tokens.size(0), "token id ", ids[b], " is outside the vocabulary");
    const float *te = tokens.data_ptr<float>() + ids[b] * C, *pe = positions.data_ptr<float>() + pos_of(b) * C;
    for (int64_t i = 0; i < C; ++i) x[b * C + i] = te[i] * scale + pe[i];
  }
}

// The positions of a step's rows when each sits at its own (continuous batching: the rows joined
// at different times): row r attends to slots 0..pos[r] of its own cache row. Made once per step
// for all its layers. A row behind the furthest one masks the slots past its own, which another
// sequence may have written before it took the row; when every row is at the same position there
// is nothing to mask and no mask is made. Consecutive positions of one row (`GPTStep::extend`)
// make the masks causal.
struct RowPositions {
  const int64_t* pos;
  int64_t n = 0;                 // the slots the step reads: the furthest position + 1
  std::unique_ptr<bool[]> keep;  // (R, n); null when no row needs a mask

  RowPositions(const int64_t* positions, int64_t R) : pos(positions) {
    bool same = true;
    for (int64_t r = 0; r < R; ++r) n = std::max(n, pos[r] + 1), same = same && pos[r] == pos[0];
    if (same) return;
    keep.reset(new bool[R * n]());
    for (int64_t r = 0; r < R; ++r) std::fill_n(keep.get() + r * n, pos[r] + 1, true);
  }

  const bool* keep_of(int64_t r) const { return pos[r] + 1 == n ? nullptr : keep.get() + r * n; }
};

// Self-attention of R tokens at their own positions: token r (row r of qkv) writes its key and
// value at position rows.pos[r] of cache row cache_row(r), then attends from its query to that
// row's slots 0..rows.pos[r]. A step's rows each have a cache row of their own (cache_row(r) = r);
// the T new tokens of one sequence (`GPTStep::extend`) share one, where the positions pos..pos+T-1
// make RowPositions' masks causal. Caches of layout `lay`.
template <class CacheRow>
void attend_rows(const float* qkv, float* k_cache, float* v_cache, Layout lay, const RowPositions& rows, float* out,
                 int64_t R, Heads heads, CacheRow cache_row) {
  for (int64_t r = 0; r < R; ++r) write_key_value(qkv, k_cache, v_cache, lay, r, cache_row(r), rows.pos[r], heads);
  auto row_of = [&](int64_t r, int64_t) { return cache_row(r); };
  auto keep_of = [&](int64_t r) { return rows.keep_of(r); };
  attend(qkv, heads.width(), k_cache, v_cache, lay, rows.n, row_of, keep_of, out, R, heads.H, heads.D, heads.group());
}

// Self-attention of a prefill: the prompts' tokens are the rows of qkv in order, prompt g's
// lengths[g] of them; they write their keys and values at positions 0.. of cache row
// first_row + g and attend causally among themselves. Causal attention over a whole prompt is a
// matrix product, which PyTorch's scaled_dot_product_attention does faster than `attend`'s
// query-by-query loop (with that loop a long prompt took longer to prefill than PyTorch's
// forward; BENCHMARKS.md, "Tuned CPU paths"). Caches (B, KV, L, D).
void attend_prompts(const float* qkv, const at::Tensor& k_cache, const at::Tensor& v_cache, Layout lay,
                    const std::vector<int64_t>& lengths, int64_t first_row, float* out, Heads heads) {
  const int64_t H = heads.H, D = heads.D, C = H * D, W = heads.width();
  float *kp = k_cache.data_ptr<float>(), *vp = v_cache.data_ptr<float>();
  const auto opts = k_cache.options();
  int64_t start = 0;
  for (size_t g = 0; g < lengths.size(); ++g) {
    const int64_t n = lengths[g], row = first_row + static_cast<int64_t>(g);
    for (int64_t t = 0; t < n; ++t) write_key_value(qkv, kp, vp, lay, start + t, row, t, heads);
    // q (1, H, n, D), a view of the queries of qkv; keys and values (1, KV, n, D) the row's first n slots.
    const at::Tensor q = at::from_blob(const_cast<float*>(qkv) + start * W, {1, H, n, D}, {0, D, W, 1}, opts);
    const at::Tensor keys = k_cache.select(0, row).narrow(1, 0, n).unsqueeze(0);
    const at::Tensor values = v_cache.select(0, row).narrow(1, 0, n).unsqueeze(0);
    const at::Tensor o = at::scaled_dot_product_attention(q, keys, values, {}, 0.0, /*is_causal=*/true, std::nullopt,
                                                          /*enable_gqa=*/heads.KV != H);
    at::from_blob(out + start * C, {n, H, D}, opts).copy_(o.select(0, 0).transpose(0, 1));
    start += n;
  }
}

// A gated linear unit's hidden values (Shazeer 2020; attnlab.nn.GatedFeedForward): g[b, j] =
// act(h[b, j]) * h[b, F + j] for the B rows of h (B, 2F), fc1's output [x W; x V]; g (B, F).
void gated_unit(const float* h, float* g, int64_t B, int64_t F, int64_t act) {
  for (int64_t b = 0; b < B; ++b) {
    const float* up = h + b * 2 * F + F;
    float* gb = g + b * F;
    attnlab::activate(h + b * 2 * F, gb, F, act);
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) gb[j] *= up[j];
  }
}

// A feed-forward layer's weights: fc1 (W, C) with W = F (dense) or 2F (gated, rows [gate; up]),
// fc2 (C, F), their biases (or empty tensors), and oneDNN's reordered copies (or none).
struct FeedForward {
  const Weight& fc1;
  const at::Tensor &packed1, &bias1;
  const Weight& fc2;
  const at::Tensor &packed2, &bias2;
};

// y = fc2(act(fc1(x))) for the R rows of x, dense or gated; h (R, W) and g (R, F) are room for
// the hidden values.
void feed_forward(const FeedForward& ffn, const float* x, float* h, float* g, float* y, int64_t R, int64_t act,
                  bool gated) {
  product(ffn.fc1, ffn.packed1, ffn.bias1, x, h, R);
  const int64_t F = ffn.fc2.in();
  if (gated) {
    gated_unit(h, g, R, F, act);
  } else {
    attnlab::activate(h, h, R * F, act);
    g = h;
  }
  product(ffn.fc2, ffn.packed2, ffn.bias2, g, y, R);
}

// The router of a mixture of experts (attnlab.nn.MixtureOfExperts.route) for one token's logits
// (E): its k most likely experts, most likely first, and their gates, the softmax's probabilities
// renormalised to sum to 1 when k > 1 (Mixtral, Jiang et al. 2024, Eq. 1; k = 1 is the Switch
// Transformer's gate, the probability itself). Ties go to the lower index.
void route(const float* logits, int64_t E, int64_t k, int64_t* chosen, float* gates) {
  const float top = *std::max_element(logits, logits + E);
  std::vector<float> p(E);
  float sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(logits[e] - top));
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  std::vector<int64_t> order(E);
  for (int64_t e = 0; e < E; ++e) order[e] = e;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float total = 0.f;
  for (int64_t i = 0; i < k; ++i) total += (gates[i] = p[chosen[i] = order[i]]);
  if (k > 1)
    for (int64_t i = 0; i < k; ++i) gates[i] /= total;
}

// A mixture of experts without a capacity limit on the R rows of x (C wide): y[r] = sum over the
// k experts e that row r is routed to of gate * expert_e(x[r]). router (E, C); fc1 (E, W, C),
// fc2 (E, C, F), biases (E, 1, W) and (E, 1, C) or empty tensors. Each expert runs once, on the
// rows routed to it gathered together, so it reads its weights once a step.
void mixture(const at::Tensor& router, const Weight& fc1, const at::Tensor& bias1, const Weight& fc2,
             const at::Tensor& bias2, const float* x, float* y, int64_t R, int64_t k, int64_t act, bool gated) {
  const int64_t E = router.size(0), C = router.size(1), W = fc1.out(), F = fc2.in();
  std::vector<float> logits(R * E), gates(R * k), xs(R * C), h(R * W), g(R * F), out(R * C);
  std::vector<int64_t> chosen(R * k);
  const at::Tensor none;
  product(router, none, none, x, logits.data(), R);
  for (int64_t r = 0; r < R; ++r) route(logits.data() + r * E, E, k, chosen.data() + r * k, gates.data() + r * k);
  std::fill_n(y, R * C, 0.f);
  std::vector<int64_t> rows;
  std::vector<float> row_gates;
  for (int64_t e = 0; e < E; ++e) {
    rows.clear(), row_gates.clear();
    for (int64_t i = 0; i < R * k; ++i)
      if (chosen[i] == e) rows.push_back(i / k), row_gates.push_back(gates[i]);
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n; ++i) std::copy_n(x + rows[i] * C, C, xs.data() + i * C);
    const Weight w1 = fc1.expert(e), w2 = fc2.expert(e);
    const at::Tensor b1 = bias1.numel() ? bias1.select(0, e).select(0, 0) : none;
    const at::Tensor b2 = bias2.numel() ? bias2.select(0, e).select(0, 0) : none;
    feed_forward({w1, none, b1, w2, none, b2}, xs.data(), h.data(), g.data(), out.data(), n, act, gated);
    for (int64_t i = 0; i < n; ++i) {
      float* yr = y + rows[i] * C;
      const float* o = out.data() + i * C;
      for (int64_t c = 0; c < C; ++c) yr[c] += row_gates[i] * o[c];
    }
  }
}

// A K-quant weight's row kinds are (..., out) uint8, each kQ4K or kQ6K, and its rows the
// super-blocks of a multiple of 256 values, as far apart as the widest kind among them takes.
void check_kinds(const at::Tensor& w, const at::Tensor& s) {
  TORCH_CHECK(s.device().is_cpu() && s.is_contiguous() && s.sizes() == w.sizes().slice(0, w.dim() - 1),
              "a K-quant weight's row kinds must be (..., out) uint8, contiguous, on the CPU");
  const uint8_t* kinds = s.data_ptr<uint8_t>();
  TORCH_CHECK(std::all_of(kinds, kinds + s.numel(), [](uint8_t k) { return k <= attnlab::kQ6K; }),
              "a K-quant row kind is 0 (Q4_K) or 1 (Q6_K)");
  const bool six = std::find(kinds, kinds + s.numel(), attnlab::kQ6K) != kinds + s.numel();
  TORCH_CHECK(w.size(-1) % (six ? attnlab::kQ6KBytes : attnlab::kQ4KBytes) == 0,
              "a K-quant weight's rows must be whole super-blocks of its widest kind");
}

// An int8 weight's scales are (..., out, ceil(in / 32)), an int4 weight's (..., out, in / 32)
// (its bytes (..., out, in / 2), in a multiple of 32), a K-quant weight's its row kinds
// (`check_kinds`); other weights have none.
void check_scales(const at::Tensor& w, const at::Tensor& s) {
  const auto type = w.scalar_type();
  if (type != at::kChar && type != at::kByte) {
    TORCH_CHECK(!s.defined() || s.numel() == 0, "only int8, int4 and K-quant weights have scales");
    return;
  }
  if (type == at::kByte && Weight::is_k(s)) return check_kinds(w, s);
  std::vector<int64_t> shape(w.sizes().begin(), w.sizes().end());
  const int64_t in = Weight::columns(w, s);
  TORCH_CHECK(type == at::kChar || in % attnlab::kQ4Block == 0, "an int4 weight's rows must be a multiple of ",
              attnlab::kQ4Block, " wide");
  shape.back() = attnlab::q8_blocks(in);
  check_cpu_fp32({s}, "the quantized weights' scales");
  TORCH_CHECK(s.sizes() == at::IntArrayRef(shape), "a quantized weight's scales must be (..., out, ceil(in / ",
              attnlab::kQ8Block, "))");
}

}  // namespace

// A model's decoding step bound to its weights and caches, made once per generation.
// params: kPerBlock tensors per block, then the final norm's weight and bias and the head's
// weight (V, C), untied or the token embedding itself; an absent bias is an empty tensor. A
// block's: norm1's weight and bias; in_proj's weight ((H + 2 KV) D, C) and bias; out_proj's;
// norm2's; then its feed-forward layer's fc1 weight and bias, fc2 weight and bias, and router:
// - dense or gated (SwiGLU, GeGLU, ... where `gated`): fc1 (W, C), W = F or 2F rows [gate; up],
//   fc2 (C, F), and an empty router;
// - a mixture of experts: fc1 (E, W, C), its bias (E, 1, W), fc2 (E, C, F), its bias (E, 1, C), and
//   the router (E, C); each token goes to its `top_k` most likely experts.
// token_embedding (V, C); positions (P, C), the position vectors added to the embeddings (zeros
// for none); rope_cos and rope_sin (P, D/2), the cosines and sines of the rotary angles of each
// position (attnlab.nn.rope_angles), or empty tensors for a model without rotary positions.
// Caches (B, KV, L, D), one per block: KV < H key/value heads is grouped-query attention.
// rms_norm: every norm is RMSNorm (else LayerNorm).
// The products' weights (in_proj, out_proj, fc1 and fc2 of each block, and the head) are fp32,
// bf16, int8, int4 or K-quants (`Weight`); scales holds, in that order (kProductsPerBlock per block,
// then the head's), the int8 and int4 ones' scales, the K-quant ones' row kinds and an empty
// tensor for each other. Every other tensor is fp32.
class GPTStep {
 public:
  GPTStep(std::vector<at::Tensor> params, std::vector<at::Tensor> scales, at::Tensor token_embedding,
          at::Tensor positions, at::Tensor rope_cos, at::Tensor rope_sin, std::vector<at::Tensor> k_caches,
          std::vector<at::Tensor> v_caches, int64_t n_head, double eps, int64_t activation, bool gated, bool rms_norm,
          int64_t top_k)
      : params_(std::move(params)), scales_(std::move(scales)), tokens_(std::move(token_embedding)),
        positions_(std::move(positions)),
        cos_(std::move(rope_cos)), sin_(std::move(rope_sin)), k_(std::move(k_caches)), v_(std::move(v_caches)),
        eps_(static_cast<float>(eps)), act_(activation), gated_(gated), rms_(rms_norm), top_k_(top_k) {
    const int64_t n_layer = static_cast<int64_t>(k_.size());
    TORCH_CHECK(n_layer > 0 && v_.size() == k_.size(), "one key and one value cache per block");
    TORCH_CHECK(static_cast<int64_t>(params_.size()) == n_layer * kPerBlock + 3, "wrong number of parameters");
    TORCH_CHECK(static_cast<int64_t>(scales_.size()) == n_layer * kProductsPerBlock + 1,
                "one scale tensor (or an empty one) per product");
    check_weights(n_layer);
    check_cpu_fp32(k_, "caches");
    check_cpu_fp32(v_, "caches");
    check_tables(tokens_, positions_);
    C_ = tokens_.size(1);
    TORCH_CHECK(n_head > 0 && C_ % n_head == 0, "n_head must divide the width");
    TORCH_CHECK(k_[0].dim() == 4 && k_[0].size(1) > 0 && n_head % k_[0].size(1) == 0,
                "the caches' key/value heads must divide n_head");
    heads_ = {n_head, k_[0].size(1), C_ / n_head};
    B_ = k_[0].size(0), L_ = k_[0].size(2);
    for (int64_t l = 0; l < n_layer; ++l) {
      TORCH_CHECK(k_[l].dim() == 4 && k_[l].size(0) == B_ && k_[l].size(1) == heads_.KV && k_[l].size(2) == L_ &&
                      k_[l].size(3) == heads_.D && v_[l].sizes() == k_[l].sizes(),
                  "caches must be (B, KV, L, D)");
      check_block(l);
    }
    if (cos_.numel()) {
      check_cpu_fp32({cos_, sin_}, "the rotary tables");
      TORCH_CHECK(heads_.D % 2 == 0 && cos_.dim() == 2 && cos_.size(0) == positions_.size(0) &&
                      cos_.size(1) == heads_.D / 2 && sin_.sizes() == cos_.sizes(),
                  "rope_cos and rope_sin must be (P, D/2), as many positions as the position table");
    }
    V_ = params_.back().size(0);
    const auto opts = tokens_.options();  // the step's working buffers, made once
    x_ = at::empty({B_, C_}, opts), h_ = at::empty({B_, C_}, opts), qkv_ = at::empty({B_, heads_.width()}, opts);
    a_ = at::empty({B_, C_}, opts), f_ = at::empty({B_, W_}, opts), g_ = at::empty({B_, F_}, opts);
    y_ = at::empty({B_, C_}, opts);
  }

  // tokens (B,) int64: the newest token of each sequence, at position `pos` (its cache slot).
  // packed: oneDNN's reordered copies of the products' weights, for steps of more than 8 rows
  // (kProductsPerBlock per block, then the head's), or none. Returns the next-token logits (B, V).
  at::Tensor step(const at::Tensor& tokens, int64_t pos, const std::vector<at::Tensor>& packed) {
    TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == B_ && tokens.scalar_type() == at::kLong, "tokens must be (B,) int64");
    TORCH_CHECK(pos >= 0 && pos < L_ && pos < positions_.size(0), "position ", pos, " is outside the cache");
    const std::vector<int64_t> at_pos(B_, pos);
    return run(tokens.contiguous(), at_pos.data(), B_, packed);
  }

  // tokens (R,) int64, R <= B: the newest token of the sequences in cache rows 0..R-1, row r at
  // its own position positions[r] (its cache slot), attending to its slots 0..positions[r].
  // packed as for `step`. Returns the next-token logits (R, V).
  at::Tensor step_rows(const at::Tensor& tokens, const at::Tensor& positions, const std::vector<at::Tensor>& packed) {
    TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) <= B_ && tokens.scalar_type() == at::kLong,
                "tokens must be (R,) int64 with R <= ", B_, " (the cache's rows)");
    TORCH_CHECK(positions.dim() == 1 && positions.size(0) == tokens.size(0) && positions.scalar_type() == at::kLong,
                "positions must be (R,) int64, one per token");
    const at::Tensor at_pos = positions.contiguous();
    const int64_t* pos = at_pos.data_ptr<int64_t>();
    for (int64_t r = 0; r < at_pos.size(0); ++r)
      TORCH_CHECK(pos[r] >= 0 && pos[r] < L_ && pos[r] < positions_.size(0), "position ", pos[r], " is outside the cache");
    return run(tokens.contiguous(), pos, tokens.size(0), packed);
  }

  // tokens (T,) int64, T >= 1: the next T tokens of the sequence in cache row `row`, at positions
  // pos .. pos + T - 1 (its slots 0 .. pos - 1 already filled). Each token writes its key and value
  // at its slot and attends to the row's slots up to its own: the cache and the tokens before it
  // (causal). The T tokens go through each product together, which reads every weight once for
  // all of them. packed as for `step`, for T rows. Returns the logits after each token (T, V):
  // speculative decoding's verification of T - 1 drafts; with last_only, the last token's alone
  // (1, V): a prompt, or a drafter's context, read into the cache.
  at::Tensor extend(const at::Tensor& tokens, int64_t row, int64_t pos, bool last_only,
                    const std::vector<at::Tensor>& packed) {
    TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) >= 1 && tokens.scalar_type() == at::kLong,
                "tokens must be (T,) int64 with T >= 1");
    const int64_t T = tokens.size(0), slots = std::min(L_, positions_.size(0));
    TORCH_CHECK(row >= 0 && row < B_, "row ", row, " is outside the cache's ", B_, " rows");
    TORCH_CHECK(pos >= 0 && pos + T <= slots, "positions ", pos, " .. ", pos + T - 1, " are outside the cache's ",
                slots, " slots");
    std::vector<int64_t> at_pos(T);
    for (int64_t t = 0; t < T; ++t) at_pos[t] = pos + t;
    const RowPositions rows(at_pos.data(), T);
    auto attention = [&](int64_t l, const float* qkv, float* out) {
      attend_rows(qkv, k_[l].data_ptr<float>(), v_[l].data_ptr<float>(), cache_layout(), rows, out, T, heads_,
                  [row](int64_t) { return row; });
    };
    const int64_t last = T - 1;
    return run(tokens.contiguous(), at_pos.data(), T, last_only ? &last : nullptr, 1, packed, attention);
  }

  // tokens (N,) int64: G prompts one after another, prompt g's lengths[g] tokens (at least one)
  // prefilled into cache row first_row + g at positions 0 .. lengths[g] - 1, each token attending
  // to the prompt's tokens up to its own. packed as for `step`, for N rows. Returns the logits
  // after each prompt's last token (G, V).
  at::Tensor prefill(const at::Tensor& tokens, const std::vector<int64_t>& lengths, int64_t first_row,
                     const std::vector<at::Tensor>& packed) {
    const int64_t N = tokens.size(0), G = static_cast<int64_t>(lengths.size());
    TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == at::kLong, "tokens must be (N,) int64");
    TORCH_CHECK(G > 0 && first_row >= 0 && first_row + G <= B_, "prompts for rows ", first_row, " .. ",
                first_row + G - 1, ", but the cache has ", B_, " rows");
    std::vector<int64_t> pos, last;
    for (const int64_t n : lengths) {
      TORCH_CHECK(n >= 1 && n <= L_ && n <= positions_.size(0), "a prompt of ", n, " tokens; the cache holds 1 to ", L_);
      for (int64_t t = 0; t < n; ++t) pos.push_back(t);
      last.push_back(static_cast<int64_t>(pos.size()) - 1);
    }
    TORCH_CHECK(static_cast<int64_t>(pos.size()) == N, "the lengths add up to ", pos.size(), " tokens, not ", N);
    auto attention = [&](int64_t l, const float* qkv, float* out) {
      attend_prompts(qkv, k_[l], v_[l], cache_layout(), lengths, first_row, out, heads_);
    };
    return run(tokens.contiguous(), pos.data(), N, last.data(), G, packed, attention);
  }

 private:
  // The caches' layout, (B, KV, L, D).
  Layout cache_layout() const { return {heads_.KV * L_ * heads_.D, heads_.D, L_ * heads_.D}; }

  // The weight of product i (kProductsPerBlock per block, then the head), parameter `index` of params.
  Weight weight(int64_t i, int64_t index) const { return {params_[index], scales_[i]}; }

  // The products' weights in a format `Weight` reads, with their scales; every other tensor fp32.
  void check_weights(int64_t n_layer) const {
    std::vector<int64_t> products;  // the indices in params_ of the products' weights, in scales_' order
    for (int64_t l = 0; l < n_layer; ++l)
      for (const int64_t i : {2, 4, 8, 10}) products.push_back(l * kPerBlock + i);
    products.push_back(static_cast<int64_t>(params_.size()) - 1);
    std::vector<at::Tensor> rest;
    for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i)
      if (std::find(products.begin(), products.end(), i) == products.end()) rest.push_back(params_[i]);
    check_cpu_fp32(rest, "weights");
    for (size_t k = 0; k < products.size(); ++k) {
      const at::Tensor &w = params_[products[k]], &s = scales_[k];
      const auto type = w.scalar_type();
      TORCH_CHECK(w.device().is_cpu() && w.is_contiguous() && w.dim() >= 2 &&
                      (type == at::kFloat || type == at::kBFloat16 || type == at::kChar || type == at::kByte),
                  "the products' weights must be contiguous fp32, bf16, int8, int4 (uint8 nibbles) or K-quant "
                  "(uint8 super-blocks) CPU tensors");
      check_scales(w, s);
    }
  }

  // A block's tensors (`params`, above) have the shapes the step reads; the widest hidden layer
  // of the dense or gated ones (W_, F_) sizes the working buffers.
  void check_block(int64_t l) {
    const at::Tensor* p = params_.data() + l * kPerBlock;
    const int64_t C = C_;
    TORCH_CHECK(p[0].numel() == C && p[6].numel() == C, "norm weights must be (C,)");
    const at::Tensor* s = scales_.data() + l * kProductsPerBlock;  // in_proj's, out_proj's, fc1's, fc2's
    const auto in = [&](int64_t index) {  // of params 2, 4, 8 and 10: products 0 to 3
      return Weight::columns(p[index], s[index < 8 ? index / 2 - 1 : index / 2 - 2]);
    };
    TORCH_CHECK(p[2].dim() == 2 && p[2].size(0) == heads_.width() && in(2) == C,
                "in_proj's weight must be ((H + 2 KV) D, C)");
    TORCH_CHECK(p[4].dim() == 2 && p[4].size(0) == C && in(4) == C, "out_proj's weight must be (C, C)");
    const bool moe = p[12].numel() > 0;
    const at::Tensor &fc1 = p[8], &fc2 = p[10];
    const int64_t dims = moe ? 3 : 2, experts = moe ? p[12].size(0) : 1;
    TORCH_CHECK(fc1.dim() == dims && fc2.dim() == dims, "feed-forward weights must be (W, C) and (C, F), or per expert");
    const int64_t W = fc1.size(dims - 2), F = in(10);
    TORCH_CHECK(in(8) == C && fc2.size(dims - 2) == C && W == (gated_ ? 2 * F : F),
                "fc1 must have F rows (2F gated) of C and fc2 C rows of F");
    if (moe) {
      TORCH_CHECK(p[12].dim() == 2 && p[12].size(1) == C && fc1.size(0) == experts && fc2.size(0) == experts,
                  "the router must be (E, C), the experts' weights (E, W, C) and (E, C, F)");
      TORCH_CHECK(top_k_ >= 1 && top_k_ <= experts, "top_k must be between 1 and the number of experts");
    } else {
      W_ = std::max(W_, W), F_ = std::max(F_, F);
    }
  }

  // The rows' step: rows r = 0..R-1 at positions pos[r] of cache rows 0..R-1, attending as
  // RowPositions says. The logits of every row (R, V).
  at::Tensor run(const at::Tensor& token_ids, const int64_t* pos, int64_t R, const std::vector<at::Tensor>& packed) {
    const RowPositions rows(pos, R);
    auto attention = [&](int64_t l, const float* qkv, float* out) {
      attend_rows(qkv, k_[l].data_ptr<float>(), v_[l].data_ptr<float>(), cache_layout(), rows, out, R, heads_,
                  [](int64_t r) { return r; });
    };
    return run(token_ids, pos, R, nullptr, 0, packed, attention);
  }

  // R tokens, token r's id ids[r] at position pos[r], through every block; attention(l, qkv, out)
  // is block l's self-attention. The logits of the tokens `out` (K of them; all R, in order, when null).
  template <class Attention>
  at::Tensor run(const at::Tensor& token_ids, const int64_t* pos, int64_t R, const int64_t* out, int64_t K,
                 const std::vector<at::Tensor>& packed, Attention attention) {
    const int64_t B = R, C = C_, n_layer = static_cast<int64_t>(k_.size());
    TORCH_CHECK(packed.empty() || static_cast<int64_t>(packed.size()) == n_layer * kProductsPerBlock + 1,
                "one reordered weight per product, or none");
    const at::Tensor none;  // no reordered weight, and the head has no bias
    auto reordered = [&](int64_t i) -> const at::Tensor& { return packed.empty() ? none : packed[i]; };
    // More tokens than the cache has rows (a prefill): working buffers for this call alone.
    auto buffer = [&](const at::Tensor& kept, int64_t width) { return R <= B_ ? kept : at::empty({R, width}, kept.options()); };
    const at::Tensor x = buffer(x_, C), h = buffer(h_, C), y = buffer(y_, C), a = buffer(a_, C);
    const at::Tensor qkv_t = buffer(qkv_, heads_.width()), f_t = buffer(f_, W_), g_t = buffer(g_, F_);
    float *xp = x.data_ptr<float>(), *hp = h.data_ptr<float>(), *yp = y.data_ptr<float>(), *ap = a.data_ptr<float>();
    float *qkv = qkv_t.data_ptr<float>(), *f = f_t.data_ptr<float>(), *g = g_t.data_ptr<float>();
    embed(tokens_, positions_, token_ids.data_ptr<int64_t>(), B, [pos](int64_t b) { return pos[b]; }, 1.f, xp);
    for (int64_t l = 0; l < n_layer; ++l) {
      const at::Tensor* p = params_.data() + l * kPerBlock;
      const int64_t k = l * kProductsPerBlock;
      norm(rms_, xp, p[0], p[1], hp, B, C, eps_);
      product(weight(k, l * kPerBlock + 2), reordered(k), p[3], hp, qkv, B);
      if (cos_.numel()) rotate_queries_and_keys(qkv, pos, B);
      attention(l, qkv, ap);
      product(weight(k + 1, l * kPerBlock + 4), reordered(k + 1), p[5], ap, yp, B);
      for (int64_t i = 0; i < B * C; ++i) xp[i] += yp[i];
      norm(rms_, xp, p[6], p[7], hp, B, C, eps_);
      const Weight fc1 = weight(k + 2, l * kPerBlock + 8), fc2 = weight(k + 3, l * kPerBlock + 10);
      if (p[12].numel())
        mixture(p[12], fc1, p[9], fc2, p[11], hp, yp, B, top_k_, act_, gated_);
      else
        feed_forward({fc1, reordered(k + 2), p[9], fc2, reordered(k + 3), p[11]}, hp, f, g, yp, B, act_, gated_);
      for (int64_t i = 0; i < B * C; ++i) xp[i] += yp[i];
    }
    if (out) {  // only these tokens' logits: gather their rows to the front
      for (int64_t k = 0; k < K; ++k) std::copy_n(xp + out[k] * C, C, yp + k * C);
      xp = yp;
    }
    const int64_t rows_out = out ? K : B;
    at::Tensor logits = at::empty({rows_out, V_}, tokens_.options());
    const at::Tensor* p = params_.data() + n_layer * kPerBlock;
    norm(rms_, xp, p[0], p[1], hp, rows_out, C, eps_);
    const int64_t head = n_layer * kProductsPerBlock;
    product(weight(head, static_cast<int64_t>(params_.size()) - 1), reordered(head), none, hp,
            logits.data_ptr<float>(), rows_out);
    return logits;
  }

  // RoPE on the queries and keys of the R rows of qkv, row r at position pos[r] (the keys enter the
  // cache rotated, as attnlab.nn.RotaryPositions has them). They are the row's first H + KV heads.
  void rotate_queries_and_keys(float* qkv, const int64_t* pos, int64_t R) const {
    const int64_t half = heads_.D / 2;
    const float *cos = cos_.data_ptr<float>(), *sin = sin_.data_ptr<float>();
    for (int64_t r = 0; r < R; ++r)
      rotate(qkv + r * heads_.width(), heads_.H + heads_.KV, heads_.D, cos + pos[r] * half, sin + pos[r] * half);
  }

  std::vector<at::Tensor> params_, scales_;
  at::Tensor tokens_, positions_, cos_, sin_;
  std::vector<at::Tensor> k_, v_;
  at::Tensor x_, h_, qkv_, a_, f_, g_, y_;  // working buffers of `step`
  Heads heads_{1, 1, 1};
  float eps_;
  int64_t act_;
  bool gated_, rms_;
  int64_t top_k_;
  int64_t B_ = 0, C_ = 0, L_ = 0, V_ = 0;
  int64_t W_ = 1, F_ = 1;  // the widest dense or gated layer's fc1 rows and hidden width
};

// The decoder of an encoder-decoder Transformer bound to its weights: one step of beam search or
// greedy decoding per call. params: kPerDecoderBlock tensors per block (the order of fused.py),
// then the final LayerNorm's weight and bias (empty tensors for post-norm, which has none) and
// the output projection's weight (V, C). packed: oneDNN's reordered copies of the products'
// weights, per block the self-attention in and out, the cross-attention query and out, the two
// feed-forward weights, then the output projection's (any that is not an MKLDNN tensor: none).
// token_embedding (V, C), multiplied by embedding_scale; positions (P, C), added. An absent bias
// is an empty tensor.
constexpr int64_t kPerDecoderBlock = 18, kProductsPerDecoderBlock = 6;

class DecoderStep {
 public:
  DecoderStep(std::vector<at::Tensor> params, std::vector<at::Tensor> packed, at::Tensor token_embedding,
              at::Tensor positions, int64_t n_head, double eps, int64_t activation, bool pre_norm,
              double embedding_scale)
      : params_(std::move(params)), packed_(std::move(packed)), tokens_(std::move(token_embedding)), positions_(std::move(positions)),
        H_(n_head), eps_(static_cast<float>(eps)), act_(activation), pre_norm_(pre_norm),
        scale_(static_cast<float>(embedding_scale)) {
    TORCH_CHECK(params_.size() >= kPerDecoderBlock + 3 && (params_.size() - 3) % kPerDecoderBlock == 0,
                "wrong number of parameters");
    check_cpu_fp32(params_, "weights");
    check_tables(tokens_, positions_);
    n_layer_ = static_cast<int64_t>(params_.size() - 3) / kPerDecoderBlock;
    TORCH_CHECK(static_cast<int64_t>(packed_.size()) == n_layer_ * kProductsPerDecoderBlock + 1,
                "one reordered weight (or an empty tensor) per product");
    C_ = tokens_.size(1);
    TORCH_CHECK(C_ % H_ == 0, "n_head must divide the width");
    D_ = C_ / H_;
  }

  // tokens (R,) int64: each row's newest token, at position `pos` (its cache slot). Caches
  // (P >= R, L, H, D), one key and one value cache per block, and origin (R, L) int64: see
  // attend_cached. Memory keys and values (M, H, S, D) per block, memory_row (R,) int64, the
  // memory row of each row's source, keep (M, S) bool, the source positions that are not padding.
  // Returns the next-token logits (R, V).
  at::Tensor step(const at::Tensor& tokens, int64_t pos, const std::vector<at::Tensor>& k_caches,
                  const std::vector<at::Tensor>& v_caches, at::Tensor origin, const std::vector<at::Tensor>& memory_k,
                  const std::vector<at::Tensor>& memory_v, const at::Tensor& memory_row, const at::Tensor& keep) {
    TORCH_CHECK(tokens.dim() == 1 && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
                "tokens must be (R,) int64");
    const int64_t R = tokens.size(0), C = C_, H = H_, D = D_;
    TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == n_layer_ && v_caches.size() == k_caches.size() &&
                    static_cast<int64_t>(memory_k.size()) == n_layer_ && memory_v.size() == memory_k.size(),
                "one key and one value cache, and one memory key and value tensor, per block");
    check_cpu_fp32(k_caches, "caches");
    check_cpu_fp32(v_caches, "caches");
    check_cpu_fp32(memory_k, "memory keys and values");
    check_cpu_fp32(memory_v, "memory keys and values");
    const int64_t L = k_caches[0].size(1), M = memory_k[0].size(0), S = memory_k[0].size(2);
    for (int64_t l = 0; l < n_layer_; ++l) {
      TORCH_CHECK(k_caches[l].dim() == 4 && k_caches[l].size(0) >= R && k_caches[l].size(1) == L &&
                      k_caches[l].size(2) == H && k_caches[l].size(3) == D && v_caches[l].sizes() == k_caches[l].sizes(),
                  "caches must be (P, L, H, D) with P >= R rows");
      TORCH_CHECK(memory_k[l].dim() == 4 && memory_k[l].size(0) == M && memory_k[l].size(1) == H &&
                      memory_k[l].size(2) == S && memory_k[l].size(3) == D && memory_v[l].sizes() == memory_k[l].sizes(),
                  "memory keys and values must be (M, H, S, D)");
    }
    TORCH_CHECK(origin.scalar_type() == at::kLong && origin.is_contiguous() && origin.dim() == 2 &&
                    origin.size(0) == R && origin.size(1) == L,
                "origin must be (R, L) int64, contiguous");
    TORCH_CHECK(memory_row.scalar_type() == at::kLong && memory_row.is_contiguous() && memory_row.dim() == 1 &&
                    memory_row.size(0) == R,
                "memory_row must be (R,) int64");
    TORCH_CHECK(keep.scalar_type() == at::kBool && keep.is_contiguous() && keep.dim() == 2 && keep.size(0) == M &&
                    keep.size(1) == S,
                "keep must be (M, S) bool, contiguous");
    TORCH_CHECK(pos >= 0 && pos < L && pos < positions_.size(0), "position ", pos, " is outside the cache");
    const int64_t* ids = tokens.data_ptr<int64_t>();
    const int64_t* rows = memory_row.data_ptr<int64_t>();
    int64_t* from = origin.data_ptr<int64_t>();
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(rows[r] >= 0 && rows[r] < M, "memory row ", rows[r], " is outside the memory");
      for (int64_t t = 0; t < pos; ++t)
        TORCH_CHECK(from[r * L + t] >= 0 && from[r * L + t] < k_caches[0].size(0), "origin ", from[r * L + t],
                    " is outside the caches");
    }

    const auto opts = tokens_.options();
    at::Tensor x_t = at::empty({R, C}, opts), h_t = at::empty({R, C}, opts), a_t = at::empty({R, C}, opts);
    at::Tensor y_t = at::empty({R, C}, opts), qkv_t = at::empty({R, 3 * C}, opts);
    at::Tensor f_t = at::empty({R, params_[12].size(0)}, opts);
    float *x = x_t.data_ptr<float>(), *h = h_t.data_ptr<float>(), *a = a_t.data_ptr<float>();
    float *y = y_t.data_ptr<float>(), *qkv = qkv_t.data_ptr<float>(), *f = f_t.data_ptr<float>();
    embed(tokens_, positions_, ids, R, [pos](int64_t) { return pos; }, scale_, x);
    const bool* keep_p = keep.data_ptr<bool>();
    auto memory_of = [&](int64_t r, int64_t) { return rows[r]; };
    auto source_of = [&](int64_t r) { return keep_p + rows[r] * S; };
    // A sublayer in its residual connection, in the block's order: pre-norm x + F(LN(x)), post-norm
    // LN(x + F(x)). `sublayer(in)` writes F(in) to y.
    auto residual = [&](const at::Tensor& norm_w, const at::Tensor& norm_b, auto sublayer) {
      if (pre_norm_) {
        layer_norm(x, norm_w.data_ptr<float>(), data_or_null(norm_b), h, R, C, eps_);
        sublayer(h);
        for (int64_t i = 0; i < R * C; ++i) x[i] += y[i];
      } else {
        sublayer(x);
        for (int64_t i = 0; i < R * C; ++i) x[i] += y[i];
        layer_norm(x, norm_w.data_ptr<float>(), data_or_null(norm_b), x, R, C, eps_);
      }
    };
    for (int64_t l = 0; l < n_layer_; ++l) {
      const at::Tensor* p = params_.data() + l * kPerDecoderBlock;
      const at::Tensor* pk = packed_.data() + l * kProductsPerDecoderBlock;
      residual(p[4], p[5], [&](const float* in) {  // masked self-attention over the cache
        product(p[0], pk[0], p[1], in, qkv, R);
        attend_cached(qkv, k_caches[l].data_ptr<float>(), v_caches[l].data_ptr<float>(), {L * H * D, H * D, D}, from,
                      a, R, H, L, D, pos);
        product(p[2], pk[1], p[3], a, y, R);
      });
      residual(p[10], p[11], [&](const float* in) {  // encoder-decoder attention
        product(p[6], pk[2], p[7], in, qkv, R);  // the queries alone: C wide
        attend(qkv, C, memory_k[l].data_ptr<float>(), memory_v[l].data_ptr<float>(), {H * S * D, D, S * D}, S,
               memory_of, source_of, a, R, H, D);
        product(p[8], pk[3], p[9], a, y, R);
      });
      residual(p[16], p[17], [&](const float* in) {  // feed-forward
        product(p[12], pk[4], p[13], in, f, R);
        attnlab::activate(f, f, R * f_t.size(1), act_);
        product(p[14], pk[5], p[15], f, y, R);
      });
    }
    const at::Tensor* p = params_.data() + n_layer_ * kPerDecoderBlock;
    const float* last = x;
    if (p[0].numel()) {
      layer_norm(x, p[0].data_ptr<float>(), data_or_null(p[1]), h, R, C, eps_);
      last = h;
    }
    const at::Tensor& out_packed = packed_.back();
    if (R > 8 && out_packed.is_mkldnn())  // the logits straight from oneDNN, no copy
      return packed_product(at::from_blob(const_cast<float*>(last), {R, C}, tokens_.options()), out_packed, at::Tensor());
    at::Tensor logits = at::empty({R, tokens_.size(0)}, opts);
    product(p[2], out_packed, at::Tensor(), last, logits.data_ptr<float>(), R);
    return logits;
  }

 private:
  std::vector<at::Tensor> params_, packed_;
  at::Tensor tokens_, positions_;
  int64_t H_;
  float eps_;
  int64_t act_;
  bool pre_norm_;
  float scale_;
  int64_t n_layer_ = 0, C_ = 0, D_ = 0;
};

// x W^T (R, out) for x (R, in) fp32 and a weight stored as the GPT step stores it (`Weight`), by
// the step's own `product`: the tests hold each format's streamed and widened products to PyTorch's.
at::Tensor stored_linear(const at::Tensor& values, const at::Tensor& scales, const at::Tensor& x) {
  TORCH_CHECK(values.dim() == 2 && values.is_contiguous() && values.device().is_cpu(), "values must be (out, in)");
  check_scales(values, scales);
  const Weight weight(values, scales);
  check_cpu_fp32({x}, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) == weight.in(), "x must be (R, in), contiguous");
  at::Tensor y = at::empty({x.size(0), weight.out()}, x.options());
  product(weight, at::Tensor(), at::Tensor(), x.data_ptr<float>(), y.data_ptr<float>(), x.size(0));
  return y;
}

// The steps run without the GIL: a server's decoding thread spends most of its time in them, and
// its event loop (the streamed responses, new requests) needs the interpreter meanwhile. Arguments
// and results are converted with the GIL held; the steps touch no Python object.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using without_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
  m.attr("STREAMED_MAX_ROWS") = kStreamedMaxRows;
  m.attr("WIDENED_MIN_ROWS") = kWidenedMinRows;
  m.attr("Q4_PATH") = attnlab::kQ4Path;
  m.attr("QK_PATH") = attnlab::kQKPath;
  m.def("stored_linear", &stored_linear, without_gil(),
        "x W^T for a stored weight as the GPT step multiplies it (streamed or widened by the rows' number): "
        "values, scales, x (R, in) -> (R, out)");
  m.def("set_portable_q4", [](bool portable) { attnlab::portable_q4() = portable; },
        "Whether the int4 and K-quant products take the plain C++ path on any CPU (the tests compare it with the vector ones)");
  // module_local: a process may load builds for two instruction sets (tests/accel/test_q4.py), and
  // pybind11 registers a class of one name once per process otherwise.
  pybind11::class_<GPTStep>(m, "GPTStep", pybind11::module_local())
      .def(pybind11::init<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor, at::Tensor, at::Tensor,
                          at::Tensor, std::vector<at::Tensor>, std::vector<at::Tensor>, int64_t, double, int64_t, bool,
                          bool, int64_t>())
      .def("step", &GPTStep::step, without_gil(),
           "One pre-norm GPT decoding step (CPU; fp32, bf16, int8, int4 or K-quant weights): tokens (B,), pos, packed -> "
           "logits (B, V)")
      .def("step_rows", &GPTStep::step_rows, without_gil(),
           "The step of cache rows 0..R-1, each at its own position: tokens (R,), positions (R,), packed -> logits (R, V)")
      .def("extend", &GPTStep::extend, without_gil(),
           "The next T tokens of the sequence in cache row `row`, at positions pos .. pos + T - 1, causal among "
           "themselves: tokens (T,), row, pos, last_only, packed -> logits after each (T, V), or the last (1, V)")
      .def("prefill", &GPTStep::prefill, without_gil(),
           "Prompts prefilled into rows first_row, first_row + 1, ...: tokens (N,), lengths, first_row, packed -> "
           "logits after each prompt (G, V)");
  pybind11::class_<DecoderStep>(m, "DecoderStep", pybind11::module_local())
      .def(pybind11::init<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor, at::Tensor, int64_t, double,
                          int64_t, bool, double>())
      .def("step", &DecoderStep::step, without_gil(),
           "One encoder-decoder decoding step (CPU, fp32): tokens (R,), pos, caches, origin, memory -> logits (R, V)");
}
