// C++ client for a teserve server: the Trainer RPCs, the standard gRPC health check,
// and helpers to move float data in and out of wire Tensors.
//
// Depends only on the wire contract (proto), gRPC and abseil. Every method returns
// absl::StatusOr with the server's code and message unchanged. Thread-safe: gRPC stubs
// may be shared between threads.
#ifndef TESERVE_CLIENT_CLIENT_H_
#define TESERVE_CLIENT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "teserve/v1/service.grpc.pb.h"

namespace teserve {
namespace client {

struct ClientOptions {
  int64_t max_message_bytes = int64_t{1} << 30;  // both directions; as the server default
  absl::Duration rpc_timeout = absl::Minutes(5);  // per call; InfiniteDuration = none
  // Bearer token sent as "authorization: Bearer <token>" on every call (servers with
  // --auth_tokens_file); empty: none.
  std::string token;
  // TLS: on when `tls`; PEM texts (LoadTlsFiles reads them from files). Empty root
  // certs: the system's roots. Cert chain and key: the client certificate for mTLS.
  bool tls = false;
  std::string tls_root_certs;
  std::string tls_cert_chain;
  std::string tls_private_key;
  std::string tls_server_name;  // overrides the name checked against the server's certificate
};

// Reads the PEM files named by --tls_ca / --tls_cert / --tls_key (empty paths are
// skipped) into `options` and turns TLS on when a CA or a certificate is given.
absl::Status LoadTlsFiles(const std::string& ca_path, const std::string& cert_path,
                          const std::string& key_path, ClientOptions* options);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

class Client {
 public:
  // Creates a channel to `address` (TLS when options.tls, else plaintext) ("host:port"); connects lazily, so a
  // server that is down shows up as UNAVAILABLE on the first call.
  explicit Client(const std::string& address, ClientOptions options = {});

  // grpc.health.v1.Health/Check for `service` ("" = the whole server). Returns the
  // serving status name: "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN".
  absl::StatusOr<std::string> Health(const std::string& service = "");

  absl::StatusOr<v1::CreateSessionResponse> CreateSession(const v1::CreateSessionRequest& request);
  absl::StatusOr<v1::SessionInfo> GetSession(const std::string& session_id);
  absl::StatusOr<v1::ListSessionsResponse> ListSessions();
  absl::Status DeleteSession(const std::string& session_id);
  absl::StatusOr<v1::ForwardResponse> Forward(const v1::ForwardRequest& request);
  absl::StatusOr<v1::BackwardResponse> Backward(const v1::BackwardRequest& request);
  // Forward, built-in loss (MSE or cross entropy) and Backward in one call.
  absl::StatusOr<v1::ForwardBackwardResponse> ForwardBackward(const v1::ForwardBackwardRequest& request);
  absl::StatusOr<v1::StepResponse> Step(const std::string& session_id, bool zero_grad = false);
  absl::Status ZeroGrad(const std::string& session_id);
  absl::StatusOr<v1::GetParametersResponse> GetParameters(const v1::GetParametersRequest& request);
  absl::Status SetParameters(const v1::SetParametersRequest& request);
  absl::StatusOr<v1::QuantizationState> GetQuantizationState(const std::string& session_id);
  absl::StatusOr<v1::ServerInfo> GetServerInfo();
  absl::StatusOr<v1::SaveCheckpointResponse> SaveCheckpoint(const v1::SaveCheckpointRequest& request);
  absl::StatusOr<v1::LoadCheckpointResponse> LoadCheckpoint(const v1::LoadCheckpointRequest& request);
  absl::StatusOr<v1::ListCheckpointsResponse> ListCheckpoints();

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  v1::Trainer::Stub& stub() { return *stub_; }

 private:
  void Prepare(grpc::ClientContext* context) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Trainer::Stub> stub_;
};

// A FLOAT32 wire tensor holding `values` (row-major) with `shape`. The caller keeps the
// counts consistent; the server checks them anyway.
v1::Tensor MakeFloatTensor(absl::Span<const float> values, std::vector<int64_t> shape);
// An INT64 wire tensor (class labels for cross entropy, m_splits) with `shape`.
v1::Tensor MakeInt64Tensor(absl::Span<const int64_t> values, std::vector<int64_t> shape);
// The values of a FLOAT32, BFLOAT16 or FLOAT16 wire tensor as floats (16-bit values
// widen exactly); INVALID_ARGUMENT for other dtypes or a data length that does not match
// the shape.
absl::StatusOr<std::vector<float>> FloatsOf(const v1::Tensor& tensor);

// "SERVING" etc. for the grpc.health.v1 ServingStatus numbers.
std::string HealthStatusName(int status);

}  // namespace client
}  // namespace teserve

#endif  // TESERVE_CLIENT_CLIENT_H_
