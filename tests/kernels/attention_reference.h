// A naive attention reference in double for the attention tests, written independently
// of kernels/cpu/attention_cpu.cc: each sequence gets an explicit padded score matrix,
// an explicit boolean mask built from TE's formulation (padding mask OR sliding-window
// mask with swa_left <= 0 <= swa_right, OR the arbitrary mask), an explicit softmax
// with the sink appended as an extra column and then dropped, dropout from the RNG
// contract of kernels/attention.h, and the weighted sum. Gradients come from central
// finite differences of this double forward.
#ifndef TESERVE_TESTS_KERNELS_ATTENTION_REFERENCE_H_
#define TESERVE_TESTS_KERNELS_ATTENTION_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace testing_kernels {

// One attention problem: the layout, the options and the sequence structure.
struct AttentionProblem {
  kernels::QkvFormat format = kernels::QkvFormat::kBshd;
  kernels::AttnMaskType mask = kernels::AttnMaskType::kNoMask;
  int64_t batch = 2, s_q = 5, s_kv = 5, heads = 2, groups = 2, d_qk = 4, d_v = 4;
  int64_t window_left = -1, window_right = -1;
  kernels::SoftmaxType softmax = kernels::SoftmaxType::kVanilla;
  kernels::AttnBiasType bias = kernels::AttnBiasType::kNoBias;
  Shape bias_shape;         // pre/post_scale_bias
  Shape mask_shape;         // arbitrary
  bool batch_slopes = false;  // alibi slopes [B, H] instead of [H]
  std::vector<int32_t> cu_q, cu_kv, cu_q_padded, cu_kv_padded;  // padding types, thd
  int64_t t_q = 0, t_kv = 0;  // thd token rows
  float dropout = 0.0f;
  uint64_t dropout_seed = 0, dropout_stream = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(d_qk)

  bool thd() const { return format == kernels::QkvFormat::kThd; }
  bool padded() const { return thd() || kernels::HasPadding(mask); }
  int64_t sequences() const { return thd() ? static_cast<int64_t>(cu_q.size()) - 1 : batch; }
  float softmax_scale() const { return scale > 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(double(d_qk))); }
  int64_t rows_q() const { return thd() ? t_q : s_q * batch; }
  int64_t rows_kv() const { return thd() ? t_kv : s_kv * batch; }
  Shape q_shape() const { return Layout(s_q, t_q, heads, d_qk); }
  Shape k_shape() const { return Layout(s_kv, t_kv, groups, d_qk); }
  Shape v_shape() const { return Layout(s_kv, t_kv, groups, d_v); }
  Shape out_shape() const { return Layout(s_q, t_q, heads, d_v); }

  // Valid lengths and the extent of the padded score matrix of sequence b.
  int64_t len_q(int64_t b) const { return padded() ? cu_q[b + 1] - cu_q[b] : s_q; }
  int64_t len_kv(int64_t b) const { return padded() ? cu_kv[b + 1] - cu_kv[b] : s_kv; }
  int64_t extent_q(int64_t b) const { return thd() ? len_q(b) : s_q; }
  int64_t extent_kv(int64_t b) const { return thd() ? len_kv(b) : s_kv; }

  // Token row of position i of sequence b (the layouts of kernels/attention.h).
  int64_t row_q(int64_t b, int64_t i) const { return Row(b, i, s_q, cu_q_padded.empty() ? cu_q : cu_q_padded); }
  int64_t row_kv(int64_t b, int64_t j) const {
    return Row(b, j, s_kv, cu_kv_padded.empty() ? cu_kv : cu_kv_padded);
  }

  kernels::AttentionConfig config() const {
    kernels::AttentionConfig c;
    c.qkv_format = format;
    c.mask_type = mask;
    c.window_left = window_left;
    c.window_right = window_right;
    c.softmax_scale = softmax_scale();
    c.softmax_type = softmax;
    c.bias_type = bias;
    c.dropout = dropout;
    c.dropout_seed = dropout_seed;
    c.dropout_stream = dropout_stream;
    c.return_max_logit = true;
    return c;
  }

 private:
  Shape Layout(int64_t s, int64_t t, int64_t h, int64_t d) const {
    switch (format) {
      case kernels::QkvFormat::kSbhd: return {s, batch, h, d};
      case kernels::QkvFormat::kBshd: return {batch, s, h, d};
      case kernels::QkvFormat::kThd: return {t, h, d};
    }
    return {};
  }
  int64_t Row(int64_t b, int64_t pos, int64_t s, const std::vector<int32_t>& starts) const {
    switch (format) {
      case kernels::QkvFormat::kSbhd: return pos * batch + b;
      case kernels::QkvFormat::kBshd: return b * s + pos;
      case kernels::QkvFormat::kThd: return starts[b] + pos;
    }
    return 0;
  }
};

// Inputs as doubles (perturbed by the finite differences).
struct AttentionInputs {
  std::vector<double> q, k, v, bias, slopes, offset;
  std::vector<uint8_t> mask;
};

struct AttentionResult {
  std::vector<double> out;        // out's layout
  std::vector<double> lse;        // q's layout without d; -inf for rows attending to nothing
  std::vector<double> max_logit;  // [H]
  std::vector<double> magnitude;  // per out element: sum_j |P'_ij v_jd| (forward-error scale)
};

inline int64_t Broadcast4(const Shape& shape, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t idx[4] = {b, h, i, j};
  int64_t offset = 0;
  for (int d = 0; d < 4; ++d) offset = offset * shape[d] + (shape[d] == 1 ? 0 : idx[d]);
  return offset;
}

inline AttentionResult ReferenceAttention(const AttentionProblem& p, const AttentionInputs& in) {
  using kernels::AttnBiasType;
  using kernels::AttnMaskType;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr int64_t kUnbounded = int64_t{1} << 40;
  AttentionResult r;
  int64_t out_count = p.rows_q() * p.heads * p.d_v;
  r.out.assign(out_count, 0.0);
  r.magnitude.assign(out_count, 0.0);
  r.lse.assign(p.rows_q() * p.heads, -kInf);
  r.max_logit.assign(p.heads, -kInf);
  const double scale = p.softmax_scale();
  const int64_t per_group = p.heads / p.groups;
  const bool bottom_right = !kernels::IsTopLeftAligned(p.mask);
  const uint64_t key = kernels::RandomKey(p.dropout_seed, p.dropout_stream, kernels::kDropoutCopyId);
  for (int64_t b = 0; b < p.sequences(); ++b) {
    const int64_t lq = p.len_q(b), lkv = p.len_kv(b), eq = p.extent_q(b), ekv = p.extent_kv(b);
    const int64_t diagonal = bottom_right ? lkv - lq : 0;
    const int64_t left = p.window_left == -1 ? kUnbounded : p.window_left;
    const int64_t right = p.window_right == -1 ? kUnbounded : p.window_right;
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t g = h / per_group;
      // Explicit [eq, ekv] mask and scores.
      std::vector<std::vector<bool>> masked(eq, std::vector<bool>(ekv, false));
      std::vector<std::vector<double>> s(eq, std::vector<double>(ekv, 0.0));
      for (int64_t i = 0; i < eq; ++i) {
        for (int64_t j = 0; j < ekv; ++j) {
          bool m = false;
          if (p.padded()) m = m || i >= lq || j >= lkv;
          const int64_t swa_left = (i - j) + diagonal - left;
          const int64_t swa_right = (i - j) + diagonal + right;
          m = m || !(swa_left <= 0 && swa_right >= 0);
          if (p.mask == AttnMaskType::kArbitrary) m = m || in.mask[Broadcast4(p.mask_shape, b, h, i, j)] != 0;
          masked[i][j] = m;
          if (m) continue;
          double qk = 0.0;
          for (int64_t d = 0; d < p.d_qk; ++d) {
            qk += in.q[(p.row_q(b, i) * p.heads + h) * p.d_qk + d] * in.k[(p.row_kv(b, j) * p.groups + g) * p.d_qk + d];
          }
          double bias = 0.0;
          if (p.bias == AttnBiasType::kPreScaleBias || p.bias == AttnBiasType::kPostScaleBias) {
            bias = in.bias[Broadcast4(p.bias_shape, b, h, i, j)];
          }
          if (p.bias == AttnBiasType::kAlibi) {
            const double slope = in.slopes[(p.batch_slopes ? b * p.heads : 0) + h];
            bias = -slope * std::fabs(static_cast<double>(i - j + diagonal));
          }
          s[i][j] = p.bias == AttnBiasType::kPreScaleBias ? (qk + bias) * scale : qk * scale + bias;
          r.max_logit[h] = std::max(r.max_logit[h], s[i][j]);
        }
      }
      // Softmax with the sink as an extra column.
      double sink = -kInf;
      if (p.softmax == kernels::SoftmaxType::kOffByOne) sink = 0.0;
      if (p.softmax == kernels::SoftmaxType::kLearnable) sink = in.offset[h];
      for (int64_t i = 0; i < lq; ++i) {
        std::vector<double> row;
        for (int64_t j = 0; j < ekv; ++j) row.push_back(masked[i][j] ? -kInf : s[i][j]);
        row.push_back(sink);
        const double m = *std::max_element(row.begin(), row.end());
        if (m == -kInf) continue;
        double total = 0.0;
        for (double x : row) total += std::exp(x - m);
        const int64_t rq = p.row_q(b, i);
        r.lse[rq * p.heads + h] = m + std::log(total);
        for (int64_t j = 0; j < ekv; ++j) {
          double prob = std::exp(row[j] - m) / total;
          if (p.dropout > 0.0f) {
            const uint64_t index = (static_cast<uint64_t>(h) * p.rows_q() + rq) * p.rows_kv() + p.row_kv(b, j);
            const bool keep = kernels::Uniform24ToFloat(kernels::RandomBits24(key, index)) >= p.dropout;
            prob = keep ? prob / (1.0 - p.dropout) : 0.0;
          }
          if (prob == 0.0) continue;
          for (int64_t d = 0; d < p.d_v; ++d) {
            const double term = prob * in.v[(p.row_kv(b, j) * p.groups + g) * p.d_v + d];
            r.out[(rq * p.heads + h) * p.d_v + d] += term;
            r.magnitude[(rq * p.heads + h) * p.d_v + d] += std::fabs(term);
          }
        }
      }
    }
  }
  return r;
}

// sum_k w_k * out_k: the scalar whose gradient the backward computes for dout = w.
inline double ReferenceLoss(const AttentionProblem& p, const AttentionInputs& in, const std::vector<double>& w) {
  const std::vector<double> out = ReferenceAttention(p, in).out;
  double total = 0.0;
  for (size_t i = 0; i < out.size(); ++i) total += out[i] * w[i];
  return total;
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_ATTENTION_REFERENCE_H_
