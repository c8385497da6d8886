// WaveNet's fast generation (Paine et al. 2016) as one C++ call a sample: attnlab.accel.wavenet.
//
// The cached step in Python (attnlab.models.wavenet.WaveNet.step) is about a dozen PyTorch
// operators a layer, each a few microseconds of call overhead on tensors of a few dozen values:
// the arithmetic of a layer is ~7k multiply-adds, the overhead ten times that. Here the whole
// step is plain loops over the model's weights, packed once: per layer the dilated convolution
// as one product over its K taps laid side by side, the gated unit, then the residual and skip
// 1 x 1 convolutions as one product; then the head. Each layer keeps a ring of its last (K-1) d
// inputs (zeros before the first sample, as the causal convolution's left padding), written in
// place: no allocation in a step.
//
// Layouts: conv (L, 2D, K*R), its columns tap-major (tap 0, the oldest input, first), as
// weight.permute(0, 2, 1) of PyTorch's (2D, R, K); out (L, R+S, D): the residual rows, then the
// skip rows; bias_cond (B, L, 2D): the convolution's bias plus the layer's condition V h; rings
// (L entries of (B, (K-1) d_l, R)). Templated on the scalar type so that a test can compare the
// samples with the naive path in float64.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

// y[j] = (init ? init[j] : 0) + W[j, :] . x for the `out` rows of W (out, in), row-major.
template <typename T>
void matvec(const T* W, const T* x, const T* init, T* y, int64_t out, int64_t in) {
  for (int64_t j = 0; j < out; ++j) {
    const T* w = W + j * in;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < in; ++i) s += w[i] * x[i];
    y[j] = (init ? init[j] : T(0)) + s;
  }
}

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

class WaveNetStep {
 public:
  WaveNetStep(at::Tensor embedding, at::Tensor conv, at::Tensor bias_cond, at::Tensor out, at::Tensor out_bias,
              std::vector<at::Tensor> head, std::vector<at::Tensor> rings, std::vector<int64_t> dilations,
              int64_t kernel)
      : embedding_(embedding), conv_(conv), bias_cond_(bias_cond), out_(out), out_bias_(out_bias), head_(head),
        rings_(rings), dilations_(dilations), kernel_(kernel) {
    TORCH_CHECK(head_.size() == 4, "head: w1, b1, w2, b2");
    TORCH_CHECK(rings_.size() == dilations_.size() && conv_.size(0) == (int64_t)rings_.size(), "one ring a layer");
    for (const auto& t : {embedding_, conv_, bias_cond_, out_, out_bias_})
      TORCH_CHECK(t.is_contiguous() && t.scalar_type() == embedding_.scalar_type(), "contiguous, one dtype");
    const int64_t R = embedding_.size(1), D2 = conv_.size(1), S = out_.size(1) - R;
    scratch_ = at::empty({R + kernel_ * R + D2 + D2 / 2 + R + S + 2 * S}, embedding_.options());
  }

  // Feed tokens (B,) at time t (0, 1, ...); return the logits of the next samples (B, 256).
  at::Tensor step(const at::Tensor& tokens, int64_t t) {
    TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == bias_cond_.size(0), "tokens (B,)");
    auto contiguous = tokens.to(at::kLong).contiguous();
    at::Tensor logits = at::empty({tokens.size(0), head_[2].size(0)}, embedding_.options());
    AT_DISPATCH_FLOATING_TYPES(embedding_.scalar_type(), "wavenet_step", [&] {
      for (int64_t b = 0; b < tokens.size(0); ++b)
        row<scalar_t>(b, contiguous.data_ptr<int64_t>()[b], t, logits.data_ptr<scalar_t>() + b * logits.size(1));
    });
    return logits;
  }

 private:
  // One sequence's step: row b of the batch, its input class `token`, logits written to `logits`.
  template <typename T>
  void row(int64_t b, int64_t token, int64_t t, T* logits) {
    const int64_t L = conv_.size(0), R = embedding_.size(1), D2 = conv_.size(1), D = D2 / 2;
    const int64_t S = out_.size(1) - R, K = kernel_;
    // Scratch, carved from one buffer allocated with the step: nothing is allocated here.
    T* x = scratch_.data_ptr<T>();
    T *taps = x + R, *y = taps + K * R, *z = y + D2, *rs = z + D, *skips = rs + R + S, *hidden = skips + S;
    std::copy(embedding_.data_ptr<T>() + token * R, embedding_.data_ptr<T>() + (token + 1) * R, x);
    std::fill(skips, skips + S, T(0));
    for (int64_t l = 0; l < L; ++l) {
      const int64_t d = dilations_[l], reach = (K - 1) * d;
      T* ring = rings_[l].data_ptr<T>() + b * reach * R;
      for (int64_t k = 0; k + 1 < K; ++k) {  // inputs t - (K-1) d, ..., t - d, oldest first
        const int64_t slot = ((t - (K - 1 - k) * d) % reach + reach) % reach;
        std::copy(ring + slot * R, ring + (slot + 1) * R, taps + k * R);
      }
      std::copy(x, x + R, taps + (K - 1) * R);
      std::copy(x, x + R, ring + (t % reach) * R);
      matvec<T>(conv_.data_ptr<T>() + l * D2 * K * R, taps, bias_cond_.data_ptr<T>() + (b * L + l) * D2,
                y, D2, K * R);
      for (int64_t i = 0; i < D; ++i) z[i] = std::tanh(y[i]) * sigmoid(y[D + i]);  // Eq. 2
      matvec<T>(out_.data_ptr<T>() + l * (R + S) * D, z, out_bias_.data_ptr<T>() + l * (R + S), rs,
                R + S, D);
      for (int64_t i = 0; i < R; ++i) x[i] += rs[i];
      for (int64_t i = 0; i < S; ++i) skips[i] += rs[R + i];
    }
    for (int64_t i = 0; i < S; ++i) skips[i] = std::max(skips[i], T(0));
    matvec<T>(head_[0].data_ptr<T>(), skips, head_[1].data_ptr<T>(), hidden, S, S);
    for (int64_t i = 0; i < S; ++i) hidden[i] = std::max(hidden[i], T(0));
    matvec<T>(head_[2].data_ptr<T>(), hidden, head_[3].data_ptr<T>(), logits, head_[2].size(0), S);
  }

  at::Tensor embedding_, conv_, bias_cond_, out_, out_bias_, scratch_;
  std::vector<at::Tensor> head_, rings_;
  std::vector<int64_t> dilations_;
  int64_t kernel_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<WaveNetStep>(m, "WaveNetStep")
      .def(pybind11::init<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>,
                          std::vector<at::Tensor>, std::vector<int64_t>, int64_t>())
      .def("step", &WaveNetStep::step, pybind11::call_guard<pybind11::gil_scoped_release>(),
           "Feed tokens (B,) at time t; the logits of the next samples (B, 256)");
}
