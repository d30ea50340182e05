from teserve.v1 import model_pb2 as _model_pb2
from teserve.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

AVAILABILITY_UNSPECIFIED: Availability
DESCRIPTOR: _descriptor.FileDescriptor
EMULATED: Availability
NATIVE: Availability
UNAVAILABLE: Availability

class AttentionPath(_message.Message):
    __slots__ = ["layer", "path", "reason"]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    layer: str
    path: str
    reason: str
    def __init__(self, layer: _Optional[str] = ..., path: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BackwardRequest(_message.Message):
    __slots__ = ["grad_outputs", "handle", "session_id"]
    GRAD_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    grad_outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    handle: int
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., handle: _Optional[int] = ..., grad_outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class BackwardResponse(_message.Message):
    __slots__ = ["grad_inputs", "side_grads"]
    GRAD_INPUTS_FIELD_NUMBER: _ClassVar[int]
    SIDE_GRADS_FIELD_NUMBER: _ClassVar[int]
    grad_inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    side_grads: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    def __init__(self, grad_inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., side_grads: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ...) -> None: ...

class BlockScaleSummary(_message.Message):
    __slots__ = ["max", "mean", "min"]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    MIN_FIELD_NUMBER: _ClassVar[int]
    max: float
    mean: float
    min: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ..., mean: _Optional[float] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ["bytes", "created", "error", "name", "step"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    created: str
    error: str
    name: str
    step: int
    def __init__(self, name: _Optional[str] = ..., step: _Optional[int] = ..., bytes: _Optional[int] = ..., created: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ["checkpoint_every_steps", "checkpoint_prefix", "from_checkpoint", "keep_last_checkpoints", "model", "optimizer", "recipe"]
    CHECKPOINT_EVERY_STEPS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PREFIX_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    checkpoint_every_steps: int
    checkpoint_prefix: str
    from_checkpoint: str
    keep_last_checkpoints: int
    model: _model_pb2.ModelSpec
    optimizer: _model_pb2.OptimizerSpec
    recipe: _model_pb2.RecipeSpec
    def __init__(self, model: _Optional[_Union[_model_pb2.ModelSpec, _Mapping]] = ..., recipe: _Optional[_Union[_model_pb2.RecipeSpec, _Mapping]] = ..., optimizer: _Optional[_Union[_model_pb2.OptimizerSpec, _Mapping]] = ..., from_checkpoint: _Optional[str] = ..., checkpoint_every_steps: _Optional[int] = ..., keep_last_checkpoints: _Optional[int] = ..., checkpoint_prefix: _Optional[str] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ["info", "session_id"]
    INFO_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    info: SessionInfo
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., info: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class CrossEntropyLoss(_message.Message):
    __slots__ = ["ignore_index", "label_smoothing"]
    IGNORE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LABEL_SMOOTHING_FIELD_NUMBER: _ClassVar[int]
    ignore_index: int
    label_smoothing: float
    def __init__(self, label_smoothing: _Optional[float] = ..., ignore_index: _Optional[int] = ...) -> None: ...

class DeleteSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class DeleteSessionResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ["inputs", "loss", "return_input_grad", "return_outputs", "session_id", "side_inputs", "target"]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    RETURN_INPUT_GRAD_FIELD_NUMBER: _ClassVar[int]
    RETURN_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SIDE_INPUTS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    loss: LossSpec
    return_input_grad: bool
    return_outputs: bool
    session_id: str
    side_inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    target: _tensor_pb2.Tensor
    def __init__(self, session_id: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., side_inputs: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ..., loss: _Optional[_Union[LossSpec, _Mapping]] = ..., target: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., return_input_grad: bool = ..., return_outputs: bool = ...) -> None: ...

class ForwardBackwardResponse(_message.Message):
    __slots__ = ["grad_inputs", "loss", "num_tokens", "outputs", "side_grads"]
    GRAD_INPUTS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SIDE_GRADS_FIELD_NUMBER: _ClassVar[int]
    grad_inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    loss: float
    num_tokens: int
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    side_grads: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    def __init__(self, loss: _Optional[float] = ..., num_tokens: _Optional[int] = ..., grad_inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., side_grads: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ["inputs", "no_grad", "session_id", "side_inputs"]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    NO_GRAD_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SIDE_INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    no_grad: bool
    session_id: str
    side_inputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    def __init__(self, session_id: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., no_grad: bool = ..., side_inputs: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ...) -> None: ...

class ForwardResponse(_message.Message):
    __slots__ = ["handle", "outputs"]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    handle: int
    outputs: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, outputs: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., handle: _Optional[int] = ...) -> None: ...

class Fp8HealthStats(_message.Message):
    __slots__ = ["dynamic_range", "mse", "overflow_ratio", "underflow_ratio"]
    DYNAMIC_RANGE_FIELD_NUMBER: _ClassVar[int]
    MSE_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_RATIO_FIELD_NUMBER: _ClassVar[int]
    UNDERFLOW_RATIO_FIELD_NUMBER: _ClassVar[int]
    dynamic_range: float
    mse: float
    overflow_ratio: float
    underflow_ratio: float
    def __init__(self, underflow_ratio: _Optional[float] = ..., overflow_ratio: _Optional[float] = ..., mse: _Optional[float] = ..., dynamic_range: _Optional[float] = ...) -> None: ...

class GetParametersRequest(_message.Message):
    __slots__ = ["include_grads", "names", "session_id"]
    INCLUDE_GRADS_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    include_grads: bool
    names: _containers.RepeatedScalarFieldContainer[str]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., include_grads: bool = ...) -> None: ...

class GetParametersResponse(_message.Message):
    __slots__ = ["grads", "parameters"]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    grads: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    parameters: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    def __init__(self, parameters: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ..., grads: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ...) -> None: ...

class GetQuantizationStateRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class LayerInfo(_message.Message):
    __slots__ = ["kind", "name", "parameters"]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    name: str
    parameters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., parameters: _Optional[_Iterable[str]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ["checkpoints"]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ["sessions"]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ["name", "session_id"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ["info"]
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: SessionInfo
    def __init__(self, info: _Optional[_Union[SessionInfo, _Mapping]] = ...) -> None: ...

class LossSpec(_message.Message):
    __slots__ = ["cross_entropy", "mse"]
    CROSS_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    MSE_FIELD_NUMBER: _ClassVar[int]
    cross_entropy: CrossEntropyLoss
    mse: MseLoss
    def __init__(self, mse: _Optional[_Union[MseLoss, _Mapping]] = ..., cross_entropy: _Optional[_Union[CrossEntropyLoss, _Mapping]] = ...) -> None: ...

class MseLoss(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class QuantizationState(_message.Message):
    __slots__ = ["session_id", "step", "tensors"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    tensors: _containers.RepeatedCompositeFieldContainer[QuantizedTensorState]
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[QuantizedTensorState, _Mapping]]] = ...) -> None: ...

class QuantizedTensorState(_message.Message):
    __slots__ = ["amax", "amax_history", "block_scale_inv", "execution", "format", "health", "layer", "quantize_calls", "recipe", "scale", "scale_inv", "scaling_mode", "tensor"]
    AMAX_FIELD_NUMBER: _ClassVar[int]
    AMAX_HISTORY_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SCALE_INV_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    QUANTIZE_CALLS_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    SCALE_INV_FIELD_NUMBER: _ClassVar[int]
    SCALING_MODE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    amax: float
    amax_history: _containers.RepeatedScalarFieldContainer[float]
    block_scale_inv: BlockScaleSummary
    execution: str
    format: _tensor_pb2.DType
    health: Fp8HealthStats
    layer: str
    quantize_calls: int
    recipe: str
    scale: float
    scale_inv: float
    scaling_mode: str
    tensor: str
    def __init__(self, layer: _Optional[str] = ..., tensor: _Optional[str] = ..., recipe: _Optional[str] = ..., format: _Optional[_Union[_tensor_pb2.DType, str]] = ..., scaling_mode: _Optional[str] = ..., execution: _Optional[str] = ..., amax: _Optional[float] = ..., scale: _Optional[float] = ..., scale_inv: _Optional[float] = ..., amax_history: _Optional[_Iterable[float]] = ..., quantize_calls: _Optional[int] = ..., block_scale_inv: _Optional[_Union[BlockScaleSummary, _Mapping]] = ..., health: _Optional[_Union[Fp8HealthStats, _Mapping]] = ...) -> None: ...

class RecipeAvailability(_message.Message):
    __slots__ = ["availability", "reason", "recipe"]
    AVAILABILITY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    availability: Availability
    reason: str
    recipe: str
    def __init__(self, recipe: _Optional[str] = ..., availability: _Optional[_Union[Availability, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ["name", "overwrite", "session_id"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    overwrite: bool
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., name: _Optional[str] = ..., overwrite: bool = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ["bytes", "name", "step"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    name: str
    step: int
    def __init__(self, name: _Optional[str] = ..., step: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ["admission_tokens", "checkpoints_enabled", "compute_capability", "cublaslt_version", "cuda_compiled", "cuda_runtime_version", "cudnn_version", "default_recipe", "device", "device_name", "gpu_count", "max_attention_scores", "max_live_handles", "max_message_bytes", "max_sessions", "max_sessions_per_tenant", "max_tokens_per_request", "memory_budget_bytes", "nccl_version", "recipes", "session_idle_timeout_seconds", "version"]
    ADMISSION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_ENABLED_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    CUBLASLT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_COMPILED_FIELD_NUMBER: _ClassVar[int]
    CUDA_RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDNN_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_RECIPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTENTION_SCORES_FIELD_NUMBER: _ClassVar[int]
    MAX_LIVE_HANDLES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_PER_TENANT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NCCL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECIPES_FIELD_NUMBER: _ClassVar[int]
    SESSION_IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    admission_tokens: int
    checkpoints_enabled: bool
    compute_capability: str
    cublaslt_version: str
    cuda_compiled: bool
    cuda_runtime_version: str
    cudnn_version: str
    default_recipe: str
    device: str
    device_name: str
    gpu_count: int
    max_attention_scores: int
    max_live_handles: int
    max_message_bytes: int
    max_sessions: int
    max_sessions_per_tenant: int
    max_tokens_per_request: int
    memory_budget_bytes: int
    nccl_version: str
    recipes: _containers.RepeatedCompositeFieldContainer[RecipeAvailability]
    session_idle_timeout_seconds: float
    version: str
    def __init__(self, version: _Optional[str] = ..., device: _Optional[str] = ..., device_name: _Optional[str] = ..., compute_capability: _Optional[str] = ..., cuda_runtime_version: _Optional[str] = ..., cublaslt_version: _Optional[str] = ..., cudnn_version: _Optional[str] = ..., nccl_version: _Optional[str] = ..., recipes: _Optional[_Iterable[_Union[RecipeAvailability, _Mapping]]] = ..., default_recipe: _Optional[str] = ..., max_sessions: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., cuda_compiled: bool = ..., gpu_count: _Optional[int] = ..., max_sessions_per_tenant: _Optional[int] = ..., max_tokens_per_request: _Optional[int] = ..., max_attention_scores: _Optional[int] = ..., max_live_handles: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., admission_tokens: _Optional[int] = ..., session_idle_timeout_seconds: _Optional[float] = ..., checkpoints_enabled: bool = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ["attention", "device", "device_note", "layers", "live_handles", "model", "num_parameters", "optimizer", "recipe", "recipe_name", "session_id", "state_bytes", "step"]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NOTE_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    LIVE_HANDLES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    RECIPE_FIELD_NUMBER: _ClassVar[int]
    RECIPE_NAME_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    attention: _containers.RepeatedCompositeFieldContainer[AttentionPath]
    device: str
    device_note: str
    layers: _containers.RepeatedCompositeFieldContainer[LayerInfo]
    live_handles: int
    model: _model_pb2.ModelSpec
    num_parameters: int
    optimizer: _model_pb2.OptimizerSpec
    recipe: _model_pb2.RecipeSpec
    recipe_name: str
    session_id: str
    state_bytes: int
    step: int
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[_Union[_model_pb2.ModelSpec, _Mapping]] = ..., recipe: _Optional[_Union[_model_pb2.RecipeSpec, _Mapping]] = ..., optimizer: _Optional[_Union[_model_pb2.OptimizerSpec, _Mapping]] = ..., step: _Optional[int] = ..., num_parameters: _Optional[int] = ..., device: _Optional[str] = ..., live_handles: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[LayerInfo, _Mapping]]] = ..., recipe_name: _Optional[str] = ..., device_note: _Optional[str] = ..., state_bytes: _Optional[int] = ..., attention: _Optional[_Iterable[_Union[AttentionPath, _Mapping]]] = ...) -> None: ...

class SetParametersRequest(_message.Message):
    __slots__ = ["parameters", "session_id"]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.NamedTensor]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[_tensor_pb2.NamedTensor, _Mapping]]] = ...) -> None: ...

class SetParametersResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ["session_id", "zero_grad"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ZERO_GRAD_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    zero_grad: bool
    def __init__(self, session_id: _Optional[str] = ..., zero_grad: bool = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ["checkpoint", "checkpoint_error", "grad_norm", "skipped", "step"]
    CHECKPOINT_ERROR_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    checkpoint_error: str
    grad_norm: float
    skipped: bool
    step: int
    def __init__(self, step: _Optional[int] = ..., grad_norm: _Optional[float] = ..., skipped: bool = ..., checkpoint: _Optional[str] = ..., checkpoint_error: _Optional[str] = ...) -> None: ...

class ZeroGradRequest(_message.Message):
    __slots__ = ["session_id"]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ZeroGradResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Availability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
