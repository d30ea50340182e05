// Quantizer: turns a high-precision tensor into a QuantizedTensor under one recipe.
// Each GEMM operand of a layer owns one (TensorRole: input, weight, grad_output), and
// the quantizer owns what persists across steps for that operand (ScalingState for
// delayed scaling) and what GetQuantizationState shows of it.
//
// Quantize() is the same for every recipe: the recipe's DoQuantize, then bookkeeping
// (latest amax, call count, block-scale summary) and, when enabled, the FP8 health
// statistics measured against the source. Observe() is the calibration path: the amax
// is collected (and delayed scaling updates its history) but nothing is cast.
//
// Delayed scaling on a device never makes the host wait for the stream in the middle of a
// step. Each quantization leaves its amax on the device (QuantizedTensor::amax_bits, the
// quantize kernel's PerTensorQuantizeOptions::defer_amax), and the end of a region is
// lazy:
//   - EndRegion closes the region: it starts one asynchronous read of the region's
//     amaxes (kernels::HostReadback on the stream that quantized: copies into reused
//     page-locked memory, then an event) and returns at once. The region's update, i.e.
//     RecordAmax of each amax in quantization order and then DoEndRegion (the history
//     roll and the next scale), is left to do.
//   - Whatever reads or changes the quantizer's state first resolves the ended regions:
//     it waits for that event (the work enqueued before EndRegion, not the stream's later
//     work) and runs the updates exactly as an eager EndRegion would have. These are
//     Quantize and Observe (the next region's scale comes from the update), Snapshot,
//     ExportState and ScaleInUse. ImportState drops the updates (the imported state
//     replaces all they change); CheckState reads only the history length, which they
//     never change. So the host state goes through the eager sequence of values, only
//     later, and every result is bit for bit the eager one.
//   - Invariants: quantizations after EndRegion belong to the next region, and Quantize
//     resolves before it adds an amax, so the open region's amaxes (pending_amax_) and an
//     unresolved ended region never coexist, and at most one read is in flight. A
//     further EndRegion before the resolution is counted and runs its DoEndRegion after
//     the earlier ones (an empty region still updates the scale, as eagerly).
//   - An amax that cannot be read (a failed device) is recorded as NaN. A region whose
//     amaxes came from more than one stream, or whose read cannot start, is read at
//     EndRegion with a wait, as before.
// In a training step the next Quantize of a forward quantizer comes after the backward
// has been enqueued, so by then its region has usually finished on the GPU and the wait
// costs nothing. A session ends all of a region's quantizers together (RegionEnd below):
// one read for all of their amaxes, not one per quantizer.
// Current scaling runs the same way: the cast takes its scale from the tensor's amax on
// the device (kernels/cast.h, PerTensorQuantizeOptions::current) and leaves that amax
// there; the scale the host reports follows from it when the region's read resolves.
// On the CPU the amax is computed in place and EndRegion updates at once.
#ifndef TESERVE_RECIPES_QUANTIZER_H_
#define TESERVE_RECIPES_QUANTIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "kernels/cast.h"
#include "kernels/host_readback.h"
#include "recipes/health.h"
#include "recipes/recipe.h"

namespace teserve {
namespace recipes {

// What GetQuantizationState shows of one quantizer.
struct QuantizerSnapshot {
  std::string recipe;
  DType format = DType::kFloat8E4M3;
  ScalingMode mode = ScalingMode::kPerTensor;
  float amax = 0.0f;       // of the latest quantization (or observation)
  float scale = 1.0f;      // per-tensor recipes: used by the latest (current) / next (delayed)
  float scale_inv = 1.0f;
  std::vector<float> amax_history;  // delayed only
  int64_t quantize_calls = 0;
  BlockScaleSummary block_scales;   // block recipes: decoded scale_inv of the latest call
  HealthStats health;               // when health statistics are enabled
};

// What a checkpoint keeps of a quantizer: every value that later quantizations depend on
// (the delayed-scaling scale and amax history, NVFP4's count of random streams drawn)
// and the counters GetQuantizationState reports. The block-scale summary and the health
// statistics describe the latest quantization only and are not kept.
struct QuantizerState {
  float amax = 0.0f;                // of the latest quantization (or observation)
  int64_t quantize_calls = 0;
  float scale = 1.0f;               // delayed: the next scale; current: the latest
  std::vector<float> amax_history;  // delayed only (amax_history_len slots)
  int64_t rng_draws = 0;            // nvfp4: random streams used (stochastic rounding, RHT)
};

// A cast that the kernel producing a tensor makes as it writes it (a norm's or an
// activation's fused FP8 / MXFP8 output), in place of Quantize on the written tensor:
// the producer quantizes its FP32 values exactly as Quantize quantizes an FP32 x.
struct FusedCast {
  ScalingMode mode = ScalingMode::kPerTensor;  // kPerTensor or kMxfp8_1D
  DType format = DType::kFloat8E4M3;
  float scale = 1.0f;       // kPerTensor: the scale Quantize would use now
  bool defer_amax = false;  // leave the amax on the device (amax_bits), as Quantize would
};

struct SharedAmaxRead;  // RegionEnd's read, shared by the quantizers it serves
class RegionEnd;

class Quantizer {
 public:
  Quantizer(TensorRole role, std::string recipe, DType format, ScalingMode mode)
      : role_(role), recipe_(std::move(recipe)), format_(format), mode_(mode) {}
  virtual ~Quantizer();

  // x: FP32, BF16 or FP16 [rows, cols]. Produces the requested copies (rowwise
  // [rows, cols], columnwise [cols, rows]). Per-tensor recipes read FP32 and BF16
  // directly; everything else quantizes the FP32 value of x (a converted copy), so a
  // 16-bit x quantizes exactly as its FP32 value would.
  // dbias (optional, FP32 [cols] on x's device) is overwritten with the column sums of x
  // (the bias gradient when x is a Linear's dy): fused into the cast on per-tensor
  // recipes, a separate ColumnSum otherwise.
  absl::StatusOr<QuantizedTensor> Quantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                           Tensor* dbias = nullptr);
  // Quantize (no dbias) for an x whose contents never change while it is alive (a
  // parameter's 16-bit compute copy: its writers give the parameter a new buffer).
  // When x is the very tensor the previous such call quantized, the same copies are asked
  // and the recipe would cast it exactly as then (delayed scaling with an unchanged scale;
  // no health statistics), that quantization is returned again: the same codes, scale_inv
  // and amax, recorded and counted as a new quantization, without the kernel. So a weight
  // is cast once per parameter update and scale change, not once per forward. The
  // quantizer keeps that result (and a reference to x) until the next such call.
  absl::StatusOr<QuantizedTensor> QuantizeImmutable(const Context& ctx, const Tensor& x, bool rowwise,
                                                    bool columnwise);
  // The cast a producer may fuse in place of Quantize (see FusedCast): set when this
  // recipe's cast depends only on the values and on state known before they exist
  // (delayed scaling's scale, MXFP8) and no health statistics are kept (they compare the
  // codes against the source, which a fused producer need not write). It belongs to the
  // open region (ended regions are resolved first, as Quantize does). The producer's
  // result goes to RecordFusedCast before this quantizer quantizes again.
  std::optional<FusedCast> PlanFusedCast();
  // Records a cast made under PlanFusedCast's plan as Quantize records its own (amax,
  // call count, block scales).
  absl::Status RecordFusedCast(const Context& ctx, QuantizedTensor* q);
  // Calibration: records the amax of x (FP32, BF16 or FP16) without casting.
  absl::Status Observe(const Context& ctx, const Tensor& x);
  // End of the region this operand belongs to (forward or backward): the region's
  // amaxes are recorded, then delayed scaling rolls the history and computes the next
  // scale. With amaxes on a device this only starts their read and returns (see above);
  // the update runs when the state is next needed. An amax that cannot be read (a failed
  // device) is recorded as NaN, which the scale update and the health metrics then show.
  void EndRegion();
  // Both resolve the ended regions, then read any amax of the open region still on the
  // device (a wait for the stream: they report the latest amax).
  QuantizerSnapshot Snapshot();
  QuantizerState ExportState();
  // Whether ImportState may take `state` (what ExportState returned for a quantizer of
  // the same recipe and config): INVALID_ARGUMENT naming "<field>.<value>" when the amax
  // history length differs, a count or scale is out of range, or a value this recipe
  // does not keep (a scale without per-tensor scaling, random draws without NVFP4) is not
  // the one ExportState writes.
  absl::Status CheckState(const QuantizerState& state, absl::string_view field) const;
  // Puts back a state that CheckState accepted.
  void ImportState(const QuantizerState& state);
  // Snapshot().scale without reading the open region's amaxes (they change the next
  // scale, not this one): the scale the open region's quantizations use (delayed: from
  // the history; current: the latest whose amax was read, so a replay of a current cast
  // passes current_rule() instead; 1 for the block recipes). What a replay of the
  // latest quantization needs, with format() and mode().
  float ScaleInUse();
  // Current scaling's rule (the scale comes from each tensor's own amax); nullopt for the
  // other recipes. A replay of a current-scaling cast passes it instead of a scale.
  virtual std::optional<kernels::CurrentScaleRule> current_rule() const { return std::nullopt; }
  // Whether an ended region's update waits for its amaxes (delayed scaling on a device).
  bool region_pending() const { return ended_regions_ > 0; }

  void set_health_stats(bool enabled) { health_stats_ = enabled; }
  TensorRole role() const { return role_; }
  DType format() const { return format_; }
  ScalingMode mode() const { return mode_; }

  // Tests: quantizations on a CPU context that would leave their amax on a device hand it
  // over the same way (an amax_bits tensor, here on the host), so the lazy region end
  // above runs without a GPU. Every result stays the same.
  void set_defer_host_amax_for_testing(bool on) { defer_host_amax_for_testing_ = on; }
  // false: EndRegion reads the amaxes left on the device at once (a wait for the stream)
  // and updates, the eager region end the lazy one (the default) is tested against.
  void set_lazy_region_end(bool on) { lazy_region_end_ = on; }

 protected:
  // x is what Source returned; dbias is only passed to per-tensor recipes. A recipe may
  // leave the amax on the device (q.amax_bits, PerTensorQuantizeOptions::defer_amax)
  // when only EndRegion needs it, and then says so in DefersAmax.
  virtual absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise,
                                                     bool columnwise, Tensor* dbias) = 0;
  virtual bool DefersAmax() const { return false; }
  // Whether a producer can make this recipe's cast (PlanFusedCast).
  virtual bool FusesCast() const { return false; }
  // For QuantizeImmutable: true when a cast of the same tensor now equals any earlier
  // one that reported the same *key (the recipe's whole casting state, e.g. the scale).
  virtual bool ReuseKey(float* key) const { return false; }
  // Each amax recorded (quantized or observed), in order: delayed scaling keeps it in its
  // history, current scaling derives the scale it reports from it.
  virtual void RecordAmax(float amax) {}
  // The recipe's part of EndRegion (delayed scaling's history roll).
  virtual void DoEndRegion() {}
  // Whether health statistics are on (they read the amax at once).
  bool health_stats() const { return health_stats_; }
  // Per-tensor scale fields and history.
  virtual void FillSnapshot(QuantizerSnapshot* snapshot) const {}
  // |x| beyond this overflows the format at the scale in use (delayed scaling); 0 when
  // the recipe cannot overflow (its scale comes from the tensor itself).
  virtual float OverflowLimit() const { return 0.0f; }
  // The recipe's own part of QuantizerState (scale, history, draws).
  virtual void ExportExtra(QuantizerState* state) const {}
  virtual absl::Status CheckExtra(const QuantizerState& state, absl::string_view field) const {
    return absl::OkStatus();
  }
  virtual void ImportExtra(const QuantizerState& state) {}
  // Whether ExportExtra / ImportExtra carry QuantizerState::scale / ::rng_draws; where
  // they do not, CheckState accepts only the value ExportState writes (1 and 0), so a
  // checkpoint value the quantizer would drop is refused instead of ignored.
  virtual bool KeepsScale() const { return false; }
  virtual bool KeepsRngDraws() const { return false; }

 private:
  // x as this recipe's quantize kernels read it: itself (FP32; BF16 for per-tensor
  // recipes) or its FP32 value.
  absl::StatusOr<Tensor> Source(const Context& ctx, const Tensor& x) const;
  // Records an amax read back from the device (NaN when the read fails), waiting for
  // the stream.
  void RecordDeviceAmax(const Context& ctx, const Tensor& bits);
  // Everything a quantization records besides its cast: its amax (pending on a device),
  // the call count, the block scales to summarize and the health statistics of x.
  absl::Status Record(const Context& ctx, const Tensor& x, QuantizedTensor* q);
  // Records the open region's amaxes (eagerly, a wait for the stream each).
  void ResolvePendingAmax();
  // Starts reading the open region's amaxes (readback_) and moves them to the ended
  // region; false, with nothing moved, when they span streams or the read cannot start.
  bool StartAmaxRead();
  // Waits for the read of the ended region, if any, and runs the updates of every ended
  // region, in order.
  void ResolveEndedRegions();

  friend class RegionEnd;

  struct PendingAmax {
    Context ctx;  // the device and stream that quantized
    Tensor bits;  // QuantizedTensor::amax_bits
  };
  std::vector<PendingAmax> pending_amax_;  // the open region's
  // EndRegion calls whose update has not run yet; the first of them owns the read in
  // flight (reading_amaxes_ amaxes, in quantization order) when reading_amaxes_ > 0.
  int ended_regions_ = 0;
  size_t reading_amaxes_ = 0;
  std::unique_ptr<kernels::HostReadback> readback_;  // made on first use, then reused
  // When a RegionEnd read the ended region's amaxes: that read, and where this
  // quantizer's reading_amaxes_ amaxes start in it (readback_ is then not used).
  std::shared_ptr<SharedAmaxRead> shared_read_;
  size_t shared_begin_ = 0;
  bool defer_host_amax_for_testing_ = false;
  bool lazy_region_end_ = true;

  TensorRole role_;
  std::string recipe_;
  DType format_;
  ScalingMode mode_;
  bool health_stats_ = false;
  float last_amax_ = 0.0f;
  int64_t calls_ = 0;
  // The block scales of the latest quantization are summarized when a snapshot asks
  // (GetQuantizationState, metrics), not per quantization: on a device that is a copy to
  // the host and a pass over every scale (4M of them for a 16384 x 8192 MXFP8 tensor),
  // which would stall each call. Until then the scales tensor (one copy's) is kept here.
  BlockScaleSummary block_scales_;
  // Pending while it holds a scales tensor (its data tensors are dropped).
  QuantizedTensor unsummarized_scales_;
  Context unsummarized_ctx_;
  HealthStats health_;
  // QuantizeImmutable's latest: the source, what was asked and the result.
  struct Reusable {
    Tensor source;
    bool rowwise = false, columnwise = false;
    float key = 0.0f;
    QuantizedTensor q;
  };
  std::optional<Reusable> reusable_;
};

// Ends the regions of many quantizers together (a session's forward or backward region).
// The amaxes that lazy quantizers left on one device stream are read with one
// kernels::HostReadback for all of them (one gather, one copy, one event) instead of one
// read each; every quantizer then resolves its region from that read exactly as after its
// own EndRegion (the same updates in the same order, bit for bit). A quantizer with
// nothing on the device, with amaxes on another stream than the first one's, or with the
// lazy end off ends through its own EndRegion. Keep one RegionEnd per region kind: its
// reads' page-locked staging is reused once no quantizer reads from them any more. Not
// thread-safe (a session's quantizers, under its lock).
class RegionEnd {
 public:
  RegionEnd();
  ~RegionEnd();
  void End(absl::Span<Quantizer* const> quantizers);

 private:
  static constexpr size_t kKeptReads = 4;
  std::vector<std::shared_ptr<SharedAmaxRead>> reads_;  // reused while no quantizer holds one
};

// The quantizer for `role` under `recipe`; nullptr when the recipe has none (no recipe,
// or enabled = false).
absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const Recipe& recipe, TensorRole role);

// Dequantizes any recipe's copy to FP32 in that copy's layout. An NVFP4 columnwise copy
// made with the random Hadamard transform stays in the transformed basis (the wgrad
// GEMM contracts two such copies, so the transform cancels). The block and NVFP4 modes
// also write BF16 in the same pass (out_dtype; exactly Convert of the FP32 values), the
// operand of an emulated GEMM; per-tensor FP8 takes FLOAT32 only.
absl::StatusOr<Tensor> DequantizeCopy(const Context& ctx, const QuantizedTensor& q, kernels::Copy copy,
                                      DType out_dtype = DType::kFloat32);

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_QUANTIZER_H_
