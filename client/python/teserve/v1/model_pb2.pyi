from teserve.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
E4M3: Fp8Format
E5M2: Fp8Format
FP8_FORMAT_UNSPECIFIED: Fp8Format
HYBRID: Fp8Format

class ActivationParams(_message.Message):
    __slots__ = ["alpha", "limit"]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    limit: float
    def __init__(self, limit: _Optional[float] = ..., alpha: _Optional[float] = ...) -> None: ...

class AdamW(_message.Message):
    __slots__ = ["beta1", "beta2", "eps", "lr", "weight_decay"]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    beta1: float
    beta2: float
    eps: float
    lr: float
    weight_decay: float
    def __init__(self, lr: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ...) -> None: ...

class AttentionWindowSize(_message.Message):
    __slots__ = ["left", "right"]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    RIGHT_FIELD_NUMBER: _ClassVar[int]
    left: int
    right: int
    def __init__(self, left: _Optional[int] = ..., right: _Optional[int] = ...) -> None: ...

class DelayedScaling(_message.Message):
    __slots__ = ["amax_compute_algo", "amax_history_len", "fp8_format", "margin", "reduce_amax"]
    AMAX_COMPUTE_ALGO_FIELD_NUMBER: _ClassVar[int]
    AMAX_HISTORY_LEN_FIELD_NUMBER: _ClassVar[int]
    FP8_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    REDUCE_AMAX_FIELD_NUMBER: _ClassVar[int]
    amax_compute_algo: str
    amax_history_len: int
    fp8_format: Fp8Format
    margin: float
    reduce_amax: bool
    def __init__(self, margin: _Optional[float] = ..., fp8_format: _Optional[_Union[Fp8Format, str]] = ..., amax_history_len: _Optional[int] = ..., amax_compute_algo: _Optional[str] = ..., reduce_amax: bool = ...) -> None: ...

class DotProductAttentionSpec(_message.Message):
    __slots__ = ["attention_dropout", "attn_mask_type", "checkpoint_core_attention", "core_attention_bias_type", "kv_channels", "kv_channels_v", "num_attention_heads", "num_gqa_groups", "qkv_format", "return_max_logit", "softmax_scale", "softmax_type", "window_size"]
    ATTENTION_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    ATTN_MASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CORE_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    CORE_ATTENTION_BIAS_TYPE_FIELD_NUMBER: _ClassVar[int]
    KV_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    KV_CHANNELS_V_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_GQA_GROUPS_FIELD_NUMBER: _ClassVar[int]
    QKV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    RETURN_MAX_LOGIT_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_SCALE_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_TYPE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
    attention_dropout: float
    attn_mask_type: str
    checkpoint_core_attention: bool
    core_attention_bias_type: str
    kv_channels: int
    kv_channels_v: int
    num_attention_heads: int
    num_gqa_groups: int
    qkv_format: str
    return_max_logit: bool
    softmax_scale: float
    softmax_type: str
    window_size: AttentionWindowSize
    def __init__(self, num_attention_heads: _Optional[int] = ..., kv_channels: _Optional[int] = ..., kv_channels_v: _Optional[int] = ..., num_gqa_groups: _Optional[int] = ..., attention_dropout: _Optional[float] = ..., qkv_format: _Optional[str] = ..., attn_mask_type: _Optional[str] = ..., window_size: _Optional[_Union[AttentionWindowSize, _Mapping]] = ..., softmax_scale: _Optional[float] = ..., softmax_type: _Optional[str] = ..., core_attention_bias_type: _Optional[str] = ..., return_max_logit: bool = ..., checkpoint_core_attention: bool = ...) -> None: ...

class Float8BlockScaling(_message.Message):
    __slots__ = ["amax_epsilon", "fp8_format", "grad_block_scaling_dim", "power_2_scale", "w_block_scaling_dim", "x_block_scaling_dim"]
    AMAX_EPSILON_FIELD_NUMBER: _ClassVar[int]
    FP8_FORMAT_FIELD_NUMBER: _ClassVar[int]
    GRAD_BLOCK_SCALING_DIM_FIELD_NUMBER: _ClassVar[int]
    POWER_2_SCALE_FIELD_NUMBER: _ClassVar[int]
    W_BLOCK_SCALING_DIM_FIELD_NUMBER: _ClassVar[int]
    X_BLOCK_SCALING_DIM_FIELD_NUMBER: _ClassVar[int]
    amax_epsilon: float
    fp8_format: Fp8Format
    grad_block_scaling_dim: int
    power_2_scale: bool
    w_block_scaling_dim: int
    x_block_scaling_dim: int
    def __init__(self, fp8_format: _Optional[_Union[Fp8Format, str]] = ..., x_block_scaling_dim: _Optional[int] = ..., w_block_scaling_dim: _Optional[int] = ..., grad_block_scaling_dim: _Optional[int] = ..., power_2_scale: bool = ..., amax_epsilon: _Optional[float] = ...) -> None: ...

class Float8CurrentScaling(_message.Message):
    __slots__ = ["amax_epsilon", "fp8_format", "power_2_scale"]
    AMAX_EPSILON_FIELD_NUMBER: _ClassVar[int]
    FP8_FORMAT_FIELD_NUMBER: _ClassVar[int]
    POWER_2_SCALE_FIELD_NUMBER: _ClassVar[int]
    amax_epsilon: float
    fp8_format: Fp8Format
    power_2_scale: bool
    def __init__(self, fp8_format: _Optional[_Union[Fp8Format, str]] = ..., power_2_scale: bool = ..., amax_epsilon: _Optional[float] = ...) -> None: ...

class GroupedLinearSpec(_message.Message):
    __slots__ = ["bias", "in_features", "init_std", "num_gemms", "out_features", "return_bias"]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    IN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NUM_GEMMS_FIELD_NUMBER: _ClassVar[int]
    OUT_FEATURES_FIELD_NUMBER: _ClassVar[int]
    RETURN_BIAS_FIELD_NUMBER: _ClassVar[int]
    bias: bool
    in_features: int
    init_std: float
    num_gemms: int
    out_features: int
    return_bias: bool
    def __init__(self, num_gemms: _Optional[int] = ..., in_features: _Optional[int] = ..., out_features: _Optional[int] = ..., bias: bool = ..., return_bias: bool = ..., init_std: _Optional[float] = ...) -> None: ...

class LayerNormLinearSpec(_message.Message):
    __slots__ = ["bias", "eps", "in_features", "init_std", "normalization", "out_features", "parameters_split", "return_bias", "return_layernorm_output", "zero_centered_gamma"]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    IN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    OUT_FEATURES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_SPLIT_FIELD_NUMBER: _ClassVar[int]
    RETURN_BIAS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LAYERNORM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ZERO_CENTERED_GAMMA_FIELD_NUMBER: _ClassVar[int]
    bias: bool
    eps: float
    in_features: int
    init_std: float
    normalization: str
    out_features: int
    parameters_split: _containers.RepeatedCompositeFieldContainer[ParameterSplit]
    return_bias: bool
    return_layernorm_output: bool
    zero_centered_gamma: bool
    def __init__(self, in_features: _Optional[int] = ..., out_features: _Optional[int] = ..., eps: _Optional[float] = ..., bias: bool = ..., normalization: _Optional[str] = ..., zero_centered_gamma: bool = ..., return_bias: bool = ..., return_layernorm_output: bool = ..., parameters_split: _Optional[_Iterable[_Union[ParameterSplit, _Mapping]]] = ..., init_std: _Optional[float] = ...) -> None: ...

class LayerNormMLPSpec(_message.Message):
    __slots__ = ["activation", "activation_params", "bias", "checkpoint", "eps", "ffn_hidden_size", "hidden_size", "init_std", "normalization", "return_bias", "return_layernorm_output", "zero_centered_gamma"]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_PARAMS_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    FFN_HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    RETURN_BIAS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LAYERNORM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ZERO_CENTERED_GAMMA_FIELD_NUMBER: _ClassVar[int]
    activation: str
    activation_params: ActivationParams
    bias: bool
    checkpoint: bool
    eps: float
    ffn_hidden_size: int
    hidden_size: int
    init_std: float
    normalization: str
    return_bias: bool
    return_layernorm_output: bool
    zero_centered_gamma: bool
    def __init__(self, hidden_size: _Optional[int] = ..., ffn_hidden_size: _Optional[int] = ..., eps: _Optional[float] = ..., bias: bool = ..., normalization: _Optional[str] = ..., activation: _Optional[str] = ..., activation_params: _Optional[_Union[ActivationParams, _Mapping]] = ..., return_layernorm_output: bool = ..., return_bias: bool = ..., zero_centered_gamma: bool = ..., checkpoint: bool = ..., init_std: _Optional[float] = ...) -> None: ...

class LayerNormSpec(_message.Message):
    __slots__ = ["eps", "hidden_size", "zero_centered_gamma"]
    EPS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    ZERO_CENTERED_GAMMA_FIELD_NUMBER: _ClassVar[int]
    eps: float
    hidden_size: int
    zero_centered_gamma: bool
    def __init__(self, hidden_size: _Optional[int] = ..., eps: _Optional[float] = ..., zero_centered_gamma: bool = ...) -> None: ...

class LayerSpec(_message.Message):
    __slots__ = ["dot_product_attention", "grouped_linear", "layer_norm", "layer_norm_linear", "layer_norm_mlp", "linear", "multihead_attention", "name", "params_dtype", "rms_norm", "transformer_layer"]
    DOT_PRODUCT_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    GROUPED_LINEAR_FIELD_NUMBER: _ClassVar[int]
    LAYER_NORM_FIELD_NUMBER: _ClassVar[int]
    LAYER_NORM_LINEAR_FIELD_NUMBER: _ClassVar[int]
    LAYER_NORM_MLP_FIELD_NUMBER: _ClassVar[int]
    LINEAR_FIELD_NUMBER: _ClassVar[int]
    MULTIHEAD_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_DTYPE_FIELD_NUMBER: _ClassVar[int]
    RMS_NORM_FIELD_NUMBER: _ClassVar[int]
    TRANSFORMER_LAYER_FIELD_NUMBER: _ClassVar[int]
    dot_product_attention: DotProductAttentionSpec
    grouped_linear: GroupedLinearSpec
    layer_norm: LayerNormSpec
    layer_norm_linear: LayerNormLinearSpec
    layer_norm_mlp: LayerNormMLPSpec
    linear: LinearSpec
    multihead_attention: MultiheadAttentionSpec
    name: str
    params_dtype: _tensor_pb2.DType
    rms_norm: RMSNormSpec
    transformer_layer: TransformerLayerSpec
    def __init__(self, name: _Optional[str] = ..., linear: _Optional[_Union[LinearSpec, _Mapping]] = ..., layer_norm: _Optional[_Union[LayerNormSpec, _Mapping]] = ..., rms_norm: _Optional[_Union[RMSNormSpec, _Mapping]] = ..., layer_norm_linear: _Optional[_Union[LayerNormLinearSpec, _Mapping]] = ..., layer_norm_mlp: _Optional[_Union[LayerNormMLPSpec, _Mapping]] = ..., grouped_linear: _Optional[_Union[GroupedLinearSpec, _Mapping]] = ..., dot_product_attention: _Optional[_Union[DotProductAttentionSpec, _Mapping]] = ..., multihead_attention: _Optional[_Union[MultiheadAttentionSpec, _Mapping]] = ..., transformer_layer: _Optional[_Union[TransformerLayerSpec, _Mapping]] = ..., params_dtype: _Optional[_Union[_tensor_pb2.DType, str]] = ...) -> None: ...

class LinearSpec(_message.Message):
    __slots__ = ["bias", "in_features", "init_std", "out_features", "return_bias"]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    IN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    OUT_FEATURES_FIELD_NUMBER: _ClassVar[int]
    RETURN_BIAS_FIELD_NUMBER: _ClassVar[int]
    bias: bool
    in_features: int
    init_std: float
    out_features: int
    return_bias: bool
    def __init__(self, in_features: _Optional[int] = ..., out_features: _Optional[int] = ..., bias: bool = ..., return_bias: bool = ..., init_std: _Optional[float] = ...) -> None: ...

class MXFP8BlockScaling(_message.Message):
    __slots__ = ["fp8_format"]
    FP8_FORMAT_FIELD_NUMBER: _ClassVar[int]
    fp8_format: Fp8Format
    def __init__(self, fp8_format: _Optional[_Union[Fp8Format, str]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ["layers", "seed"]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedCompositeFieldContainer[LayerSpec]
    seed: int
    def __init__(self, layers: _Optional[_Iterable[_Union[LayerSpec, _Mapping]]] = ..., seed: _Optional[int] = ...) -> None: ...

class MultiheadAttentionSpec(_message.Message):
    __slots__ = ["attention_dropout", "attention_type", "attn_mask_type", "bias", "checkpoint_core_attention", "fuse_qkv_params", "hidden_size", "init_std", "input_layernorm", "kv_channels", "layernorm_epsilon", "normalization", "num_attention_heads", "num_gqa_groups", "output_layer_init_std", "qk_norm_before_rope", "qk_norm_eps", "qk_norm_type", "qkv_format", "qkv_weight_interleaved", "return_bias", "return_layernorm_output", "rotary", "rotary_pos_interleaved", "softmax_type", "window_size", "zero_centered_gamma"]
    ATTENTION_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTN_MASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CORE_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    FUSE_QKV_PARAMS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    INPUT_LAYERNORM_FIELD_NUMBER: _ClassVar[int]
    KV_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    LAYERNORM_EPSILON_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_GQA_GROUPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LAYER_INIT_STD_FIELD_NUMBER: _ClassVar[int]
    QKV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    QKV_WEIGHT_INTERLEAVED_FIELD_NUMBER: _ClassVar[int]
    QK_NORM_BEFORE_ROPE_FIELD_NUMBER: _ClassVar[int]
    QK_NORM_EPS_FIELD_NUMBER: _ClassVar[int]
    QK_NORM_TYPE_FIELD_NUMBER: _ClassVar[int]
    RETURN_BIAS_FIELD_NUMBER: _ClassVar[int]
    RETURN_LAYERNORM_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ROTARY_FIELD_NUMBER: _ClassVar[int]
    ROTARY_POS_INTERLEAVED_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_TYPE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
    ZERO_CENTERED_GAMMA_FIELD_NUMBER: _ClassVar[int]
    attention_dropout: float
    attention_type: str
    attn_mask_type: str
    bias: bool
    checkpoint_core_attention: bool
    fuse_qkv_params: bool
    hidden_size: int
    init_std: float
    input_layernorm: bool
    kv_channels: int
    layernorm_epsilon: float
    normalization: str
    num_attention_heads: int
    num_gqa_groups: int
    output_layer_init_std: float
    qk_norm_before_rope: bool
    qk_norm_eps: float
    qk_norm_type: str
    qkv_format: str
    qkv_weight_interleaved: bool
    return_bias: bool
    return_layernorm_output: bool
    rotary: RotarySpec
    rotary_pos_interleaved: bool
    softmax_type: str
    window_size: AttentionWindowSize
    zero_centered_gamma: bool
    def __init__(self, hidden_size: _Optional[int] = ..., num_attention_heads: _Optional[int] = ..., kv_channels: _Optional[int] = ..., num_gqa_groups: _Optional[int] = ..., attention_dropout: _Optional[float] = ..., layernorm_epsilon: _Optional[float] = ..., attn_mask_type: _Optional[str] = ..., window_size: _Optional[_Union[AttentionWindowSize, _Mapping]] = ..., attention_type: _Optional[str] = ..., input_layernorm: bool = ..., normalization: _Optional[str] = ..., zero_centered_gamma: bool = ..., bias: bool = ..., return_bias: bool = ..., return_layernorm_output: bool = ..., fuse_qkv_params: bool = ..., qkv_weight_interleaved: bool = ..., qkv_format: _Optional[str] = ..., qk_norm_type: _Optional[str] = ..., qk_norm_eps: _Optional[float] = ..., qk_norm_before_rope: bool = ..., rotary: _Optional[_Union[RotarySpec, _Mapping]] = ..., rotary_pos_interleaved: bool = ..., softmax_type: _Optional[str] = ..., init_std: _Optional[float] = ..., output_layer_init_std: _Optional[float] = ..., checkpoint_core_attention: bool = ...) -> None: ...

class NVFP4BlockScaling(_message.Message):
    __slots__ = ["disable_2d_quantization", "disable_rht", "disable_stochastic_rounding", "fp8_format"]
    DISABLE_2D_QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    DISABLE_RHT_FIELD_NUMBER: _ClassVar[int]
    DISABLE_STOCHASTIC_ROUNDING_FIELD_NUMBER: _ClassVar[int]
    FP8_FORMAT_FIELD_NUMBER: _ClassVar[int]
    disable_2d_quantization: bool
    disable_rht: bool
    disable_stochastic_rounding: bool
    fp8_format: Fp8Format
    def __init__(self, disable_rht: bool = ..., disable_stochastic_rounding: bool = ..., disable_2d_quantization: bool = ..., fp8_format: _Optional[_Union[Fp8Format, str]] = ...) -> None: ...

class OptimizerSpec(_message.Message):
    __slots__ = ["adamw", "max_grad_norm", "sgd"]
    ADAMW_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    SGD_FIELD_NUMBER: _ClassVar[int]
    adamw: AdamW
    max_grad_norm: float
    sgd: SGD
    def __init__(self, sgd: _Optional[_Union[SGD, _Mapping]] = ..., adamw: _Optional[_Union[AdamW, _Mapping]] = ..., max_grad_norm: _Optional[float] = ...) -> None: ...

class ParameterSplit(_message.Message):
    __slots__ = ["name", "size"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class RMSNormSpec(_message.Message):
    __slots__ = ["eps", "hidden_size", "zero_centered_gamma"]
    EPS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    ZERO_CENTERED_GAMMA_FIELD_NUMBER: _ClassVar[int]
    eps: float
    hidden_size: int
    zero_centered_gamma: bool
    def __init__(self, hidden_size: _Optional[int] = ..., eps: _Optional[float] = ..., zero_centered_gamma: bool = ...) -> None: ...

class RecipeSpec(_message.Message):
    __slots__ = ["block", "calibrating", "current", "delayed", "enabled", "fp8_health_stats", "mxfp8", "nvfp4"]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    CALIBRATING_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    DELAYED_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    FP8_HEALTH_STATS_FIELD_NUMBER: _ClassVar[int]
    MXFP8_FIELD_NUMBER: _ClassVar[int]
    NVFP4_FIELD_NUMBER: _ClassVar[int]
    block: Float8BlockScaling
    calibrating: bool
    current: Float8CurrentScaling
    delayed: DelayedScaling
    enabled: bool
    fp8_health_stats: bool
    mxfp8: MXFP8BlockScaling
    nvfp4: NVFP4BlockScaling
    def __init__(self, enabled: bool = ..., calibrating: bool = ..., fp8_health_stats: bool = ..., delayed: _Optional[_Union[DelayedScaling, _Mapping]] = ..., current: _Optional[_Union[Float8CurrentScaling, _Mapping]] = ..., mxfp8: _Optional[_Union[MXFP8BlockScaling, _Mapping]] = ..., block: _Optional[_Union[Float8BlockScaling, _Mapping]] = ..., nvfp4: _Optional[_Union[NVFP4BlockScaling, _Mapping]] = ...) -> None: ...

class RotarySpec(_message.Message):
    __slots__ = ["pretrained_max_position_embeddings", "rotary_base", "rotary_percent", "seq_len_interpolation_factor"]
    PRETRAINED_MAX_POSITION_EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ROTARY_BASE_FIELD_NUMBER: _ClassVar[int]
    ROTARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    SEQ_LEN_INTERPOLATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    pretrained_max_position_embeddings: int
    rotary_base: float
    rotary_percent: float
    seq_len_interpolation_factor: float
    def __init__(self, rotary_percent: _Optional[float] = ..., rotary_base: _Optional[float] = ..., seq_len_interpolation_factor: _Optional[float] = ..., pretrained_max_position_embeddings: _Optional[int] = ...) -> None: ...

class SGD(_message.Message):
    __slots__ = ["dampening", "lr", "momentum", "nesterov", "weight_decay"]
    DAMPENING_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    NESTEROV_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    dampening: float
    lr: float
    momentum: float
    nesterov: bool
    weight_decay: float
    def __init__(self, lr: _Optional[float] = ..., momentum: _Optional[float] = ..., dampening: _Optional[float] = ..., nesterov: bool = ..., weight_decay: _Optional[float] = ...) -> None: ...

class TransformerLayerSpec(_message.Message):
    __slots__ = ["activation", "activation_params", "apply_residual_connection_post_layernorm", "attention_dropout", "attn_input_format", "bias", "checkpoint_core_attention", "drop_path_rate", "enc_dec_attn_mask_type", "enc_dec_window_size", "ffn_hidden_size", "fuse_qkv_params", "hidden_dropout", "hidden_size", "init_std", "kv_channels", "layer_type", "layernorm_epsilon", "normalization", "num_attention_heads", "num_gqa_groups", "output_layer_init_std", "output_layernorm", "parallel_attention_mlp", "qk_norm_before_rope", "qk_norm_eps", "qk_norm_type", "qkv_weight_interleaved", "rotary", "rotary_pos_interleaved", "self_attn_mask_type", "softmax_type", "window_size", "zero_centered_gamma"]
    ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_PARAMS_FIELD_NUMBER: _ClassVar[int]
    APPLY_RESIDUAL_CONNECTION_POST_LAYERNORM_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    ATTN_INPUT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_CORE_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    DROP_PATH_RATE_FIELD_NUMBER: _ClassVar[int]
    ENC_DEC_ATTN_MASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    ENC_DEC_WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
    FFN_HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    FUSE_QKV_PARAMS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_DROPOUT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    INIT_STD_FIELD_NUMBER: _ClassVar[int]
    KV_CHANNELS_FIELD_NUMBER: _ClassVar[int]
    LAYERNORM_EPSILON_FIELD_NUMBER: _ClassVar[int]
    LAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    NORMALIZATION_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_GQA_GROUPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LAYERNORM_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LAYER_INIT_STD_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_ATTENTION_MLP_FIELD_NUMBER: _ClassVar[int]
    QKV_WEIGHT_INTERLEAVED_FIELD_NUMBER: _ClassVar[int]
    QK_NORM_BEFORE_ROPE_FIELD_NUMBER: _ClassVar[int]
    QK_NORM_EPS_FIELD_NUMBER: _ClassVar[int]
    QK_NORM_TYPE_FIELD_NUMBER: _ClassVar[int]
    ROTARY_FIELD_NUMBER: _ClassVar[int]
    ROTARY_POS_INTERLEAVED_FIELD_NUMBER: _ClassVar[int]
    SELF_ATTN_MASK_TYPE_FIELD_NUMBER: _ClassVar[int]
    SOFTMAX_TYPE_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SIZE_FIELD_NUMBER: _ClassVar[int]
    ZERO_CENTERED_GAMMA_FIELD_NUMBER: _ClassVar[int]
    activation: str
    activation_params: ActivationParams
    apply_residual_connection_post_layernorm: bool
    attention_dropout: float
    attn_input_format: str
    bias: bool
    checkpoint_core_attention: bool
    drop_path_rate: float
    enc_dec_attn_mask_type: str
    enc_dec_window_size: AttentionWindowSize
    ffn_hidden_size: int
    fuse_qkv_params: bool
    hidden_dropout: float
    hidden_size: int
    init_std: float
    kv_channels: int
    layer_type: str
    layernorm_epsilon: float
    normalization: str
    num_attention_heads: int
    num_gqa_groups: int
    output_layer_init_std: float
    output_layernorm: bool
    parallel_attention_mlp: bool
    qk_norm_before_rope: bool
    qk_norm_eps: float
    qk_norm_type: str
    qkv_weight_interleaved: bool
    rotary: RotarySpec
    rotary_pos_interleaved: bool
    self_attn_mask_type: str
    softmax_type: str
    window_size: AttentionWindowSize
    zero_centered_gamma: bool
    def __init__(self, hidden_size: _Optional[int] = ..., ffn_hidden_size: _Optional[int] = ..., num_attention_heads: _Optional[int] = ..., num_gqa_groups: _Optional[int] = ..., layernorm_epsilon: _Optional[float] = ..., hidden_dropout: _Optional[float] = ..., attention_dropout: _Optional[float] = ..., init_std: _Optional[float] = ..., output_layer_init_std: _Optional[float] = ..., apply_residual_connection_post_layernorm: bool = ..., output_layernorm: bool = ..., parallel_attention_mlp: bool = ..., layer_type: _Optional[str] = ..., kv_channels: _Optional[int] = ..., self_attn_mask_type: _Optional[str] = ..., window_size: _Optional[_Union[AttentionWindowSize, _Mapping]] = ..., enc_dec_attn_mask_type: _Optional[str] = ..., enc_dec_window_size: _Optional[_Union[AttentionWindowSize, _Mapping]] = ..., zero_centered_gamma: bool = ..., normalization: _Optional[str] = ..., qkv_weight_interleaved: bool = ..., rotary_pos_interleaved: bool = ..., bias: bool = ..., activation: _Optional[str] = ..., activation_params: _Optional[_Union[ActivationParams, _Mapping]] = ..., attn_input_format: _Optional[str] = ..., softmax_type: _Optional[str] = ..., drop_path_rate: _Optional[float] = ..., fuse_qkv_params: bool = ..., qk_norm_type: _Optional[str] = ..., qk_norm_eps: _Optional[float] = ..., qk_norm_before_rope: bool = ..., rotary: _Optional[_Union[RotarySpec, _Mapping]] = ..., checkpoint_core_attention: bool = ...) -> None: ...

class Fp8Format(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
