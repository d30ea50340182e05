#include "client/client.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/float_codec.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace teserve {
namespace client {
namespace {

// grpc.health.v1 is not part of our proto tree; its two messages are tiny, so they are
// encoded by hand: HealthCheckRequest{string service = 1},
// HealthCheckResponse{ServingStatus status = 1}.
constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Reads a varint at *pos; false when the input ends inside it or it is too long.
bool ReadVarint(const std::string& in, size_t* pos, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && *pos < in.size(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(in[(*pos)++]);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

std::string EncodeHealthCheckRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;  // proto3 leaves default fields out
  out.push_back(0x0a);              // field 1, length-delimited
  AppendVarint(service.size(), &out);
  out += service;
  return out;
}

// The status field of a HealthCheckResponse, skipping fields a newer server may add.
absl::StatusOr<int> DecodeHealthCheckResponse(const std::string& in) {
  const absl::Status malformed =
      absl::DataLossError("grpc.health.v1.HealthCheckResponse: malformed bytes");
  int status = 0;  // UNKNOWN when absent (proto3 default)
  size_t pos = 0;
  while (pos < in.size()) {
    uint64_t tag = 0;
    uint64_t value = 0;
    if (!ReadVarint(in, &pos, &tag)) return malformed;
    switch (tag & 7) {
      case 0:  // varint
        if (!ReadVarint(in, &pos, &value)) return malformed;
        if ((tag >> 3) == 1) status = static_cast<int>(value);
        break;
      case 1:  // fixed64
        if (in.size() - pos < 8) return malformed;
        pos += 8;
        break;
      case 2:  // length-delimited
        if (!ReadVarint(in, &pos, &value) || value > in.size() - pos) return malformed;
        pos += value;
        break;
      case 5:  // fixed32
        if (in.size() - pos < 4) return malformed;
        pos += 4;
        break;
      default:
        return malformed;
    }
  }
  return status;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status LoadTlsFiles(const std::string& ca_path, const std::string& cert_path,
                          const std::string& key_path, ClientOptions* options) {
  const auto read = [](const std::string& path, absl::string_view flag, std::string* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
    std::stringstream text;
    text << in.rdbuf();
    *out = text.str();
    return absl::OkStatus();
  };
  if (cert_path.empty() != key_path.empty()) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: expected both or neither, got one");
  }
  absl::Status status = read(ca_path, "--tls_ca", &options->tls_root_certs);
  if (status.ok()) status = read(cert_path, "--tls_cert", &options->tls_cert_chain);
  if (status.ok()) status = read(key_path, "--tls_key", &options->tls_private_key);
  if (!status.ok()) return status;
  options->tls = !ca_path.empty() || !cert_path.empty();
  return absl::OkStatus();
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::string HealthStatusName(int status) {
  switch (status) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return absl::StrCat("UNRECOGNIZED(", status, ")");
  }
}

Client::Client(const std::string& address, ClientOptions options) : options_(options) {
  grpc::ChannelArguments args;
  const int limit = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs;
    ssl.pem_cert_chain = options.tls_cert_chain;
    ssl.pem_private_key = options.tls_private_key;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(options.tls_server_name);
    }
  }
  channel_ = grpc::CreateCustomChannel(address, credentials, args);
  stub_ = v1::Trainer::NewStub(channel_);
}

namespace {

void SetDeadline(absl::Duration rpc_timeout, grpc::ClientContext* context) {
  if (rpc_timeout != absl::InfiniteDuration()) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout));
  }
}

template <typename Request, typename Response>
using TrainerMethod = grpc::Status (v1::Trainer::Stub::*)(grpc::ClientContext*, const Request&,
                                                          Response*);

// The unary Trainer calls all look alike: fresh context with the deadline, call, convert.
template <typename Request, typename Response>
absl::StatusOr<Response> CallUnary(v1::Trainer::Stub& stub, const ClientOptions& options,
                                   TrainerMethod<Request, Response> method,
                                   const Request& request) {
  grpc::ClientContext context;
  SetDeadline(options.rpc_timeout, &context);
  if (!options.token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", options.token));
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

// A request naming `session_id`, its other fields left at their defaults.
template <typename Request>
Request ForSession(const std::string& session_id) {
  Request request;
  request.set_session_id(session_id);
  return request;
}

}  // namespace

void Client::Prepare(grpc::ClientContext* context) const {
  SetDeadline(options_.rpc_timeout, context);
  if (!options_.token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
}

absl::StatusOr<std::string> Client::Health(const std::string& service) {
  grpc::GenericStub generic(channel_);
  grpc::ClientContext context;
  Prepare(&context);
  const std::string request_bytes = EncodeHealthCheckRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  generic.UnaryCall(&context, kHealthCheckMethod, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  absl::StatusOr<int> serving = DecodeHealthCheckResponse(Flatten(response));
  if (!serving.ok()) return serving.status();
  return HealthStatusName(*serving);
}

absl::StatusOr<v1::CreateSessionResponse> Client::CreateSession(
    const v1::CreateSessionRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::CreateSession, request);
}

absl::StatusOr<v1::SessionInfo> Client::GetSession(const std::string& session_id) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::GetSession,
                   ForSession<v1::GetSessionRequest>(session_id));
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessions() {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::ListSessions,
                   v1::ListSessionsRequest());
}

absl::Status Client::DeleteSession(const std::string& session_id) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::DeleteSession,
                   ForSession<v1::DeleteSessionRequest>(session_id))
      .status();
}

absl::StatusOr<v1::ForwardResponse> Client::Forward(const v1::ForwardRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::Forward, request);
}

absl::StatusOr<v1::BackwardResponse> Client::Backward(const v1::BackwardRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::Backward, request);
}

absl::StatusOr<v1::ForwardBackwardResponse> Client::ForwardBackward(
    const v1::ForwardBackwardRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::ForwardBackward, request);
}

absl::StatusOr<v1::StepResponse> Client::Step(const std::string& session_id, bool zero_grad) {
  v1::StepRequest request = ForSession<v1::StepRequest>(session_id);
  request.set_zero_grad(zero_grad);
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::Step, request);
}

absl::Status Client::ZeroGrad(const std::string& session_id) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::ZeroGrad,
                   ForSession<v1::ZeroGradRequest>(session_id))
      .status();
}

absl::StatusOr<v1::GetParametersResponse> Client::GetParameters(
    const v1::GetParametersRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::GetParameters, request);
}

absl::Status Client::SetParameters(const v1::SetParametersRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::SetParameters, request)
      .status();
}

absl::StatusOr<v1::QuantizationState> Client::GetQuantizationState(const std::string& session_id) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::GetQuantizationState,
                   ForSession<v1::GetQuantizationStateRequest>(session_id));
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::GetServerInfo,
                   v1::GetServerInfoRequest());
}

absl::StatusOr<v1::SaveCheckpointResponse> Client::SaveCheckpoint(const v1::SaveCheckpointRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::SaveCheckpoint, request);
}

absl::StatusOr<v1::LoadCheckpointResponse> Client::LoadCheckpoint(const v1::LoadCheckpointRequest& request) {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::LoadCheckpoint, request);
}

absl::StatusOr<v1::ListCheckpointsResponse> Client::ListCheckpoints() {
  return CallUnary(*stub_, options_, &v1::Trainer::Stub::ListCheckpoints, v1::ListCheckpointsRequest());
}

v1::Tensor MakeFloatTensor(absl::Span<const float> values, std::vector<int64_t> shape) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::FLOAT32);
  for (int64_t d : shape) tensor.add_shape(d);
  tensor.set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return tensor;
}

v1::Tensor MakeInt64Tensor(absl::Span<const int64_t> values, std::vector<int64_t> shape) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::INT64);
  for (int64_t d : shape) tensor.add_shape(d);
  tensor.set_data(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  return tensor;
}

absl::StatusOr<std::vector<float>> FloatsOf(const v1::Tensor& tensor) {
  // A 16-bit tensor (a BF16 / FP16 params_dtype model's output) widens exactly.
  const bool bf16 = tensor.dtype() == v1::BFLOAT16;
  const bool fp16 = tensor.dtype() == v1::FLOAT16;
  if (tensor.dtype() != v1::FLOAT32 && !bf16 && !fp16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.dtype: expected FLOAT32, BFLOAT16 or FLOAT16, got ",
                                                   v1::DType_Name(tensor.dtype())));
  }
  const uint64_t element_bytes = bf16 || fp16 ? 2 : sizeof(float);
  uint64_t numel = 1;
  for (int64_t d : tensor.shape()) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor.shape: expected non-negative dims, got ", d));
    }
    if (d != 0 && numel > UINT64_MAX / element_bytes / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError("tensor.shape: element count overflows");
    }
    numel *= static_cast<uint64_t>(d);
  }
  if (numel * element_bytes != tensor.data().size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.data: expected ",
                                                   numel * element_bytes, " bytes, got ",
                                                   tensor.data().size()));
  }
  std::vector<float> values(numel);
  if (numel == 0) return values;
  if (!bf16 && !fp16) {
    std::memcpy(values.data(), tensor.data().data(), tensor.data().size());
    return values;
  }
  for (uint64_t i = 0; i < numel; ++i) {
    uint16_t code = 0;
    std::memcpy(&code, tensor.data().data() + i * 2, 2);
    values[i] = bf16 ? Bf16ToFloat(code) : Fp16ToFloat(code);
  }
  return values;
}

}  // namespace client
}  // namespace teserve
