#include "core/tensor/tensor_view.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace caliper {
namespace {

absl::Span<const uint8_t> Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

TEST(TensorViewTest, CreatesViewOverMatchingBytes) {
  std::vector<float> data(24, 1.0f);
  auto view = TensorView::Create(DType::kF32, {2, 3, 4}, Bytes(data));
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->num_elements(), 24);
  EXPECT_EQ(view->ShapeString(), "[2, 3, 4]");
  EXPECT_EQ(view->data(), data.data());  // a view, not a copy
}

TEST(TensorViewTest, HalfTypesUseTwoBytes) {
  std::vector<uint8_t> data(2 * 6);
  EXPECT_TRUE(TensorView::Create(DType::kBF16, {6}, data).ok());
  EXPECT_TRUE(TensorView::Create(DType::kF16, {2, 3}, data).ok());
  EXPECT_FALSE(TensorView::Create(DType::kF32, {2, 3}, data).ok());
}

TEST(TensorViewTest, ZeroSizedDimensionIsAnEmptyTensor) {
  auto view = TensorView::Create(DType::kF32, {0, 8}, {});
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->num_elements(), 0);
}

TEST(TensorViewTest, RejectsByteCountMismatchNamingField) {
  std::vector<float> data(5);
  auto view = TensorView::Create(DType::kF32, {2, 3}, Bytes(data), "k_chunk");
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find("k_chunk.data"), absl::string_view::npos);
  EXPECT_NE(view.status().message().find("20 bytes"), absl::string_view::npos);
  EXPECT_NE(view.status().message().find("needs 24"), absl::string_view::npos);
}

TEST(TensorViewTest, RejectsEmptyShapeAndNegativeDims) {
  std::vector<float> data(4);
  auto empty = TensorView::Create(DType::kF32, {}, Bytes(data), "t");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("t.shape"), absl::string_view::npos);
  auto negative = TensorView::Create(DType::kF32, {-4}, Bytes(data), "t");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("t.shape[0]"), absl::string_view::npos);
}

TEST(TensorViewTest, RejectsOverflowingElementCount) {
  auto view = TensorView::Create(DType::kF32, {int64_t{1} << 31, int64_t{1} << 31, 16}, {});
  ASSERT_FALSE(view.ok());
  EXPECT_NE(view.status().message().find("overflow"), absl::string_view::npos);
}

}  // namespace
}  // namespace caliper
