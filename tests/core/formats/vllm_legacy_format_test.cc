#include "core/formats/vllm_legacy_format.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/support/format_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace ::caliper::testing;  // NOLINT: the shared format-test inputs

TEST(VllmLegacyTest, OneMaxOfKAndVPerRankAndLayerWithReplicatedHeads) {
  RenderInputs in = LlamaInputs(KvGranularity::kPerHead, false);
  in.tp_size = 8;  // 2 KV heads: ranks 0-3 hold head 0, ranks 4-7 head 1
  std::vector<ScaleWarning> warnings;
  auto text = VllmLegacyJson(in, &warnings);
  ASSERT_TRUE(text.ok()) << text.status();
  json legacy = json::parse(*text);
  EXPECT_EQ(legacy["model_type"], "llama");
  EXPECT_EQ(legacy["kv_cache"]["dtype"], "float8_e4m3fn");
  const json& ranks = legacy["kv_cache"]["scaling_factor"];
  for (int r = 0; r < 8; ++r) {
    const int head = r / 4;
    const json& layers = ranks[std::to_string(r)];
    ASSERT_EQ(layers.size(), 2u);
    for (int l = 0; l < 2; ++l) {  // V = 2 K, so max(K, V) = V of the rank's head
      EXPECT_EQ(layers[std::to_string(l)].get<float>(), 2 * (l + 1) * (head + 1) / 10.0f)
          << "rank " << r << " layer " << l;
    }
  }
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0].message, HasSubstr("max(K, V)"));

  in.tp_size = 1;
  legacy = json::parse(*VllmLegacyJson(in, &warnings));
  EXPECT_EQ(legacy["kv_cache"]["scaling_factor"]["0"]["1"].get<float>(), 0.8f);
  in.tp_size = 3;
  EXPECT_THAT(VllmLegacyJson(in, &warnings).status().message(),
              HasSubstr("is not a multiple of num_kv_heads 2"));
}

}  // namespace
}  // namespace caliper
