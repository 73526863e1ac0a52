// Every file `caliper scales` writes for one finalized session and deployment, rendered once:
// the engine files asked for (RenderSessionOutputs) and scales.json (core/formats/scales_json.h).
#ifndef CALIPER_CORE_SESSION_SCALES_OUTPUTS_H_
#define CALIPER_CORE_SESSION_SCALES_OUTPUTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/session/session.h"

namespace caliper {

struct ScalesOutputs {
  std::vector<RenderedFile> files;     // in the order of `formats`
  std::string scales_json;
  std::vector<ScaleWarning> warnings;  // the scales' warnings, then the lossy rendering steps'
};

// `status` is the session the scales came from (id, name, model, progress counters).
// InvalidArgument naming formats[i] as RenderSessionOutputs.
absl::StatusOr<ScalesOutputs> RenderScalesOutputs(const SessionStatus& status,
                                                  const SessionScales& scales,
                                                  absl::Span<const std::string> formats);

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SCALES_OUTPUTS_H_
