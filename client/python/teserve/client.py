"""teserve.connect(), Client and Session: the Trainer RPCs with numpy in and out."""
from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    TypeVar, Union)

import grpc
import numpy as np

from teserve._errors import TeserveError, error_from_rpc
from teserve._tensors import from_wire, is_torch_tensor, to_wire
from teserve.layers import LayerLike, model_spec
from teserve.recipes import Loss, Optimizer, Recipe, loss_spec, optimizer_spec, recipe_spec
from teserve.v1 import model_pb2, service_pb2, service_pb2_grpc, tensor_pb2

__all__ = [
    "connect", "Client", "Session", "Future", "ForwardResult", "BackwardResult",
    "ForwardBackwardResult", "StepResult", "SIDE_INPUT_DTYPES",
]

T = TypeVar("T")
ArrayLike = Any  # numpy array, torch tensor, nested list

# TE's forward keyword arguments the layers read, and the wire dtype each travels as.
# Names not listed here are sent as they are (the server rejects unknown names).
SIDE_INPUT_DTYPES: Dict[str, Optional[str]] = {
    "attention_mask": "bool",
    "enc_dec_attention_mask": "bool",
    "encoder_output": None,           # float; float64 narrows to float32
    "cu_seqlens_q": "int32",
    "cu_seqlens_kv": "int32",
    "cu_seqlens_q_padded": "int32",
    "cu_seqlens_kv_padded": "int32",
    "core_attention_bias": None,
    "alibi_slopes": None,
    "m_splits": "int64",
}

_HEALTH_METHOD = "/grpc.health.v1.Health/Check"
_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _encode_health_request(service: str) -> bytes:
    # HealthCheckRequest{string service = 1}, encoded by hand (no grpcio-health-checking).
    data = service.encode("utf-8")
    if not data:
        return b""
    length, prefix = len(data), bytearray([0x0A])
    while True:
        byte = length & 0x7F
        length >>= 7
        prefix.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes(prefix) + data


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("health response: truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _decode_health_response(data: bytes) -> str:
    # HealthCheckResponse{ServingStatus status = 1}; skips fields a newer server may add.
    pos, status = 0, 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
            if number == 1:
                status = value
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            pos += length
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"health response: unexpected wire type {wire_type}")
    return _HEALTH_NAMES.get(status, f"UNKNOWN({status})")


# ----------------------------------------------------------------------------- results


@dataclass
class ForwardResult:
    """What Forward returned. ``outputs`` are float32 numpy arrays (torch tensors when the
    inputs were torch tensors); ``handle`` is 0 for ``no_grad`` forwards."""

    outputs: List[Any]
    handle: int
    session: Optional["Session"] = field(default=None, repr=False, compare=False)

    @property
    def output(self) -> Any:
        """The first output (most stacks have one)."""
        return self.outputs[0]

    def backward(self, *grad_outputs: ArrayLike) -> "BackwardResult":
        """``session.backward(self, *grad_outputs)``."""
        if self.session is None:
            raise ValueError("ForwardResult.backward: this result belongs to no session")
        return self.session.backward(self, *grad_outputs)


@dataclass
class BackwardResult:
    """Input gradients (one per forward input) and gradients of float side inputs by name."""

    grad_inputs: List[Any]
    side_grads: Dict[str, Any]

    @property
    def grad_input(self) -> Any:
        """The gradient of the first input."""
        return self.grad_inputs[0]


@dataclass
class ForwardBackwardResult:
    """Loss (mean over ``num_tokens``) and, when asked for, input gradients and outputs."""

    loss: float
    num_tokens: int
    grad_inputs: List[Any]
    side_grads: Dict[str, Any]
    outputs: List[Any]

    @property
    def grad_input(self) -> Any:
        """The gradient of the first input (needs ``return_input_grad=True``)."""
        if not self.grad_inputs:
            raise ValueError("forward_backward was called without return_input_grad=True")
        return self.grad_inputs[0]

    @property
    def output(self) -> Any:
        """The first output (needs ``return_outputs=True``)."""
        if not self.outputs:
            raise ValueError("forward_backward was called without return_outputs=True")
        return self.outputs[0]


@dataclass
class StepResult:
    """The optimizer step: steps taken so far, global L2 gradient norm before clipping,
    and whether the step was skipped for non-finite gradients."""

    step: int
    grad_norm: float
    skipped: bool


class Future(concurrent.futures.Future):
    """A ``concurrent.futures.Future`` of one RPC: ``result()`` gives the converted value
    (as the blocking method would return) or raises the ``teserve`` exception.
    Works with ``concurrent.futures.wait`` / ``as_completed``; ``cancel()`` cancels the RPC."""

    def __init__(self) -> None:
        super().__init__()
        self._rpc: Optional[grpc.Future] = None

    def cancel(self) -> bool:
        """Cancels the RPC; the future then raises teserve.Cancelled (True when the RPC
        was still in flight)."""
        if self._rpc is not None:
            return bool(self._rpc.cancel())
        return super().cancel()


# ----------------------------------------------------------------------------- client


def _credentials(tls: Union[None, bool, str, bytes, grpc.ChannelCredentials]) -> Optional[grpc.ChannelCredentials]:
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, bytes):
        return grpc.ssl_channel_credentials(root_certificates=tls)
    if isinstance(tls, str):
        try:
            with open(tls, "rb") as f:
                return grpc.ssl_channel_credentials(root_certificates=f.read())
        except OSError as e:
            raise ValueError(f"tls: expected a readable PEM file of root certificates, got {tls!r} ({e})") from None
    raise TypeError(f"tls: expected None, a bool, a PEM path or bytes, or grpc.ChannelCredentials, "
                    f"got {type(tls).__name__}")


def connect(address: str, token: Optional[str] = None,
            tls: Union[None, bool, str, bytes, grpc.ChannelCredentials] = None, *,
            timeout: Optional[float] = 300.0, max_message_bytes: int = 1 << 30,
            options: Sequence[Tuple[str, Any]] = ()) -> "Client":
    """Connects to a teserve server (lazily: a server that is down shows up as
    ``teserve.Unavailable`` on the first call; ``Client.health()`` checks).

    Args:
        address: ``"host:port"``.
        token: sent as ``authorization: Bearer <token>`` metadata on every call, for an
            authenticating proxy in front of the server (teserve itself checks none).
        tls: None / False: plaintext; True: TLS with the system roots; a PEM path or
            bytes: TLS with those root certificates; or ``grpc.ChannelCredentials``.
        timeout: seconds per call (None: no deadline).
        max_message_bytes: largest message sent or received (the server's default too).
        options: extra gRPC channel options.
    """
    return Client(address, token=token, tls=tls, timeout=timeout,
                  max_message_bytes=max_message_bytes, options=options)


class Client:
    """A connection to one teserve server. Thread-safe; use as a context manager or call
    ``close()``. Sessions created through it delete themselves when closed."""

    def __init__(self, address: str, token: Optional[str] = None,
                 tls: Union[None, bool, str, bytes, grpc.ChannelCredentials] = None, *,
                 timeout: Optional[float] = 300.0, max_message_bytes: int = 1 << 30,
                 options: Sequence[Tuple[str, Any]] = ()) -> None:
        if not isinstance(address, str) or not address:
            raise ValueError(f"address: expected 'host:port', got {address!r}")
        self.address = address
        self.timeout = timeout
        channel_options = [("grpc.max_send_message_length", int(max_message_bytes)),
                           ("grpc.max_receive_message_length", int(max_message_bytes)),
                           *options]
        credentials = _credentials(tls)
        if credentials is None:
            self._channel = grpc.insecure_channel(address, options=channel_options)
        else:
            self._channel = grpc.secure_channel(address, credentials, options=channel_options)
        self._metadata: Tuple[Tuple[str, str], ...] = ()
        if token is not None:
            self._metadata = (("authorization", f"Bearer {token}"),)
        self._stub = service_pb2_grpc.TrainerStub(self._channel)
        self._health = self._channel.unary_unary(
            _HEALTH_METHOD, request_serializer=_encode_health_request,
            response_deserializer=_decode_health_response)

    # -- plumbing

    def _call(self, method: str, request: Any, timeout: Optional[float] = None) -> Any:
        rpc = getattr(self._stub, method)
        try:
            return rpc(request, timeout=timeout if timeout is not None else self.timeout,
                       metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, method) from None

    def _call_async(self, method: str, request: Any, convert: Callable[[Any], T],
                    timeout: Optional[float] = None) -> Future:
        rpc = getattr(self._stub, method)
        future = Future()
        call = rpc.future(request, timeout=timeout if timeout is not None else self.timeout,
                          metadata=self._metadata)
        future._rpc = call
        future.set_running_or_notify_cancel()

        def done(c: grpc.Future) -> None:
            if future.done():  # cancelled by the caller
                return
            try:
                value = convert(c.result())
            except grpc.RpcError as e:
                future.set_exception(error_from_rpc(e, method))
            except grpc.FutureCancelledError:
                future.set_exception(error_from_rpc(_Cancelled(), method))
            except Exception as e:  # a conversion error
                future.set_exception(e)
            else:
                future.set_result(value)

        call.add_done_callback(done)
        return future

    # -- server-wide calls

    def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        """grpc.health.v1 check: "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN"."""
        try:
            return self._health(service, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e, "Health.Check") from None

    def wait_until_serving(self, timeout: float = 30.0) -> None:
        """Blocks until the server reports SERVING; raises teserve.Unavailable after ``timeout``."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise error_from_rpc(_Unavailable(f"no connection to {self.address} within {timeout}s"),
                                 "connect") from None
        status = self.health()
        if status != "SERVING":
            raise error_from_rpc(_Unavailable(f"{self.address} reports {status}"), "Health.Check")

    def server_info(self) -> service_pb2.ServerInfo:
        """GetServerInfo: version, device, library versions, recipe availability, limits."""
        return self._call("GetServerInfo", service_pb2.GetServerInfoRequest())

    def list_sessions(self) -> List[service_pb2.SessionInfo]:
        """Every live session on the server (SessionInfo messages)."""
        return list(self._call("ListSessions", service_pb2.ListSessionsRequest()).sessions)

    def create_session(self, model: Union[Sequence[LayerLike], model_pb2.ModelSpec],
                       recipe: Optional[Union[Recipe, model_pb2.RecipeSpec]] = None,
                       optimizer: Optional[Union[Optimizer, model_pb2.OptimizerSpec]] = None, *,
                       seed: int = 0, max_grad_norm: float = 0.0, enabled: bool = True,
                       calibrating: bool = False, fp8_health_stats: bool = False) -> "Session":
        """Creates a session: a layer stack, a recipe and an optimizer.

        Args:
            model: layer specs in order (``[teserve.LayerNorm(32), teserve.Linear(32, 8)]``)
                or a ``teserve.v1.ModelSpec``.
            recipe: ``teserve.DelayedScaling()``, ... ; None: FP32 everywhere.
            optimizer: ``teserve.SGD(lr=...)`` or ``teserve.AdamW(...)``; None: SGD(lr=1e-3).
            seed: parameter initialization seed.
            max_grad_norm: clip the global L2 gradient norm (0: off).
            enabled, calibrating: TE's fp8_autocast arguments.
            fp8_health_stats: measure underflow / overflow / MSE at every quantization.
        Raises:
            teserve.InvalidArgument: a bad spec (the message names the field).
            teserve.ResourceExhausted: the server's --max_sessions is reached.
        """
        request = service_pb2.CreateSessionRequest(
            model=model_spec(model, seed),
            recipe=recipe_spec(recipe, enabled, calibrating, fp8_health_stats),
            optimizer=optimizer_spec(optimizer, max_grad_norm))
        response = self._call("CreateSession", request)
        return Session(self, response.session_id, info=response.info, owned=True)

    def session(self, session_id: str) -> "Session":
        """Attaches to an existing session (not deleted on close unless ``owned=True`` is set)."""
        info = self._call("GetSession", service_pb2.GetSessionRequest(session_id=session_id))
        return Session(self, session_id, info=info, owned=False)

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"teserve.Client({self.address!r})"


class _Cancelled(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    def details(self) -> str:
        return "the call was cancelled"


class _Unavailable(grpc.RpcError):
    def __init__(self, details: str) -> None:
        super().__init__(details)
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


# ----------------------------------------------------------------------------- session


class Session:
    """One training session on the server.

    Inputs are numpy arrays, torch tensors or nested lists (float64 narrows to float32;
    bfloat16 / float16 travel as they are); outputs and gradients are float32 numpy arrays,
    or torch tensors when the call's first input was a torch tensor. Side inputs are
    keyword arguments with TE's names (``attention_mask=``, ``encoder_output=``,
    ``cu_seqlens_q=``, ``m_splits=``, ...). Each blocking method has an ``*_async`` twin
    returning a ``teserve.Future``.

    As a context manager the session is deleted on exit (``owned`` sessions, those made
    by ``create_session``, also on ``close()``).
    """

    def __init__(self, client: Client, session_id: str, info: Optional[service_pb2.SessionInfo] = None,
                 owned: bool = True) -> None:
        self.client = client
        self.id = session_id
        self.owned = owned
        self._created_info = info
        self._deleted = False

    # -- helpers

    def _encode_inputs(self, inputs: Sequence[ArrayLike], what: str) -> List[tensor_pb2.Tensor]:
        if not inputs:
            raise ValueError(f"{what}: expected at least one input tensor, got none")
        return [to_wire(x, f"{what}[{i}]") for i, x in enumerate(inputs)]

    @staticmethod
    def _encode_side(side_inputs: Mapping[str, ArrayLike]) -> List[tensor_pb2.NamedTensor]:
        named = []
        for name, value in side_inputs.items():
            if value is None:
                continue
            tensor = to_wire(value, f"side_inputs.{name}", SIDE_INPUT_DTYPES.get(name))
            named.append(tensor_pb2.NamedTensor(name=name, tensor=tensor))
        return named

    @staticmethod
    def _decoder(torch_out: bool) -> Callable[[tensor_pb2.Tensor, str], Any]:
        def decode(t: tensor_pb2.Tensor, field: str) -> Any:
            array = from_wire(t, field)
            if torch_out:
                import torch

                return torch.from_numpy(array)
            return array

        return decode

    # -- info

    @property
    def info(self) -> service_pb2.SessionInfo:
        """GetSession: the spec, step, parameter count, device, live handles, layers."""
        return self.client._call("GetSession", service_pb2.GetSessionRequest(session_id=self.id))

    def server_info(self) -> service_pb2.ServerInfo:
        """GetServerInfo of the server holding this session."""
        return self.client.server_info()

    # -- Forward / Backward

    def _forward_request(self, inputs: Sequence[ArrayLike], no_grad: bool,
                         side_inputs: Mapping[str, ArrayLike]) -> service_pb2.ForwardRequest:
        return service_pb2.ForwardRequest(session_id=self.id, inputs=self._encode_inputs(inputs, "inputs"),
                                          no_grad=no_grad, side_inputs=self._encode_side(side_inputs))

    def _forward_result(self, torch_out: bool) -> Callable[[service_pb2.ForwardResponse], ForwardResult]:
        decode = self._decoder(torch_out)
        return lambda r: ForwardResult([decode(t, f"outputs[{i}]") for i, t in enumerate(r.outputs)],
                                       int(r.handle), self)

    def forward(self, *inputs: ArrayLike, no_grad: bool = False, **side_inputs: ArrayLike) -> ForwardResult:
        """Runs the stack. Keeps activations for one ``backward`` unless ``no_grad``.

        Raises:
            teserve.InvalidArgument: a tensor that does not fit the stack.
            teserve.ResourceExhausted: 1024 forwards already await their backward.
        """
        request = self._forward_request(inputs, no_grad, side_inputs)
        return self._forward_result(_torch_in(inputs))(self.client._call("Forward", request))

    def forward_async(self, *inputs: ArrayLike, no_grad: bool = False, **side_inputs: ArrayLike) -> Future:
        """``forward`` without waiting: a Future of the ForwardResult."""
        request = self._forward_request(inputs, no_grad, side_inputs)
        return self.client._call_async("Forward", request, self._forward_result(_torch_in(inputs)))

    def _backward_request(self, forward: Union[ForwardResult, int],
                          grad_outputs: Sequence[ArrayLike]) -> service_pb2.BackwardRequest:
        handle = forward.handle if isinstance(forward, ForwardResult) else forward
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise TypeError(f"backward: expected a ForwardResult or a handle (int), got {type(forward).__name__}")
        return service_pb2.BackwardRequest(session_id=self.id, handle=handle,
                                           grad_outputs=self._encode_inputs(grad_outputs, "grad_outputs"))

    def _backward_result(self, torch_out: bool) -> Callable[[service_pb2.BackwardResponse], BackwardResult]:
        decode = self._decoder(torch_out)
        return lambda r: BackwardResult(
            [decode(t, f"grad_inputs[{i}]") for i, t in enumerate(r.grad_inputs)],
            {n.name: decode(n.tensor, f"side_grads.{n.name}") for n in r.side_grads})

    def backward(self, forward: Union[ForwardResult, int], *grad_outputs: ArrayLike) -> BackwardResult:
        """Backward for one forward (its result or handle), with one gradient per output.

        Parameter gradients accumulate on the server until ``step`` / ``zero_grad``.

        Raises:
            teserve.NotFound: the handle is unknown or was already consumed.
            teserve.InvalidArgument: a gradient whose shape differs from its output's.
        """
        request = self._backward_request(forward, grad_outputs)
        return self._backward_result(_torch_in(grad_outputs))(self.client._call("Backward", request))

    def backward_async(self, forward: Union[ForwardResult, int], *grad_outputs: ArrayLike) -> Future:
        """``backward`` without waiting: a Future of the BackwardResult."""
        request = self._backward_request(forward, grad_outputs)
        return self.client._call_async("Backward", request, self._backward_result(_torch_in(grad_outputs)))

    # -- ForwardBackward

    def _fb_request(self, inputs: Sequence[ArrayLike], target: ArrayLike, loss: Union[str, Loss],
                    return_input_grad: bool, return_outputs: bool,
                    side_inputs: Mapping[str, ArrayLike]) -> service_pb2.ForwardBackwardRequest:
        spec = loss_spec(loss)
        if target is None:
            raise ValueError("forward_backward: expected a target, got None")
        target_dtype = "int64" if spec.HasField("cross_entropy") else None
        tgt = np.asarray(target) if not is_torch_tensor(target) else target
        if target_dtype and not is_torch_tensor(tgt) and tgt.dtype.kind not in "iu":
            raise TypeError(f"target: expected integer class labels for cross entropy, got dtype {tgt.dtype}")
        if target_dtype and not is_torch_tensor(tgt) and tgt.dtype == np.int32:
            target_dtype = None  # INT32 labels travel as they are
        return service_pb2.ForwardBackwardRequest(
            session_id=self.id, inputs=self._encode_inputs(inputs, "inputs"),
            side_inputs=self._encode_side(side_inputs), loss=spec,
            target=to_wire(tgt, "target", target_dtype),
            return_input_grad=return_input_grad, return_outputs=return_outputs)

    def _fb_result(self, torch_out: bool) -> Callable[[service_pb2.ForwardBackwardResponse], ForwardBackwardResult]:
        decode = self._decoder(torch_out)
        return lambda r: ForwardBackwardResult(
            float(r.loss), int(r.num_tokens),
            [decode(t, f"grad_inputs[{i}]") for i, t in enumerate(r.grad_inputs)],
            {n.name: decode(n.tensor, f"side_grads.{n.name}") for n in r.side_grads},
            [decode(t, f"outputs[{i}]") for i, t in enumerate(r.outputs)])

    def forward_backward(self, *inputs: ArrayLike, target: ArrayLike,
                         loss: Union[str, Loss] = "cross_entropy", return_input_grad: bool = False,
                         return_outputs: bool = False, **side_inputs: ArrayLike) -> ForwardBackwardResult:
        """Forward, a built-in loss and backward in one call (no handle is kept).

        Args:
            target: INT64 / INT32 labels of the output's leading shape for cross entropy,
                or a float array of the output's shape for ``"mse"``.
            loss: ``"cross_entropy"`` (default), ``"mse"``, ``teserve.CrossEntropyLoss(
                ignore_index=-100, label_smoothing=0.0)`` or ``teserve.MSELoss()``.
            return_input_grad: also return the input (and side input) gradients.
            return_outputs: also return the outputs.
        """
        request = self._fb_request(inputs, target, loss, return_input_grad, return_outputs, side_inputs)
        return self._fb_result(_torch_in(inputs))(self.client._call("ForwardBackward", request))

    def forward_backward_async(self, *inputs: ArrayLike, target: ArrayLike,
                               loss: Union[str, Loss] = "cross_entropy", return_input_grad: bool = False,
                               return_outputs: bool = False, **side_inputs: ArrayLike) -> Future:
        """``forward_backward`` without waiting: a Future of the ForwardBackwardResult."""
        request = self._fb_request(inputs, target, loss, return_input_grad, return_outputs, side_inputs)
        return self.client._call_async("ForwardBackward", request, self._fb_result(_torch_in(inputs)))

    # -- optimizer

    @staticmethod
    def _step_result(r: service_pb2.StepResponse) -> StepResult:
        return StepResult(int(r.step), float(r.grad_norm), bool(r.skipped))

    def step(self, zero_grad: bool = False) -> StepResult:
        """One optimizer step over the accumulated gradients; ``zero_grad`` clears them after."""
        request = service_pb2.StepRequest(session_id=self.id, zero_grad=zero_grad)
        return self._step_result(self.client._call("Step", request))

    def step_async(self, zero_grad: bool = False) -> Future:
        """``step`` without waiting: a Future of the StepResult."""
        request = service_pb2.StepRequest(session_id=self.id, zero_grad=zero_grad)
        return self.client._call_async("Step", request, self._step_result)

    def zero_grad(self) -> None:
        """Clears the accumulated parameter gradients."""
        self.client._call("ZeroGrad", service_pb2.ZeroGradRequest(session_id=self.id))

    # -- parameters

    def _get_parameters(self, names: Optional[Iterable[str]], include_grads: bool) -> service_pb2.GetParametersResponse:
        if isinstance(names, str):
            names = [names]
        request = service_pb2.GetParametersRequest(session_id=self.id, names=list(names or []),
                                                   include_grads=include_grads)
        return self.client._call("GetParameters", request)

    def parameters(self, names: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
        """Parameters by TE's names (``"layers.0.weight"``, ...) as float32 numpy arrays,
        in the server's order. ``names``: only these (NotFound for an unknown one)."""
        response = self._get_parameters(names, False)
        return {p.name: from_wire(p.tensor, f"parameters.{p.name}") for p in response.parameters}

    def gradients(self, names: Optional[Iterable[str]] = None) -> Dict[str, np.ndarray]:
        """The accumulated gradients, by parameter name."""
        response = self._get_parameters(names, True)
        return {g.name: from_wire(g.tensor, f"grads.{g.name}") for g in response.grads}

    def load_parameters(self, parameters: Union[Mapping[str, ArrayLike], Iterable[Tuple[str, ArrayLike]]]) -> None:
        """Writes parameters by name (all-or-nothing: each is validated before any is
        written). Accepts the dict ``parameters()`` returns, or a subset of it."""
        items = parameters.items() if isinstance(parameters, Mapping) else parameters
        named = [tensor_pb2.NamedTensor(name=name, tensor=to_wire(value, f"parameters.{name}"))
                 for name, value in items]
        self.client._call("SetParameters", service_pb2.SetParametersRequest(session_id=self.id, parameters=named))

    state_dict = parameters
    load_state_dict = load_parameters

    # -- quantization

    def quant_state(self) -> service_pb2.QuantizationState:
        """GetQuantizationState: per quantized tensor amax history, scale, scale_inv,
        execution, block-scale summary and FP8 health (``.tensors``)."""
        return self.client._call("GetQuantizationState",
                                 service_pb2.GetQuantizationStateRequest(session_id=self.id))

    # -- lifetime

    def delete(self) -> None:
        """Deletes the session on the server (idempotent on this object)."""
        if self._deleted:
            return
        self.client._call("DeleteSession", service_pb2.DeleteSessionRequest(session_id=self.id))
        self._deleted = True

    def close(self) -> None:
        """Deletes the session if this object created it; a NotFound (already gone) is ignored."""
        if self.owned and not self._deleted:
            try:
                self.delete()
            except TeserveError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise
                self._deleted = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._deleted:
            try:
                self.delete()
            except TeserveError as e:
                if e.code != grpc.StatusCode.NOT_FOUND:
                    raise

    def __repr__(self) -> str:
        return f"teserve.Session({self.id!r} on {self.client.address!r})"


def _torch_in(values: Sequence[Any]) -> bool:
    return bool(values) and is_torch_tensor(values[0])
