#include "kernels/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/status.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::vector<int64_t> ReadInt32(const Tensor& t) {
  const int32_t* data = t.data<int32_t>();
  return std::vector<int64_t>(data, data + t.numel());
}

// Where the sequences of one call live in the tensors and how long they are.
struct Geometry {
  QkvFormat format = QkvFormat::kSbhd;
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t groups = 0;
  int64_t d_qk = 0;
  int64_t d_v = 0;
  int64_t full_q = 0;   // S_q (sbhd/bshd)
  int64_t full_kv = 0;  // S_kv (sbhd/bshd)
  int64_t rows_q = 0;   // token rows of q: S_q * B or T_q
  int64_t rows_kv = 0;
  std::vector<int64_t> len_q, len_kv;  // per sequence
  std::vector<int64_t> off_q, off_kv;  // thd: first row of each sequence

  int64_t RowQ(int64_t b, int64_t i) const { return Row(b, i, full_q, off_q); }
  int64_t RowKv(int64_t b, int64_t j) const { return Row(b, j, full_kv, off_kv); }

 private:
  int64_t Row(int64_t b, int64_t pos, int64_t full, const std::vector<int64_t>& off) const {
    switch (format) {
      case QkvFormat::kSbhd: return pos * batch + b;
      case QkvFormat::kBshd: return b * full + pos;
      case QkvFormat::kThd: return off[b] + pos;
    }
    return 0;
  }
};

// Sequence lengths and offsets from cu_seqlens (with or without the padded offsets).
void ReadSequences(const Tensor& cu, const Tensor& cu_padded, std::vector<int64_t>* len,
                   std::vector<int64_t>* off) {
  const std::vector<int64_t> bounds = ReadInt32(cu);
  const std::vector<int64_t> starts = cu_padded.defined() ? ReadInt32(cu_padded) : bounds;
  len->clear();
  off->clear();
  for (size_t b = 0; b + 1 < bounds.size(); ++b) {
    len->push_back(bounds[b + 1] - bounds[b]);
    off->push_back(starts[b]);
  }
}

Geometry MakeGeometry(const AttentionConfig& config, const Tensor& q, const Tensor& k, const Tensor& v,
                      const AttentionSideTensors& side) {
  Geometry g;
  g.format = config.qkv_format;
  if (g.format == QkvFormat::kThd) {
    g.rows_q = q.dim(0);
    g.rows_kv = k.dim(0);
    g.heads = q.dim(1);
    g.groups = k.dim(1);
    g.d_qk = q.dim(2);
    g.d_v = v.dim(2);
    ReadSequences(side.cu_seqlens_q, side.cu_seqlens_q_padded, &g.len_q, &g.off_q);
    ReadSequences(side.cu_seqlens_kv, side.cu_seqlens_kv_padded, &g.len_kv, &g.off_kv);
    g.batch = static_cast<int64_t>(g.len_q.size());
    return g;
  }
  const bool sbhd = g.format == QkvFormat::kSbhd;
  g.batch = q.dim(sbhd ? 1 : 0);
  g.full_q = q.dim(sbhd ? 0 : 1);
  g.full_kv = k.dim(sbhd ? 0 : 1);
  g.heads = q.dim(2);
  g.groups = k.dim(2);
  g.d_qk = q.dim(3);
  g.d_v = v.dim(3);
  g.rows_q = g.full_q * g.batch;
  g.rows_kv = g.full_kv * g.batch;
  if (HasPadding(config.mask_type)) {
    ReadSequences(side.cu_seqlens_q, Tensor(), &g.len_q, &g.off_q);
    ReadSequences(side.cu_seqlens_kv, Tensor(), &g.len_kv, &g.off_kv);
  } else {
    g.len_q.assign(g.batch, g.full_q);
    g.len_kv.assign(g.batch, g.full_kv);
  }
  return g;
}

// Offset of element [b, h, i, j] of a rank-4 tensor broadcast to [B, H, S_q, S_kv]
// (size-1 dimensions repeat).
int64_t BroadcastIndex(const Tensor& t, int64_t b, int64_t h, int64_t i, int64_t j) {
  const int64_t idx[4] = {b, h, i, j};
  int64_t offset = 0;
  for (int d = 0; d < 4; ++d) offset = offset * t.dim(d) + (t.dim(d) == 1 ? 0 : idx[d]);
  return offset;
}

// The scores of one query row (kernels/attention.h), masked entries -inf.
class RowScores {
 public:
  RowScores(const Geometry& g, const AttentionConfig& config, const Tensor& q, const Tensor& k,
            const AttentionSideTensors& side)
      : g_(g), config_(config), q_(q.data<float>()), k_(k.data<float>()), side_(side) {}

  int64_t Group(int64_t h) const { return h / (g_.heads / g_.groups); }

  // The sink logit of head h; -inf without a sink.
  double Sink(int64_t h) const {
    switch (config_.softmax_type) {
      case SoftmaxType::kVanilla: return kNegInf;
      case SoftmaxType::kOffByOne: return 0.0;
      case SoftmaxType::kLearnable: return side_.softmax_offset.data<float>()[h];
    }
    return kNegInf;
  }

  // Index into the bias tensor (pre/post_scale_bias) of score (b, h, i, j).
  int64_t BiasIndex(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return BroadcastIndex(side_.bias, b, h, i, j);
  }

  void Compute(int64_t b, int64_t h, int64_t i, std::vector<double>* scores) const {
    const int64_t len_kv = g_.len_kv[b];
    scores->assign(len_kv, kNegInf);
    const float* q_row = q_ + (g_.RowQ(b, i) * g_.heads + h) * g_.d_qk;
    const int64_t group = Group(h);
    const int64_t o = IsTopLeftAligned(config_.mask_type) ? 0 : len_kv - g_.len_q[b];
    const double scale = config_.softmax_scale;
    double slope = 0.0;
    if (config_.bias_type == AttnBiasType::kAlibi) {
      const Tensor& slopes = side_.alibi_slopes;
      slope = slopes.data<float>()[(slopes.rank() == 2 ? b * g_.heads : 0) + h];
    }
    const bool arbitrary = config_.mask_type == AttnMaskType::kArbitrary;
    const uint8_t* mask = arbitrary ? side_.mask.data<uint8_t>() : nullptr;
    const float* bias = side_.bias.defined() ? side_.bias.data<float>() : nullptr;
    for (int64_t j = 0; j < len_kv; ++j) {
      if (config_.window_left >= 0 && j < i + o - config_.window_left) continue;
      if (config_.window_right >= 0 && j > i + o + config_.window_right) continue;
      if (arbitrary && mask[BroadcastIndex(side_.mask, b, h, i, j)] != 0) continue;
      const float* k_row = k_ + (g_.RowKv(b, j) * g_.groups + group) * g_.d_qk;
      double qk = 0.0;
      for (int64_t d = 0; d < g_.d_qk; ++d) qk += static_cast<double>(q_row[d]) * k_row[d];
      double s = 0.0;
      switch (config_.bias_type) {
        case AttnBiasType::kNoBias: s = scale * qk; break;
        case AttnBiasType::kPreScaleBias: s = scale * (qk + bias[BiasIndex(b, h, i, j)]); break;
        case AttnBiasType::kPostScaleBias: s = scale * qk + bias[BiasIndex(b, h, i, j)]; break;
        case AttnBiasType::kAlibi: s = scale * qk - slope * std::fabs(static_cast<double>(i + o - j)); break;
      }
      (*scores)[j] = s;
    }
  }

 private:
  const Geometry& g_;
  const AttentionConfig& config_;
  const float* q_;
  const float* k_;
  const AttentionSideTensors& side_;
};

// The dropout multiplier keep / (1 - p) of one score (1 without dropout).
class Dropout {
 public:
  Dropout(const AttentionConfig& config, const Geometry& g)
      : active_(config.dropout > 0.0f),
        p_(config.dropout),
        inv_keep_(1.0 / (1.0 - static_cast<double>(config.dropout))),
        key_(RandomKey(config.dropout_seed, config.dropout_stream, kDropoutCopyId)),
        rows_q_(g.rows_q),
        rows_kv_(g.rows_kv) {}

  double Multiplier(int64_t h, int64_t row_q, int64_t row_kv) const {
    if (!active_) return 1.0;
    const uint64_t index = (static_cast<uint64_t>(h) * rows_q_ + row_q) * rows_kv_ + row_kv;
    return Uniform24ToFloat(RandomBits24(key_, index)) >= p_ ? inv_keep_ : 0.0;
  }

 private:
  bool active_;
  float p_;
  double inv_keep_;
  uint64_t key_;
  uint64_t rows_q_;
  uint64_t rows_kv_;
};

Shape WithLastDim(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

Shape WithoutLastDim(Shape shape) {
  shape.pop_back();
  return shape;
}

std::vector<float> ToFloats(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

absl::StatusOr<Tensor> FloatTensor(const std::vector<double>& values, Shape shape) {
  return Tensor::FromFloats(ToFloats(values), std::move(shape));
}

}  // namespace

absl::StatusOr<AttentionForwardOutputs> AttentionForward(const Context& ctx, const AttentionConfig& config,
                                                         const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const AttentionSideTensors& side) {
  const Geometry g = MakeGeometry(config, q, k, v, side);
  const RowScores rows(g, config, q, k, side);
  const Dropout dropout(config, g);

  AttentionForwardOutputs result;
  ASSIGN_OR_RETURN(result.out, Tensor::Zeros(DType::kFloat32, WithLastDim(q.shape(), g.d_v)));
  ASSIGN_OR_RETURN(result.softmax_lse, Tensor::Zeros(DType::kFloat32, WithoutLastDim(q.shape())));
  absl::Span<float> lse_out = result.softmax_lse.mutable_floats();
  std::fill(lse_out.begin(), lse_out.end(), -std::numeric_limits<float>::infinity());
  float* out = result.out.data<float>();
  const float* v_data = v.data<float>();
  std::vector<double> max_logit(g.heads, kNegInf);

  std::vector<double> scores;
  std::vector<double> acc(g.d_v);
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const double sink = rows.Sink(h);
      const int64_t group = rows.Group(h);
      for (int64_t i = 0; i < g.len_q[b]; ++i) {
        rows.Compute(b, h, i, &scores);
        double m = sink;
        for (double s : scores) {
          m = std::max(m, s);
          max_logit[h] = std::max(max_logit[h], s);
        }
        if (m == kNegInf) continue;  // nothing to attend to: lse -inf, output 0
        double sum = std::exp(sink - m);
        for (double s : scores) sum += std::exp(s - m);
        const double lse = m + std::log(sum);
        const int64_t row_q = g.RowQ(b, i);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < static_cast<int64_t>(scores.size()); ++j) {
          if (scores[j] == kNegInf) continue;
          const int64_t row_kv = g.RowKv(b, j);
          const double p = std::exp(scores[j] - lse) * dropout.Multiplier(h, row_q, row_kv);
          if (p == 0.0) continue;
          const float* v_row = v_data + (row_kv * g.groups + group) * g.d_v;
          for (int64_t d = 0; d < g.d_v; ++d) acc[d] += p * v_row[d];
        }
        float* out_row = out + (row_q * g.heads + h) * g.d_v;
        for (int64_t d = 0; d < g.d_v; ++d) out_row[d] = static_cast<float>(acc[d]);
        lse_out[row_q * g.heads + h] = static_cast<float>(lse);
      }
    }
  }
  if (config.return_max_logit) {
    ASSIGN_OR_RETURN(result.max_logit, FloatTensor(max_logit, {g.heads}));
  }
  return result;
}

absl::StatusOr<AttentionBackwardOutputs> AttentionBackward(const Context& ctx, const AttentionConfig& config,
                                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                                           const AttentionSideTensors& side, const Tensor& out,
                                                           const Tensor& softmax_lse, const Tensor& dout) {
  const Geometry g = MakeGeometry(config, q, k, v, side);
  const RowScores rows(g, config, q, k, side);
  const Dropout dropout(config, g);
  const bool has_bias =
      config.bias_type == AttnBiasType::kPreScaleBias || config.bias_type == AttnBiasType::kPostScaleBias;
  const double scale = config.softmax_scale;

  std::vector<double> dq(q.numel(), 0.0);
  std::vector<double> dk(k.numel(), 0.0);
  std::vector<double> dv(v.numel(), 0.0);
  std::vector<double> dsink(g.heads, 0.0);
  std::vector<double> dbias(has_bias ? side.bias.numel() : 0, 0.0);
  const float* q_data = q.data<float>();
  const float* k_data = k.data<float>();
  const float* v_data = v.data<float>();
  const float* out_data = out.data<float>();
  const float* dout_data = dout.data<float>();
  const float* lse_data = softmax_lse.data<float>();

  std::vector<double> scores;
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const double sink = rows.Sink(h);
      const int64_t group = rows.Group(h);
      for (int64_t i = 0; i < g.len_q[b]; ++i) {
        const int64_t row_q = g.RowQ(b, i);
        const double lse = lse_data[row_q * g.heads + h];
        if (lse == kNegInf) continue;  // a row that attended to nothing has no gradient
        rows.Compute(b, h, i, &scores);
        const float* q_row = q_data + (row_q * g.heads + h) * g.d_qk;
        const float* dout_row = dout_data + (row_q * g.heads + h) * g.d_v;
        const float* out_row = out_data + (row_q * g.heads + h) * g.d_v;
        double* dq_row = dq.data() + (row_q * g.heads + h) * g.d_qk;
        double delta = 0.0;
        for (int64_t d = 0; d < g.d_v; ++d) delta += static_cast<double>(dout_row[d]) * out_row[d];
        if (sink != kNegInf) dsink[h] -= std::exp(sink - lse) * delta;
        for (int64_t j = 0; j < static_cast<int64_t>(scores.size()); ++j) {
          if (scores[j] == kNegInf) continue;
          const int64_t row_kv = g.RowKv(b, j);
          const double p = std::exp(scores[j] - lse);
          const double keep = dropout.Multiplier(h, row_q, row_kv);
          const int64_t kv_offset = row_kv * g.groups + group;
          const float* v_row = v_data + kv_offset * g.d_v;
          const float* k_row = k_data + kv_offset * g.d_qk;
          double dp = 0.0;
          for (int64_t d = 0; d < g.d_v; ++d) dp += static_cast<double>(dout_row[d]) * v_row[d];
          const double ds = p * (dp * keep - delta);
          const double p_kept = p * keep;
          double* dv_row = dv.data() + kv_offset * g.d_v;
          for (int64_t d = 0; d < g.d_v; ++d) dv_row[d] += p_kept * dout_row[d];
          const double dqk = ds * scale;
          double* dk_row = dk.data() + kv_offset * g.d_qk;
          for (int64_t d = 0; d < g.d_qk; ++d) {
            dq_row[d] += dqk * k_row[d];
            dk_row[d] += dqk * q_row[d];
          }
          if (has_bias) {
            dbias[rows.BiasIndex(b, h, i, j)] += config.bias_type == AttnBiasType::kPreScaleBias ? dqk : ds;
          }
        }
      }
    }
  }

  AttentionBackwardOutputs result;
  ASSIGN_OR_RETURN(result.dq, FloatTensor(dq, q.shape()));
  ASSIGN_OR_RETURN(result.dk, FloatTensor(dk, k.shape()));
  ASSIGN_OR_RETURN(result.dv, FloatTensor(dv, v.shape()));
  if (config.softmax_type == SoftmaxType::kLearnable) {
    ASSIGN_OR_RETURN(result.dsoftmax_offset, FloatTensor(dsink, {g.heads}));
  }
  if (has_bias) {
    ASSIGN_OR_RETURN(result.dbias, FloatTensor(dbias, side.bias.shape()));
  }
  return result;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
