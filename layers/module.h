// Module: the interface every layer implements (TE's torch modules, as a server holds
// them). A module owns its parameters and quantizers but not its activations: Forward
// returns what its Backward will need as a SavedActivations object, which the session
// keeps under an activation handle. So several forwards (microbatches) may be in
// flight before their backwards, and a module never mixes them up.
//
// Tensors are FP32 on the CPU backend. Inputs are [..., features]; all leading
// dimensions are folded into rows.
#ifndef TESERVE_LAYERS_MODULE_H_
#define TESERVE_LAYERS_MODULE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "recipes/quantizer.h"

namespace teserve {
namespace layers {

struct Parameter {
  std::string name;  // "<layer>.weight"
  Tensor value;      // FP32 master weights
  Tensor grad;       // FP32, same shape; Backward accumulates into it
};

// What one forward kept for its backward; each module defines its own.
class SavedActivations {
 public:
  virtual ~SavedActivations() = default;
};

struct ForwardOptions {
  bool save_for_backward = true;
};

struct ForwardOutput {
  std::vector<Tensor> outputs;
  std::unique_ptr<SavedActivations> saved;  // null without save_for_backward
};

struct NamedQuantizer {
  std::string layer;
  recipes::Quantizer* quantizer;
};

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }
  virtual std::string kind() const = 0;

  // Shapes of the outputs for inputs of `input_shapes`, or INVALID_ARGUMENT naming
  // `field` ("inputs[0].shape: expected last dimension 64, got 32"). Forward accepts
  // exactly the inputs this accepts, so callers validate before any state changes.
  virtual absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                          absl::string_view field) const = 0;

  virtual absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                const ForwardOptions& options) = 0;

  // Consumes `saved` (one backward per forward); accumulates parameter gradients and
  // returns the gradients of the forward's inputs. grad_outputs match the forward's
  // outputs in number and shape (callers validate).
  virtual absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                                       const std::vector<Tensor>& grad_outputs) = 0;

  virtual std::vector<Parameter*> Parameters() { return {}; }
  virtual std::vector<NamedQuantizer> Quantizers() { return {}; }

 private:
  std::string name_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_MODULE_H_
