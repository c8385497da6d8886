// Elementwise functions written so that a `#pragma omp simd` loop calling them vectorizes (the
// C library's tanhf, erff and expf are one scalar call per element), and the activation loops
// built on them. Shared by the training kernels (attnlab/accel/kernels.cpp) and the fused decoding
// steps (attnlab/accel/fused_step.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

// Always inlined: a call left in the loop (GCC's inliner decides differently with other flags and
// callers) stops it vectorizing.
#define ATTNLAB_VECTOR_FN inline __attribute__((always_inline))

namespace attnlab {

constexpr float kSqrtHalf = 0.70710678118654752440f;     // 1/sqrt(2)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2/pi)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;   // 1/sqrt(2 pi)
constexpr float kGeluCubic = 0.044715f;                  // GPT-2's tanh approximation

// tanh as a rational function of x (the one Eigen uses for float; within 4e-7 of tanh on every
// input, against 6e-8 for float32's own).
ATTNLAB_VECTOR_FN float rational_tanh(float x) {
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
ATTNLAB_VECTOR_FN float rational_erf(float x) {
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

// exp(x) for x <= 88: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial to r^7
// (relative error below 2e-7 there), times 2^n built in the exponent bits. Inputs below -86
// give 0, not a denormal (e^-86 is 4e-38; arithmetic on denormals is far slower).
ATTNLAB_VECTOR_FN float vexp(float x) {
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float in = x;
  x = std::min(88.f, std::max(-86.f, x));
  // n = round(x log2 e): adding and taking away 1.5 * 2^23 rounds to an integer (std::floor
  // would stop the loop vectorizing).
  constexpr float kRound = 12582912.f;
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return in < -86.f ? 0.f : p * __builtin_bit_cast(float, bits);
}

// GELU, x * Phi(x), exact (through erf) or with GPT-2's tanh approximation, and its derivative.
ATTNLAB_VECTOR_FN float gelu(float x) { return 0.5f * x * (1.f + rational_erf(x * kSqrtHalf)); }

ATTNLAB_VECTOR_FN float gelu_tanh(float x) {
  return 0.5f * x * (1.f + rational_tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x)));
}

// GELU at x, and its derivative there in `grad`, sharing their costly parts (erf, exp): the
// derivative costs as much as the function, so a forward that keeps act'(h) rather than h makes
// the backward's activation step one multiply.
ATTNLAB_VECTOR_FN float gelu_and_grad(float x, float& grad) {
  const float phi = 0.5f * (1.f + rational_erf(x * kSqrtHalf));
  // Past |x| = 10 the density term is below 1e-21: dropped, so that it never makes denormals.
  const float e = vexp(-0.5f * x * x);
  grad = phi + x * (x * x > 100.f ? 0.f : kInvSqrt2Pi * e);
  return x * phi;
}

ATTNLAB_VECTOR_FN float gelu_tanh_and_grad(float x, float& grad) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  // 1 - tanh(u)^2 as 4 e / (1 + e)^2 with e = exp(-2|u|): where tanh is near +-1, 1 - t*t would
  // lose most of its digits (5e-6 off at x = 4.8, against PyTorch's 1.4e-6).
  // tanh itself from the same e: |tanh u| = (1 - e) / (1 + e), within ~1e-7 of it everywhere
  // (and of rational_tanh, which gelu_tanh takes), so the one exp serves both.
  const float e = vexp(-2.f * std::fabs(u)), r = 1.f / (1.f + e);
  const float half = 0.5f * (1.f + std::copysign((1.f - e) * r, u)), sech2 = 4.f * e * r * r;
  grad = half + 0.5f * x * sech2 * kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
  return x * half;
}

// The derivatives alone (the function's value is dead code to the compiler).
ATTNLAB_VECTOR_FN float gelu_grad(float x) {
  float grad;
  gelu_and_grad(x, grad);
  return grad;
}

ATTNLAB_VECTOR_FN float gelu_tanh_grad(float x) {
  float grad;
  gelu_tanh_and_grad(x, grad);
  return grad;
}

// The logistic function and SiLU (Swish with beta = 1), written as PyTorch's CPU kernels write
// them: x / (1 + e^-x) rather than x * sigmoid(x), one rounding fewer.
ATTNLAB_VECTOR_FN float sigmoid(float x) { return 1.f / (1.f + vexp(-x)); }

ATTNLAB_VECTOR_FN float silu(float x) { return x / (1.f + vexp(-x)); }

// The feed-forward activations, numbered as attnlab.accel.kernels.ACTIVATION_CODES (the training
// kernels' three) and attnlab.accel.fused.STEP_ACTIVATIONS (all of them: the fused decoding steps
// also compute SiLU, the logistic function and the identity, the gates of SwiGLU, GLU and LiGLU).
enum Activation : int64_t { kGelu = 0, kGeluTanh = 1, kRelu = 2, kSilu = 3, kSigmoid = 4, kIdentity = 5 };

// g = act(h) for n elements (g may be h).
inline void activate(const float* h, float* g, int64_t n, int64_t act) {
  switch (act) {
    case kGelu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) g[i] = gelu(h[i]);
      break;
    case kGeluTanh:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) g[i] = gelu_tanh(h[i]);
      break;
    case kSilu:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) g[i] = silu(h[i]);
      break;
    case kSigmoid:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) g[i] = sigmoid(h[i]);
      break;
    case kIdentity:
      if (g != h) std::copy_n(h, n, g);
      break;
    default:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) g[i] = h[i] > 0.f ? h[i] : 0.f;
  }
}

// dh = dg * act'(h) for n elements (dh may be dg).
inline void activate_backward(const float* h, const float* dg, float* dh, int64_t n, int64_t act) {
  if (act == kGelu) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dh[i] = dg[i] * gelu_grad(h[i]);
  } else if (act == kGeluTanh) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dh[i] = dg[i] * gelu_tanh_grad(h[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dh[i] = h[i] > 0.f ? dg[i] : 0.f;
  }
}

// g = act(h) and slope = act'(h) for n elements: what a training forward keeps for the backward,
// which then takes dh = dg * slope. slope may be h.
inline void activate_with_slope(const float* h, float* g, float* slope, int64_t n, int64_t act) {
  if (act == kGelu) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float d;
      g[i] = gelu_and_grad(h[i], d);
      slope[i] = d;
    }
  } else if (act == kGeluTanh) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      float d;
      g[i] = gelu_tanh_and_grad(h[i], d);
      slope[i] = d;
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float x = h[i];
      g[i] = x > 0.f ? x : 0.f;
      slope[i] = x > 0.f ? 1.f : 0.f;
    }
  }
}

}  // namespace attnlab
