#include "core/formats/render_inputs.h"

namespace caliper {

const char* CaliperVersion() { return CALIPER_VERSION; }

Nvfp4Scales ConvertNvfp4Form(const Nvfp4Scales& scales, ScaleForm form) {
  if (scales.form == form) return scales;
  Nvfp4Scales out = scales;
  out.form = form;
  auto reciprocal = [](std::optional<float>& value) {
    if (value.has_value()) value = static_cast<float>(1.0 / static_cast<double>(*value));
  };
  for (auto& [name, module] : out.modules) {
    reciprocal(module.weight_scale);
    reciprocal(module.input_scale);
  }
  return out;
}

}  // namespace caliper
