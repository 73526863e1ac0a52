// The small model and the numbered chunks the state-store tests (file store, partial flusher)
// feed sessions: chunk i is K of layer i % 2 or an input of module "m{i % 3}" at batch 70 * i,
// with data drawn from seed i, so two sessions fed the same numbers hold the same state.
#ifndef CALIPER_TESTS_SUPPORT_NUMBERED_CHUNKS_H_
#define CALIPER_TESTS_SUPPORT_NUMBERED_CHUNKS_H_

#include <random>
#include <string>
#include <vector>

#include "core/session/session.h"
#include "gtest/gtest.h"
#include "tests/support/session_test_util.h"

namespace caliper::testing {

// 2 layers, 2 KV heads of 4, 4 attention heads, hidden 16.
inline ModelConfig NumberedChunkModel() { return LlamaTestModel(2, 2, 4, 4); }

inline void ObserveNumberedChunk(CalibrationSession& s, int i, ReductionBackend& backend,
                                 const ProducerLedger::Stream* producer, uint64_t sequence) {
  std::mt19937 rng(static_cast<uint32_t>(i) + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f + static_cast<float>(i));
  std::vector<float> data(i % 2 == 0 ? 2 * 2 * 4 : 16);
  for (float& x : data) x = dist(rng);
  const std::string module = "m" + std::to_string(i % 3);
  ChunkRef c;
  c.kind = i % 2 == 0 ? ChunkKind::kKey : ChunkKind::kInput;
  c.layer = i % 2;
  c.module = module;
  c.dtype = DType::kF32;
  c.shape = i % 2 == 0 ? std::vector<int64_t>{2, 2, 4} : std::vector<int64_t>{1, 16};
  c.batch = 70 * i;
  c.sequence = sequence;
  c.data = ByteSpans(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
  ASSERT_TRUE(s.Observe(c, backend, producer).status.ok());
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_NUMBERED_CHUNKS_H_
