// Helpers for the model tests: parameters per unit, random batches, one
// training step through GptModel on host buffers.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "model/gpt.h"

namespace zinf::model::test {

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Arena = std::unique_ptr<void, AlignedFree>;

inline Arena MakeArena(uint64_t bytes) { return Arena(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64)); }

inline GptConfig Tiny() { return std::move(GptPreset("tiny")).value(); }

// GPT-2's initialisation plus a uniform perturbation, so biases, LayerNorm
// weights and the positional embedding are all away from their initial
// 0/1 values and every path shows up in the gradients.
inline std::vector<std::vector<float>> MakeParams(const GptConfig& c, uint64_t seed, float perturb = 0.05f) {
  std::vector<std::vector<float>> units(NumUnits(c));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-perturb, perturb);
  for (int unit = 0; unit < NumUnits(c); ++unit) {
    units[unit].resize(UnitNumParams(c, unit));
    InitUnitParams(c, unit, seed, units[unit].data());
    for (float& v : units[unit]) v += u(rng);
  }
  return units;
}

inline std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

template <class T>
std::vector<const void*> ConstPtrs(const std::vector<std::vector<T>>& units) {
  std::vector<const void*> p;
  for (const auto& u : units) p.push_back(u.data());
  return p;
}
template <class T>
std::vector<void*> Ptrs(std::vector<std::vector<T>>& units) {
  std::vector<void*> p;
  for (auto& u : units) p.push_back(u.data());
  return p;
}

// Gradient buffers of element type G, one per unit, filled with `fill`.
template <class G>
std::vector<std::vector<G>> MakeGrads(const GptConfig& c, G fill = G{}) {
  std::vector<std::vector<G>> g(NumUnits(c));
  for (int unit = 0; unit < NumUnits(c); ++unit) g[unit].assign(UnitNumParams(c, unit), fill);
  return g;
}

// One forward + backward. Params of element type P, grads of type G.
template <class P, class G>
float Step(GptModel& model, const std::vector<std::vector<P>>& params, std::vector<std::vector<G>>& grads,
           const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  Arena arena = MakeArena(model.activation_bytes());
  model.BindActivations(arena.get());
  auto loss = model.Forward(tokens.data(), targets.data(), ConstPtrs(params));
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  Status st = model.Backward(ConstPtrs(params), Ptrs(grads));
  EXPECT_TRUE(st.ok()) << st.ToString();
  return loss.value_or(NAN);
}

inline std::unique_ptr<GptModel> MakeModel(const GptConfig& c, const GptRunOptions& o) {
  auto m = GptModel::Create(c, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

}  // namespace zinf::model::test
