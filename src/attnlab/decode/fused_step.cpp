// One decoding step of a pre-norm GPT in a single call, for the CPU: attnlab.decode.fused.
//
// A step of a small model is ~100 PyTorch operators of a few microseconds each, and at batch 1
// their call overhead costs as much as the arithmetic. Here the same step is plain loops over
// fp32 buffers: per block LayerNorm, the q/k/v product, attention over the cache, the output
// product and residual, LayerNorm, the feed-forward products and residual; then the final
// LayerNorm and the language-model head. The weight products read each weight row once for
// every sequence of the batch, so up to a few sequences cost about what one does.
//
// Layouts are PyTorch's: weights (out, in) row-major, caches (B, H, L, D), q/k/v the three
// C-wide thirds of the in-projection output, head h the columns [h*D, (h+1)*D) of each.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kPerBlock = 12;  // tensors per block in `params`, in the order of fused.py

const float* data_or_null(const at::Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

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

// tanh as a rational function of x (the one Eigen uses for float; within 4e-7 of tanh on every
// input, against 6e-8 for float32's own), written so that the loop calling it vectorizes: the
// library tanh is one scalar call per element (ad hoc: a batch-8 6x6x384 step 5.2-5.4 ms with it,
// 4.4-4.8 ms with this).
inline float rational_tanh(float x) {
  constexpr float kClamp = 7.90531110763549805f;
  const float c = std::min(kClamp, std::max(-kClamp, x)), c2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * c2 + 2.00018790482477e-13f;
  p = p * c2 - 8.60467152213735e-11f;
  p = p * c2 + 5.12229709037114e-08f;
  p = p * c2 + 1.48572235717979e-05f;
  p = p * c2 + 6.37261928875436e-04f;
  p = p * c2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * c2 + 1.18534705686654e-04f;
  q = q * c2 + 2.26843463243900e-03f;
  q = q * c2 + 4.89352518554385e-03f;
  return std::fabs(x) < 0.0004f ? x : c * p / q;
}

// erf as a rational function of x, likewise Eigen's for float (within 5e-7 of erf; past |x| = 4
// erf is 1 to float precision).
inline float rational_erf(float x) {
  const float c = std::min(4.f, std::max(-4.f, x)), c2 = c * c;
  float p = -2.72614225801306e-10f;
  p = p * c2 + 2.77068142495902e-08f;
  p = p * c2 - 2.10102402082508e-06f;
  p = p * c2 - 5.69250639462346e-05f;
  p = p * c2 - 7.34990630326855e-04f;
  p = p * c2 - 2.95459980854025e-03f;
  p = p * c2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * c2 - 2.13374055278905e-04f;
  q = q * c2 - 1.68282697438203e-03f;
  q = q * c2 - 7.37332916720468e-03f;
  q = q * c2 - 1.42647390514189e-02f;
  return c * p / q;
}

// The activations of attnlab.nn.ACTIVATIONS, in the order of fused.py.
void activate(float* x, int64_t n, int64_t kind) {
  constexpr float kSqrtHalf = 0.70710678118654752440f, kSqrt2OverPi = 0.79788456080286535588f;
  if (kind == 0) {  // gelu
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.f + rational_erf(x[i] * kSqrtHalf));
  } else if (kind == 1) {  // gelu_tanh
#pragma omp simd
    for (int64_t i = 0; i < n; ++i)
      x[i] = 0.5f * x[i] * (1.f + rational_tanh(kSqrt2OverPi * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
  } else {  // relu
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] > 0.f ? x[i] : 0.f;
  }
}

// Write this step's keys and values at slot `pos`, then attend from each head's query to slots
// 0..pos: out[b, h*D:(h+1)*D] = softmax(q k^T / sqrt(D)) v.
void attend(const float* qkv, float* k_cache, float* v_cache, float* out, int64_t B, int64_t H, int64_t L,
            int64_t D, int64_t pos) {
  const int64_t C = H * D;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t slot = ((b * H + h) * L + pos) * D;
      std::copy_n(qkv + b * 3 * C + C + h * D, D, k_cache + slot);
      std::copy_n(qkv + b * 3 * C + 2 * C + h * D, D, v_cache + slot);
    }
  const int64_t n = pos + 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, B * H, std::max<int64_t>(1, 16384 / (n * D)), [&](int64_t begin, int64_t end) {
    std::vector<float> p(n);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float* q = qkv + b * 3 * C + h * D;
      const float* K = k_cache + bh * L * D;
      const float* V = v_cache + bh * L * D;
      float top = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int64_t d = 0; d < D; ++d) s += q[d] * K[t * D + d];
        p[t] = s * scale;
        top = std::max(top, p[t]);
      }
      float sum = 0.f;
      for (int64_t t = 0; t < n; ++t) sum += (p[t] = std::exp(p[t] - top));
      float* o = out + b * C + h * D;
      std::fill_n(o, D, 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const float w = p[t] / sum;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += w * V[t * D + d];
      }
    }
  });
}

}  // namespace

// A model's decoding step bound to its weights and caches, made once per generation.
// params: kPerBlock tensors per block, then the final LayerNorm's weight and bias and the head's
// weight (an empty tensor for an absent bias). token_embedding (V, C); positions (P, C), the
// position vectors added to the embeddings (zeros for none). Caches (B, H, L, D), one per block.
class GPTStep {
 public:
  GPTStep(std::vector<at::Tensor> params, at::Tensor token_embedding, at::Tensor positions,
          std::vector<at::Tensor> k_caches, std::vector<at::Tensor> v_caches, int64_t n_head, double eps,
          int64_t activation)
      : params_(std::move(params)), tokens_(std::move(token_embedding)), positions_(std::move(positions)),
        k_(std::move(k_caches)), v_(std::move(v_caches)), H_(n_head), eps_(static_cast<float>(eps)), act_(activation) {
    const int64_t n_layer = static_cast<int64_t>(k_.size());
    TORCH_CHECK(n_layer > 0 && v_.size() == k_.size(), "one key and one value cache per block");
    TORCH_CHECK(static_cast<int64_t>(params_.size()) == n_layer * kPerBlock + 3, "wrong number of parameters");
    for (const auto* group : {&params_, &k_, &v_})
      for (const auto& t : *group)
        TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
                    "weights and caches must be contiguous fp32 CPU tensors");
    TORCH_CHECK(tokens_.dim() == 2 && tokens_.scalar_type() == at::kFloat && tokens_.is_contiguous(),
                "token_embedding must be (V, C) contiguous fp32");
    C_ = tokens_.size(1);
    TORCH_CHECK(positions_.dim() == 2 && positions_.size(1) == C_ && positions_.is_contiguous() &&
                    positions_.scalar_type() == at::kFloat,
                "positions must be (P, C) contiguous fp32");
    TORCH_CHECK(C_ % H_ == 0, "n_head must divide the width");
    B_ = k_[0].size(0), L_ = k_[0].size(2), D_ = C_ / H_;
    for (int64_t l = 0; l < n_layer; ++l)
      TORCH_CHECK(k_[l].dim() == 4 && k_[l].size(0) == B_ && k_[l].size(1) == H_ && k_[l].size(2) == L_ &&
                      k_[l].size(3) == D_ && v_[l].sizes() == k_[l].sizes(),
                  "caches must be (B, H, L, D)");
    F_ = params_[8].size(0);
    V_ = params_.back().size(0);
    const auto opts = tokens_.options();  // the step's working buffers, made once
    x_ = at::empty({B_, C_}, opts), h_ = at::empty({B_, C_}, opts), qkv_ = at::empty({B_, 3 * C_}, opts);
    a_ = at::empty({B_, C_}, opts), f_ = at::empty({B_, F_}, opts), y_ = at::empty({B_, C_}, opts);
  }

  // tokens (B,) int64: the newest token of each sequence, at position `pos` (its cache slot).
  // Returns the next-token logits (B, V).
  at::Tensor step(const at::Tensor& tokens, int64_t pos) {
    TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == B_ && tokens.scalar_type() == at::kLong, "tokens must be (B,) int64");
    TORCH_CHECK(pos >= 0 && pos < L_ && pos < positions_.size(0), "position ", pos, " is outside the cache");
    const int64_t B = B_, C = C_;
    at::Tensor logits = at::empty({B, V_}, tokens_.options());
    float *xp = x_.data_ptr<float>(), *hp = h_.data_ptr<float>(), *yp = y_.data_ptr<float>(), *ap = a_.data_ptr<float>();
    float *qkv = qkv_.data_ptr<float>(), *f = f_.data_ptr<float>();
    const at::Tensor token_ids = tokens.contiguous();  // kept alive while `ids` points into it
    const int64_t* ids = token_ids.data_ptr<int64_t>();
    const float* pe = positions_.data_ptr<float>() + pos * C;
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(ids[b] >= 0 && ids[b] < tokens_.size(0), "token id ", ids[b], " is outside the vocabulary");
      const float* te = tokens_.data_ptr<float>() + ids[b] * C;
      for (int64_t i = 0; i < C; ++i) xp[b * C + i] = te[i] + pe[i];
    }
    const int64_t n_layer = static_cast<int64_t>(k_.size());
    for (int64_t l = 0; l < n_layer; ++l) {
      const at::Tensor* p = params_.data() + l * kPerBlock;
      layer_norm(xp, p[0].data_ptr<float>(), data_or_null(p[1]), hp, B, C, eps_);
      linear(p[2].data_ptr<float>(), data_or_null(p[3]), hp, qkv, B, 3 * C, C);
      attend(qkv, k_[l].data_ptr<float>(), v_[l].data_ptr<float>(), ap, B, H_, L_, D_, pos);
      linear(p[4].data_ptr<float>(), data_or_null(p[5]), ap, yp, B, C, C);
      for (int64_t i = 0; i < B * C; ++i) xp[i] += yp[i];
      layer_norm(xp, p[6].data_ptr<float>(), data_or_null(p[7]), hp, B, C, eps_);
      linear(p[8].data_ptr<float>(), data_or_null(p[9]), hp, f, B, F_, C);
      activate(f, B * F_, act_);
      linear(p[10].data_ptr<float>(), data_or_null(p[11]), f, yp, B, C, F_);
      for (int64_t i = 0; i < B * C; ++i) xp[i] += yp[i];
    }
    const at::Tensor* p = params_.data() + n_layer * kPerBlock;
    layer_norm(xp, p[0].data_ptr<float>(), data_or_null(p[1]), hp, B, C, eps_);
    linear(p[2].data_ptr<float>(), nullptr, hp, logits.data_ptr<float>(), B, V_, C);
    return logits;
  }

 private:
  std::vector<at::Tensor> params_;
  at::Tensor tokens_, positions_;
  std::vector<at::Tensor> k_, v_;
  at::Tensor x_, h_, qkv_, a_, f_, y_;  // working buffers of `step`
  int64_t H_;
  float eps_;
  int64_t act_;
  int64_t B_ = 0, C_ = 0, L_ = 0, D_ = 0, F_ = 0, V_ = 0;
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<GPTStep>(m, "GPTStep")
      .def(pybind11::init<std::vector<at::Tensor>, at::Tensor, at::Tensor, std::vector<at::Tensor>,
                          std::vector<at::Tensor>, int64_t, double, int64_t>())
      .def("step", &GPTStep::step, "One pre-norm GPT decoding step (CPU, fp32): tokens (B,), pos -> logits (B, V)");
}
