// The slow model of the integration tests that need a call to last (cancellation, the
// SIGTERM stop, the compute-thread queue): identical TransformerLayers "block0" ..
// "block<layers-1>" over [seq, batch, hidden] activations. Its depth sets a call's time:
// on the CPU a few layers take a good fraction of a second; on a GPU a call's time goes
// mostly to launching each layer's kernels, so there the model is narrow and hundreds of
// layers deep, and the tests deepen it until a call lasts long enough.
#ifndef TESERVE_TESTS_INTEGRATION_TRANSFORMER_STACK_H_
#define TESERVE_TESTS_INTEGRATION_TRANSFORMER_STACK_H_

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace testing {

struct StackWorkload {
  int64_t seq, batch, hidden, ffn_hidden, heads, layers;
  int64_t tokens() const { return seq * batch; }
};

// Appends the stack's layers to `model` and sets its seed; `dropout` goes to both of each
// layer's dropout sites (their random-stream counters are then part of the state).
inline void AddTransformerStack(const StackWorkload& w, uint64_t seed, float dropout, v1::ModelSpec* model) {
  model->set_seed(seed);
  for (int64_t i = 0; i < w.layers; ++i) {
    v1::LayerSpec* layer = model->add_layers();
    layer->set_name(absl::StrCat("block", i));
    v1::TransformerLayerSpec* t = layer->mutable_transformer_layer();
    t->set_hidden_size(w.hidden);
    t->set_ffn_hidden_size(w.ffn_hidden);
    t->set_num_attention_heads(w.heads);
    t->set_hidden_dropout(dropout);
    t->set_attention_dropout(dropout);
  }
}

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_INTEGRATION_TRANSFORMER_STACK_H_
