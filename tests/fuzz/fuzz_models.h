// The small sessions request_fuzzer sends requests to, and one valid Forward for each:
// every layer kind, every side input, every recipe. request_fuzzer builds a fresh
// session of one of them per input; make_seeds builds the seed corpora from them.
#ifndef TESERVE_TESTS_FUZZ_FUZZ_MODELS_H_
#define TESERVE_TESTS_FUZZ_FUZZ_MODELS_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "teserve/v1/service.pb.h"

namespace teserve {
namespace fuzz {

inline constexpr int kNumModels = 12;

// Sequence length, batch and hidden size of the valid inputs.
inline constexpr int64_t kSeq = 4, kBatch = 2, kHidden = 16;

inline v1::Tensor FloatTensor(const std::vector<int64_t>& shape, float start = 0.25f) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  std::string data(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float v = start * static_cast<float>((i * 7) % 11 - 5);
    std::memcpy(&data[static_cast<size_t>(i) * 4], &v, 4);
  }
  t.set_data(std::move(data));
  return t;
}

inline v1::Tensor IntTensor(v1::DType dtype, const std::vector<int64_t>& values) {
  v1::Tensor t;
  t.set_dtype(dtype);
  t.add_shape(static_cast<int64_t>(values.size()));
  for (int64_t v : values) {
    if (dtype == v1::INT64) {
      t.mutable_data()->append(reinterpret_cast<const char*>(&v), 8);
    } else {
      const int32_t v32 = static_cast<int32_t>(v);
      t.mutable_data()->append(reinterpret_cast<const char*>(&v32), 4);
    }
  }
  return t;
}

// BOOL [B, 1, 1, S], true (masked) from `lengths[b]` on.
inline v1::Tensor PaddingMask(const std::vector<int64_t>& lengths, int64_t seq) {
  v1::Tensor t;
  t.set_dtype(v1::BOOL);
  for (int64_t d : {static_cast<int64_t>(lengths.size()), int64_t{1}, int64_t{1}, seq}) t.add_shape(d);
  for (int64_t len : lengths) {
    for (int64_t s = 0; s < seq; ++s) t.mutable_data()->push_back(s < len ? '\0' : '\1');
  }
  return t;
}

inline void AddSide(v1::ForwardRequest* request, const std::string& name, v1::Tensor tensor) {
  v1::NamedTensor* side = request->add_side_inputs();
  side->set_name(name);
  *side->mutable_tensor() = std::move(tensor);
}

// The session of model `i` (0 <= i < kNumModels): specs as a CreateSessionRequest.
inline v1::CreateSessionRequest ModelRequest(int i) {
  v1::CreateSessionRequest r;
  v1::ModelSpec* m = r.mutable_model();
  m->set_seed(static_cast<uint64_t>(i) + 1);
  r.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
  switch (i) {
    case 0: {  // Linear, no recipe, SGD with momentum and clipping
      auto* l = m->add_layers()->mutable_linear();
      l->set_in_features(kHidden);
      l->set_out_features(8);
      r.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
      r.mutable_optimizer()->mutable_sgd()->set_momentum(0.9f);
      r.mutable_optimizer()->set_max_grad_norm(1.0f);
      break;
    }
    case 1: {  // LayerNorm -> LayerNormMLP (swiglu) -> RMSNorm, delayed scaling
      m->add_layers()->mutable_layer_norm()->set_hidden_size(kHidden);
      auto* mlp = m->add_layers()->mutable_layer_norm_mlp();
      mlp->set_hidden_size(kHidden);
      mlp->set_ffn_hidden_size(32);
      mlp->set_activation("swiglu");
      m->add_layers()->mutable_rms_norm()->set_hidden_size(kHidden);
      r.mutable_recipe()->mutable_delayed()->set_amax_history_len(4);
      break;
    }
    case 2: {  // encoder TransformerLayer with a padding mask and dropout, current scaling
      auto* t = m->add_layers()->mutable_transformer_layer();
      t->set_hidden_size(kHidden);
      t->set_ffn_hidden_size(32);
      t->set_num_attention_heads(2);
      t->set_self_attn_mask_type("padding");
      t->set_hidden_dropout(0.1f);
      t->set_attention_dropout(0.1f);
      r.mutable_recipe()->mutable_current();
      break;
    }
    case 3: {  // decoder TransformerLayer (encoder_output, enc_dec_attention_mask), GQA, RMSNorm
      auto* t = m->add_layers()->mutable_transformer_layer();
      t->set_hidden_size(kHidden);
      t->set_ffn_hidden_size(32);
      t->set_num_attention_heads(4);
      t->set_num_gqa_groups(2);
      t->set_layer_type("decoder");
      t->set_enc_dec_attn_mask_type("padding");
      t->set_normalization("RMSNorm");
      t->set_hidden_dropout(0.0f);
      t->set_attention_dropout(0.0f);
      break;
    }
    case 4: {  // DotProductAttention on packed sequences (thd, cu_seqlens)
      auto* a = m->add_layers()->mutable_dot_product_attention();
      a->set_num_attention_heads(2);
      a->set_kv_channels(8);
      a->set_qkv_format("thd");
      a->set_attn_mask_type("padding_causal");
      break;
    }
    case 5: {  // DotProductAttention bshd with an arbitrary mask and a post-scale bias
      auto* a = m->add_layers()->mutable_dot_product_attention();
      a->set_num_attention_heads(2);
      a->set_kv_channels(8);
      a->set_qkv_format("bshd");
      a->set_attn_mask_type("arbitrary");
      a->set_core_attention_bias_type("post_scale_bias");
      break;
    }
    case 6: {  // DotProductAttention sbhd, causal, ALiBi, learnable softmax, sliding window
      auto* a = m->add_layers()->mutable_dot_product_attention();
      a->set_num_attention_heads(2);
      a->set_kv_channels(8);
      a->set_attn_mask_type("causal");
      a->set_core_attention_bias_type("alibi");
      a->set_softmax_type("learnable");
      a->mutable_window_size()->set_left(2);
      a->mutable_window_size()->set_right(0);
      break;
    }
    case 7: {  // MultiheadAttention with rotary embedding, qk norm, fused QKV
      auto* a = m->add_layers()->mutable_multihead_attention();
      a->set_hidden_size(kHidden);
      a->set_num_attention_heads(2);
      a->set_input_layernorm(true);
      a->set_fuse_qkv_params(true);
      a->set_qk_norm_type("RMSNorm");
      a->set_attention_dropout(0.0f);
      a->mutable_rotary()->set_rotary_percent(0.5);
      break;
    }
    case 8: {  // GroupedLinear (m_splits) with return_bias
      auto* g = m->add_layers()->mutable_grouped_linear();
      g->set_num_gemms(3);
      g->set_in_features(kHidden);
      g->set_out_features(8);
      g->set_return_bias(true);
      break;
    }
    case 9: {  // LayerNormLinear with parameters_split, MXFP8 (dims multiples of 32)
      auto* l = m->add_layers()->mutable_layer_norm_linear();
      l->set_in_features(32);
      l->set_out_features(64);
      l->add_parameters_split()->set_name("query");
      l->add_parameters_split()->set_name("key");
      l->set_return_layernorm_output(true);
      r.mutable_recipe()->mutable_mxfp8();
      break;
    }
    case 10: {  // Linear under NVFP4 (stochastic rounding, RHT, 2D weight blocks)
      auto* l = m->add_layers()->mutable_linear();
      l->set_in_features(32);
      l->set_out_features(32);
      r.mutable_recipe()->mutable_nvfp4();
      break;
    }
    default: {  // Linear under FP8 block scaling (partial 1x128 / 128x128 blocks)
      auto* l = m->add_layers()->mutable_linear();
      l->set_in_features(kHidden);
      l->set_out_features(24);
      r.mutable_recipe()->mutable_block();
      break;
    }
  }
  return r;
}

// A Forward that model `i` accepts (session_id left empty).
inline v1::ForwardRequest ValidForward(int i) {
  v1::ForwardRequest f;
  switch (i) {
    case 2:
      *f.add_inputs() = FloatTensor({kSeq, kBatch, kHidden});
      AddSide(&f, "attention_mask", PaddingMask({4, 2}, kSeq));
      break;
    case 3:
      *f.add_inputs() = FloatTensor({kSeq, kBatch, kHidden});
      AddSide(&f, "encoder_output", FloatTensor({6, kBatch, kHidden}, 0.5f));
      AddSide(&f, "cu_seqlens_q", IntTensor(v1::INT32, {0, 4, 7}));
      AddSide(&f, "cu_seqlens_kv", IntTensor(v1::INT32, {0, 6, 9}));
      break;
    case 4:
      for (int k = 0; k < 3; ++k) *f.add_inputs() = FloatTensor({7, 2, 8}, 0.1f * (k + 1));
      AddSide(&f, "cu_seqlens_q", IntTensor(v1::INT32, {0, 3, 7}));
      AddSide(&f, "cu_seqlens_kv", IntTensor(v1::INT32, {0, 3, 7}));
      break;
    case 5: {
      for (int k = 0; k < 3; ++k) *f.add_inputs() = FloatTensor({kBatch, kSeq, 2, 8}, 0.1f * (k + 1));
      v1::Tensor mask;
      mask.set_dtype(v1::BOOL);
      for (int64_t d : {kBatch, int64_t{1}, kSeq, kSeq}) mask.add_shape(d);
      for (int64_t k = 0; k < kBatch * kSeq * kSeq; ++k) mask.mutable_data()->push_back(k % 5 == 4 ? '\1' : '\0');
      AddSide(&f, "attention_mask", mask);
      AddSide(&f, "core_attention_bias", FloatTensor({1, 2, kSeq, kSeq}, 0.05f));
      break;
    }
    case 6:
      for (int k = 0; k < 3; ++k) *f.add_inputs() = FloatTensor({kSeq, kBatch, 2, 8}, 0.1f * (k + 1));
      break;
    case 8:
      *f.add_inputs() = FloatTensor({kSeq * kBatch, kHidden});
      AddSide(&f, "m_splits", IntTensor(v1::INT64, {3, 0, 5}));
      break;
    case 9:  // MXFP8: tokens a multiple of 32
      *f.add_inputs() = FloatTensor({8, 4, 32});
      break;
    case 10:  // NVFP4: tokens a multiple of 16
      *f.add_inputs() = FloatTensor({8, 2, 32});
      break;
    default:
      *f.add_inputs() = FloatTensor({kSeq, kBatch, kHidden});
      break;
  }
  return f;
}

}  // namespace fuzz
}  // namespace teserve

#endif  // TESERVE_TESTS_FUZZ_FUZZ_MODELS_H_
