// The tail of `calibrate` and `scales`: fetch the deployment's scales, write the files the server
// rendered (kv_cache_calib.json, scales.json, every --format's files) and print a summary.
#ifndef CALIPER_CLIENT_SCALES_OUTPUT_H_
#define CALIPER_CLIENT_SCALES_OUTPUT_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/rpc_retry.h"
#include "proto/caliper.grpc.pb.h"

namespace caliper::cli {

struct WrittenOutputs {
  std::string kv_cache_calib;  // empty without KV scales or for e4m3fnuz (LightLLM: e4m3fn only)
  std::string scales_json;
  std::vector<std::string> engine_files;  // other formats asked for (--format), by path
};
// Writes the response's files into DIR (created), each replaced atomically: the LightLLM file as
// kv_cache_calib.json, scales.json, the other formats under their own names. Errors name the
// path; DataLoss when the response lacks what it must hold (scales.json; the LightLLM file of an
// e4m3fn KV session) or names a file outside DIR: a server fault.
absl::StatusOr<WrittenOutputs> WriteScalesOutputs(const std::string& dir,
                                                  const v1::ScalesResponse& scales);

// A few lines for a person: KV scale ranges, the first NVFP4 groups, warnings.
void PrintScalesSummary(const v1::ScalesResponse& scales, std::ostream& out);

// Asks GetScales for what `request` names (a session, or a fleet's version) for `deployment`
// (the recipe's KV file plus every --format; retried per `retry`), writes the outputs into
// out_dir, prints the summary and the paths. Returns the error to report (RpcError when the
// server said no).
absl::Status FetchAndWriteScales(v1::Calibration::Stub& stub, absl::string_view command,
                                 const RetryPolicy& retry, v1::ScalesRequest request,
                                 const v1::Recipe& recipe,
                                 const v1::Deployment& deployment, v1::Nvfp4Convention convention,
                                 const std::vector<std::string>& formats,
                                 const std::string& out_dir, std::ostream& out, std::ostream& err);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_SCALES_OUTPUT_H_
