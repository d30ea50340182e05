#include "recipes/quantizer.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/status.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/host_readback.h"
#include "kernels/nvfp4.h"
#include "recipes/scaling.h"

namespace teserve {
namespace recipes {
namespace {

using kernels::Copy;

class DelayedScalingQuantizer : public Quantizer {
 public:
  DelayedScalingQuantizer(const DelayedScalingConfig& config, TensorRole role)
      : Quantizer(role, "delayed", FormatFor(config.fp8_format, role), ScalingMode::kPerTensor),
        state_(config, DTypeMaxFinite(format())) {}

  void DoEndRegion() override { state_.Update(); }

 protected:
  absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                             Tensor* dbias) override {
    kernels::PerTensorQuantizeOptions options;
    options.format = format();
    options.scale = state_.scale();
    options.defer_amax = DefersAmax();
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    options.dbias = dbias;
    return kernels::QuantizePerTensor(ctx, x, options);
  }
  // The scale comes from the history; this amax is only needed at the region's end
  // (health statistics read it at once).
  bool DefersAmax() const override { return !health_stats(); }
  bool FusesCast() const override { return true; }
  // The cast depends on x and the scale alone.
  bool ReuseKey(float* key) const override {
    *key = state_.scale();
    return true;
  }
  void RecordAmax(float amax) override { state_.RecordAmax(amax); }
  void FillSnapshot(QuantizerSnapshot* s) const override {
    s->scale = state_.scale();
    s->scale_inv = state_.scale_inv();
    s->amax_history = state_.history();
  }
  float OverflowLimit() const override { return DTypeMaxFinite(format()) * state_.scale_inv(); }
  void ExportExtra(QuantizerState* s) const override {
    s->scale = state_.scale();
    s->amax_history = state_.history();
  }
  absl::Status CheckExtra(const QuantizerState& s, absl::string_view field) const override {
    if (s.amax_history.size() != state_.history().size()) {
      return InvalidField(absl::StrCat(field, ".amax_history"),
                          absl::StrCat(state_.history().size(), " slots (recipe amax_history_len)"),
                          s.amax_history.size());
    }
    if (!(s.scale > 0.0f)) return InvalidField(absl::StrCat(field, ".scale"), "a scale > 0", s.scale);
    return absl::OkStatus();
  }
  void ImportExtra(const QuantizerState& s) override { state_.Restore(s.scale, s.amax_history); }
  bool KeepsScale() const override { return true; }

 private:
  ScalingState state_;
};

class CurrentScalingQuantizer : public Quantizer {
 public:
  CurrentScalingQuantizer(const CurrentScalingConfig& config, TensorRole role)
      : Quantizer(role, "current", FormatFor(config.fp8_format, role), ScalingMode::kPerTensor),
        config_(config) {}

 protected:
  // The scale comes from x's own amax inside the cast (on a device: an amax pass and the
  // scale computed there, so the host does not wait); the amax is left on the device like
  // delayed scaling's, and the host's copy of the scale follows from it when it is read.
  absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                             Tensor* dbias) override {
    kernels::PerTensorQuantizeOptions options;
    options.format = format();
    options.current = current_rule();
    options.defer_amax = DefersAmax();
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    options.dbias = dbias;
    return kernels::QuantizePerTensor(ctx, x, options);
  }
  bool DefersAmax() const override { return !health_stats(); }
  // The cast depends on x alone (its scale comes from x), so an unchanged tensor's cast is
  // the same cast.
  bool ReuseKey(float* key) const override {
    *key = 0.0f;
    return true;
  }
  // Every quantization's amax, in order: the latest sets the scale reported.
  void RecordAmax(float amax) override {
    last_scale_ = CurrentScale(amax, DTypeMaxFinite(format()), config_.amax_epsilon, config_.power_2_scale);
  }
  std::optional<kernels::CurrentScaleRule> current_rule() const override {
    return kernels::CurrentScaleRule{config_.amax_epsilon, config_.power_2_scale};
  }
  void FillSnapshot(QuantizerSnapshot* s) const override {
    s->scale = last_scale_;
    s->scale_inv = 1.0f / last_scale_;
  }
  void ExportExtra(QuantizerState* s) const override { s->scale = last_scale_; }
  absl::Status CheckExtra(const QuantizerState& s, absl::string_view field) const override {
    if (!(s.scale > 0.0f)) return InvalidField(absl::StrCat(field, ".scale"), "a scale > 0", s.scale);
    return absl::OkStatus();
  }
  void ImportExtra(const QuantizerState& s) override { last_scale_ = s.scale; }
  bool KeepsScale() const override { return true; }

 private:
  CurrentScalingConfig config_;
  float last_scale_ = 1.0f;
};

class Mxfp8Quantizer : public Quantizer {
 public:
  Mxfp8Quantizer(const Mxfp8Config& config, TensorRole role)
      : Quantizer(role, "mxfp8", FormatFor(config.fp8_format, role), ScalingMode::kMxfp8_1D) {}

 protected:
  absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                             Tensor* dbias) override {
    kernels::Mxfp8QuantizeOptions options;
    options.format = format();
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    options.defer_amax = DefersAmax();
    return kernels::QuantizeMxfp8(ctx, x, options);
  }
  // The block scales come from x itself; the amax is only reported (GetQuantizationState).
  bool DefersAmax() const override { return !health_stats(); }
  bool FusesCast() const override { return true; }
};

bool BlockTwoD(const BlockScalingConfig& config, TensorRole role) {
  switch (role) {
    case TensorRole::kInput: return config.x_block_scaling_dim == 2;
    case TensorRole::kWeight: return config.w_block_scaling_dim == 2;
    case TensorRole::kGradOutput: return config.grad_block_scaling_dim == 2;
  }
  return false;
}

class BlockScalingQuantizer : public Quantizer {
 public:
  BlockScalingQuantizer(const BlockScalingConfig& config, TensorRole role)
      : Quantizer(role, "block", FormatFor(config.fp8_format, role),
                  BlockTwoD(config, role) ? ScalingMode::kBlock2D : ScalingMode::kBlock1D),
        config_(config) {}

 protected:
  absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                             Tensor* dbias) override {
    kernels::BlockScalingQuantizeOptions options;
    options.format = format();
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    options.two_d = BlockTwoD(config_, role());
    options.power_2_scale = config_.power_2_scale;
    options.amax_epsilon = config_.amax_epsilon;
    options.defer_amax = DefersAmax();
    return kernels::QuantizeBlockScaling(ctx, x, options);
  }
  bool DefersAmax() const override { return !health_stats(); }  // as MXFP8's

 private:
  BlockScalingConfig config_;
};

class Nvfp4Quantizer : public Quantizer {
 public:
  Nvfp4Quantizer(const Nvfp4Config& config, TensorRole role)
      : Quantizer(role, "nvfp4", DType::kFloat4E2M1,
                  role == TensorRole::kWeight && config.two_d ? ScalingMode::kNvfp4_2D : ScalingMode::kNvfp4_1D),
        config_(config) {}

 protected:
  absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                             Tensor* dbias) override {
    kernels::Nvfp4QuantizeOptions options;
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    options.two_d = role() == TensorRole::kWeight && config_.two_d;
    // The transform goes on the wgrad operands: the columnwise copies of x and dy.
    options.random_hadamard = config_.random_hadamard && role() != TensorRole::kWeight;
    options.stochastic_rounding = config_.stochastic_rounding && role() == TensorRole::kGradOutput;
    // A fresh stream of draws for every quantization, reproducible from the seed.
    options.rng_stream = draws_++;
    return kernels::QuantizeNvfp4(ctx, x, options);
  }
  void ExportExtra(QuantizerState* s) const override { s->rng_draws = static_cast<int64_t>(draws_); }
  void ImportExtra(const QuantizerState& s) override { draws_ = static_cast<uint64_t>(s.rng_draws); }
  bool KeepsRngDraws() const override { return true; }

 private:
  Nvfp4Config config_;
  uint64_t draws_ = 0;
};

// `t` on the host (undefined stays undefined).
absl::StatusOr<Tensor> OnHost(const Context& ctx, const Tensor& t) {
  if (!t.defined()) return t;
  return kernels::CopyTo(ctx, t, Device::Cpu());
}

// An amax as a device leaves it (QuantizedTensor::amax_bits) read back: its FP32 bits,
// any NaN as the canonical quiet NaN (the CPU's); NaN when the bytes are not one word.
float DecodeAmaxBits(absl::Span<const uint8_t> bytes) {
  uint32_t b = 0x7FC00000u;
  if (bytes.size() == sizeof(b)) std::memcpy(&b, bytes.data(), sizeof(b));
  if (b > 0x7F800000u) b = 0x7FC00000u;
  float amax;
  std::memcpy(&amax, &b, sizeof(amax));
  return amax;
}

// The testing hook's stand-in for a device's amax_bits: an INT32 [1] CPU tensor.
absl::StatusOr<Tensor> HostAmaxBits(float amax) {
  ASSIGN_OR_RETURN(Tensor bits, Tensor::Zeros(DType::kInt32, {1}));
  std::memcpy(bits.raw_data(), &amax, sizeof(amax));
  return bits;
}

}  // namespace

// RegionEnd's read (quantizer.h), held by the quantizers it serves until they resolve.
struct SharedAmaxRead {
  kernels::HostReadback readback;
};

Quantizer::~Quantizer() = default;

absl::StatusOr<Tensor> Quantizer::Source(const Context& ctx, const Tensor& x) const {
  if (x.dtype() == DType::kFloat32) return x;
  if (mode_ == ScalingMode::kPerTensor && x.dtype() == DType::kBFloat16) return x;
  return kernels::ToFloat32(ctx, x);
}

absl::StatusOr<QuantizedTensor> Quantizer::Quantize(const Context& ctx, const Tensor& input, bool rowwise,
                                                    bool columnwise, Tensor* dbias) {
  ResolveEndedRegions();  // this quantization belongs to the next region: it needs their scale
  ASSIGN_OR_RETURN(const Tensor x, Source(ctx, input));
  QuantizedTensor q;
  if (dbias != nullptr && mode_ == ScalingMode::kPerTensor) {
    ASSIGN_OR_RETURN(q, DoQuantize(ctx, x, rowwise, columnwise, dbias));
  } else {
    ASSIGN_OR_RETURN(q, DoQuantize(ctx, x, rowwise, columnwise, nullptr));
    if (dbias != nullptr) RETURN_IF_ERROR(kernels::ColumnSum(ctx, x, /*accumulate=*/false, dbias));
  }
  RETURN_IF_ERROR(Record(ctx, x, &q));
  return q;
}

absl::StatusOr<QuantizedTensor> Quantizer::QuantizeImmutable(const Context& ctx, const Tensor& input, bool rowwise,
                                                             bool columnwise) {
  ResolveEndedRegions();  // the scale of the open region decides whether the cast can be reused
  float key = 0.0f;
  const bool reusable = !health_stats_ && ReuseKey(&key);
  if (reusable && reusable_.has_value() && reusable_->source.raw_data() == input.raw_data() &&
      reusable_->source.dtype() == input.dtype() && reusable_->source.shape() == input.shape() &&
      reusable_->source.device() == input.device() && reusable_->rowwise == rowwise &&
      reusable_->columnwise == columnwise && reusable_->key == key) {
    // The source is held by reusable_, so no other tensor can have taken its address.
    QuantizedTensor q = reusable_->q;
    ASSIGN_OR_RETURN(const Tensor x, Source(ctx, input));
    RETURN_IF_ERROR(Record(ctx, x, &q));
    return q;
  }
  reusable_.reset();
  ASSIGN_OR_RETURN(QuantizedTensor q, Quantize(ctx, input, rowwise, columnwise));
  if (reusable) reusable_ = Reusable{input, rowwise, columnwise, key, q};
  return q;
}

std::optional<FusedCast> Quantizer::PlanFusedCast() {
  ResolveEndedRegions();  // the next region's scale comes from their update
  if (health_stats_ || !FusesCast()) return std::nullopt;
  FusedCast cast;
  cast.mode = mode_;
  cast.format = format_;
  cast.defer_amax = DefersAmax();
  if (mode_ == ScalingMode::kPerTensor) cast.scale = ScaleInUse();
  return cast;
}

absl::Status Quantizer::RecordFusedCast(const Context& ctx, QuantizedTensor* q) {
  if (q->mode != mode_ || q->format != format_) {
    return absl::InternalError(absl::StrCat("RecordFusedCast: a ", ScalingModeName(q->mode), " ",
                                            DTypeName(q->format), " cast for a ", ScalingModeName(mode_), " ",
                                            DTypeName(format_), " quantizer"));
  }
  // No source: PlanFusedCast plans no fused cast while health statistics (which compare
  // against it) are on.
  return Record(ctx, Tensor(), q);
}

absl::Status Quantizer::Record(const Context& ctx, const Tensor& x, QuantizedTensor* q_ptr) {
  QuantizedTensor& q = *q_ptr;
  if (defer_host_amax_for_testing_ && DefersAmax() && !q.amax_bits.defined()) {
    ASSIGN_OR_RETURN(q.amax_bits, HostAmaxBits(q.amax));
    q.amax = 0.0f;
  }
  if (q.amax_bits.defined()) {
    pending_amax_.push_back(PendingAmax{ctx, q.amax_bits});
  } else {
    RecordAmax(q.amax);
    last_amax_ = q.amax;
  }
  ++calls_;
  // The block scales are summarized when a snapshot asks (quantizer.h); the health
  // statistics below read host copies (sampled or asked for explicitly).
  if (q.mode != ScalingMode::kPerTensor) {
    // SummarizeBlockScales reads the rowwise copy's scales, else the columnwise one's.
    unsummarized_scales_ = q;
    unsummarized_scales_.rowwise_data = Tensor();
    unsummarized_scales_.columnwise_data = Tensor();
    if (q.has_rowwise()) unsummarized_scales_.columnwise_scale_inv = Tensor();
    unsummarized_ctx_ = ctx;
  }
  if (health_stats_ && q.has_rowwise()) {
    ASSIGN_OR_RETURN(Tensor deq, DequantizeCopy(ctx, q, Copy::kRowwise));
    ASSIGN_OR_RETURN(Tensor x32, kernels::Convert(ctx, x, DType::kFloat32));
    ASSIGN_OR_RETURN(Tensor x_host, OnHost(ctx, x32));
    ASSIGN_OR_RETURN(Tensor deq_host, OnHost(ctx, deq));
    health_ = MeasureHealth(x_host, deq_host, OverflowLimit());
  }
  return absl::OkStatus();
}

absl::Status Quantizer::Observe(const Context& ctx, const Tensor& input) {
  ResolveEndedRegions();
  ASSIGN_OR_RETURN(const Tensor x, Source(ctx, input));
  ASSIGN_OR_RETURN(float amax, kernels::Amax(ctx, x));
  RecordAmax(amax);
  last_amax_ = amax;
  return absl::OkStatus();
}

void Quantizer::RecordDeviceAmax(const Context& ctx, const Tensor& bits) {
  float amax = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<Tensor> host = kernels::CopyTo(ctx, bits, Device::Cpu());  // waits for the stream
  if (host.ok()) {
    amax = DecodeAmaxBits(absl::Span<const uint8_t>(static_cast<const uint8_t*>(host->raw_data()),
                                                    static_cast<size_t>(host->nbytes())));
  }
  RecordAmax(amax);
  last_amax_ = amax;
}

void Quantizer::ResolvePendingAmax() {
  for (const PendingAmax& p : pending_amax_) RecordDeviceAmax(p.ctx, p.bits);
  pending_amax_.clear();
}

bool Quantizer::StartAmaxRead() {
  const Context& ctx = pending_amax_.front().ctx;
  std::vector<Tensor> bits;
  bits.reserve(pending_amax_.size());
  for (const PendingAmax& p : pending_amax_) {
    // One read is ordered on one stream: amaxes from several are read eagerly.
    if (p.ctx.device != ctx.device || p.ctx.stream != ctx.stream) return false;
    bits.push_back(p.bits);
  }
  if (readback_ == nullptr) readback_ = std::make_unique<kernels::HostReadback>();
  if (!readback_->Start(ctx, bits).ok()) return false;
  reading_amaxes_ = pending_amax_.size();
  pending_amax_.clear();
  return true;
}

void Quantizer::ResolveEndedRegions() {
  if (ended_regions_ == 0) return;
  if (reading_amaxes_ > 0) {
    kernels::HostReadback& readback = shared_read_ != nullptr ? shared_read_->readback : *readback_;
    const bool read = readback.Wait().ok();
    for (size_t i = 0; i < reading_amaxes_; ++i) {
      const float amax =
          read ? DecodeAmaxBits(readback.bytes(shared_begin_ + i)) : std::numeric_limits<float>::quiet_NaN();
      RecordAmax(amax);
      last_amax_ = amax;
    }
    reading_amaxes_ = 0;
  }
  shared_read_.reset();
  shared_begin_ = 0;
  for (; ended_regions_ > 0; --ended_regions_) DoEndRegion();
}

void Quantizer::EndRegion() {
  if (pending_amax_.empty()) {
    if (ended_regions_ == 0) {
      DoEndRegion();  // nothing to read: the update runs now, as on the CPU
    } else {
      ++ended_regions_;  // runs after the ended regions before it
    }
    return;
  }
  ResolveEndedRegions();  // a no-op: Quantize resolved them before this region's first amax
  if (lazy_region_end_ && StartAmaxRead()) {
    ended_regions_ = 1;
    return;
  }
  ResolvePendingAmax();
  DoEndRegion();
}

float Quantizer::ScaleInUse() {
  ResolveEndedRegions();
  QuantizerSnapshot s;
  FillSnapshot(&s);
  return s.scale;
}

QuantizerSnapshot Quantizer::Snapshot() {
  ResolveEndedRegions();
  ResolvePendingAmax();
  if (unsummarized_scales_.rowwise_scale_inv.defined() || unsummarized_scales_.columnwise_scale_inv.defined()) {
    QuantizedTensor scales = unsummarized_scales_;
    absl::StatusOr<Tensor> row = OnHost(unsummarized_ctx_, scales.rowwise_scale_inv);
    absl::StatusOr<Tensor> col = OnHost(unsummarized_ctx_, scales.columnwise_scale_inv);
    if (row.ok() && col.ok()) {  // else the previous summary stays
      scales.rowwise_scale_inv = *std::move(row);
      scales.columnwise_scale_inv = *std::move(col);
      block_scales_ = SummarizeBlockScales(scales);
    }
    unsummarized_scales_ = QuantizedTensor();
  }
  QuantizerSnapshot s;
  s.recipe = recipe_;
  s.format = format_;
  s.mode = mode_;
  s.amax = last_amax_;
  s.quantize_calls = calls_;
  s.block_scales = block_scales_;
  s.health = health_;
  FillSnapshot(&s);
  return s;
}

QuantizerState Quantizer::ExportState() {
  ResolveEndedRegions();
  ResolvePendingAmax();
  QuantizerState s;
  s.amax = last_amax_;
  s.quantize_calls = calls_;
  ExportExtra(&s);
  return s;
}

absl::Status Quantizer::CheckState(const QuantizerState& state, absl::string_view field) const {
  if (state.quantize_calls < 0) {
    return InvalidField(absl::StrCat(field, ".quantize_calls"), "a count >= 0", state.quantize_calls);
  }
  if (state.rng_draws < 0) return InvalidField(absl::StrCat(field, ".rng_draws"), "a count >= 0", state.rng_draws);
  const QuantizerState unkept;
  if (!KeepsScale() && !(state.scale == unkept.scale)) {
    return InvalidField(absl::StrCat(field, ".scale"),
                        absl::StrCat(unkept.scale, " (", recipe_, " quantizers keep no per-tensor scale)"), state.scale);
  }
  if (!KeepsRngDraws() && state.rng_draws != unkept.rng_draws) {
    return InvalidField(absl::StrCat(field, ".rng_draws"),
                        absl::StrCat(unkept.rng_draws, " (", recipe_, " quantizers draw no random numbers)"),
                        state.rng_draws);
  }
  return CheckExtra(state, field);
}

void Quantizer::ImportState(const QuantizerState& state) {
  // The imported state replaces everything the ended regions' updates and the open
  // region's amaxes would change, so they are dropped unread (a read still in flight is
  // waited for by the next Start or the destructor, before its staging is reused).
  ended_regions_ = 0;
  reading_amaxes_ = 0;
  shared_read_.reset();
  shared_begin_ = 0;
  pending_amax_.clear();
  last_amax_ = state.amax;
  calls_ = state.quantize_calls;
  ImportExtra(state);
}

RegionEnd::RegionEnd() = default;
RegionEnd::~RegionEnd() = default;

void RegionEnd::End(absl::Span<Quantizer* const> quantizers) {
  std::vector<Quantizer*> together;
  std::vector<Tensor> bits;
  std::optional<Context> stream;  // the first joining quantizer's device and stream
  for (Quantizer* q : quantizers) {
    bool joins = q->lazy_region_end_ && !q->pending_amax_.empty();
    if (joins) {
      const Context first = stream.value_or(q->pending_amax_[0].ctx);
      for (const Quantizer::PendingAmax& p : q->pending_amax_) {
        joins = joins && p.ctx.device == first.device && p.ctx.stream == first.stream;
      }
    }
    if (!joins) {
      q->EndRegion();
      continue;
    }
    q->ResolveEndedRegions();  // a no-op: Quantize resolved them before this region's first amax
    if (!stream.has_value()) stream = q->pending_amax_[0].ctx;
    together.push_back(q);
    for (const Quantizer::PendingAmax& p : q->pending_amax_) bits.push_back(p.bits);
  }
  if (together.empty()) return;
  // A read that a quantizer has not resolved yet is still held by it and keeps its
  // staging; any other read is free to reuse. A quantizer that sits regions out (or
  // never quantizes again) holds one, so a few are kept: a new read allocates page-locked
  // memory, and freeing it waits for the device.
  std::shared_ptr<SharedAmaxRead> read;
  for (const std::shared_ptr<SharedAmaxRead>& kept : reads_) {
    if (kept.use_count() == 1) {
      read = kept;
      break;
    }
  }
  if (read == nullptr) {
    read = std::make_shared<SharedAmaxRead>();
    if (reads_.size() < kKeptReads) reads_.push_back(read);
  }
  if (!read->readback.Start(*stream, bits).ok()) {
    for (Quantizer* q : together) q->EndRegion();  // each reads its own (or eagerly)
    return;
  }
  size_t begin = 0;
  for (Quantizer* q : together) {
    q->shared_read_ = read;
    q->shared_begin_ = begin;
    q->reading_amaxes_ = q->pending_amax_.size();
    begin += q->reading_amaxes_;
    q->pending_amax_.clear();
    q->ended_regions_ = 1;
  }
}

absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const Recipe& recipe, TensorRole role) {
  if (!recipe.has_quantizers()) return std::unique_ptr<Quantizer>();
  if (const auto* c = absl::get_if<DelayedScalingConfig>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new DelayedScalingQuantizer(*c, role));
  }
  if (const auto* c = absl::get_if<CurrentScalingConfig>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new CurrentScalingQuantizer(*c, role));
  }
  if (const auto* c = absl::get_if<Mxfp8Config>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new Mxfp8Quantizer(*c, role));
  }
  if (const auto* c = absl::get_if<BlockScalingConfig>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new BlockScalingQuantizer(*c, role));
  }
  if (const auto* c = absl::get_if<Nvfp4Config>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new Nvfp4Quantizer(*c, role));
  }
  return absl::InternalError("MakeQuantizer: recipe without a quantizer");
}

absl::StatusOr<Tensor> DequantizeCopy(const Context& ctx, const QuantizedTensor& q, Copy copy, DType out_dtype) {
  switch (q.mode) {
    case ScalingMode::kPerTensor:
      if (out_dtype != DType::kFloat32) {
        return InvalidField("out_dtype", "FLOAT32 for per-tensor scaling", DTypeName(out_dtype));
      }
      return kernels::Dequantize(ctx, q, copy);
    case ScalingMode::kMxfp8_1D:
    case ScalingMode::kBlock1D:
    case ScalingMode::kBlock2D:
      return kernels::DequantizeBlock(ctx, q, copy, out_dtype);
    case ScalingMode::kNvfp4_1D:
    case ScalingMode::kNvfp4_2D:
      return kernels::DequantizeNvfp4(ctx, q, copy, out_dtype);
  }
  return absl::InternalError("DequantizeCopy: unknown scaling mode");
}

}  // namespace recipes
}  // namespace teserve
