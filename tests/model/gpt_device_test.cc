// GptDevice on a HostDevice in checking mode: parameters, gradients, tokens
// and activations in device memory (tagged pointers that fault if host code
// touches them outside a stream task), the activation arena counted by the
// device's memory statistics, and results bit-identical to GptModel on host
// buffers.
#include "exec/gpt_device.h"

#include <gtest/gtest.h>

#include <cstring>

#include "cpu/host_device.h"
#include "model_test_util.h"

namespace zinf::model {
namespace {

using exec::GptDevice;
using test::MakeGrads;
using test::MakeModel;
using test::MakeParams;
using test::RandomTokens;

std::unique_ptr<Device> CheckingDevice(uint64_t budget_bytes) {
  DeviceOptions o;
  o.spec = "cpu";
  o.memory_budget = budget_bytes;
  o.checking = true;
  o.seed = 1;
  return std::move(cpu::CreateHostDevice(o)).value();
}

template <class T>
T* Upload(Device& d, Stream& s, const std::vector<T>& host) {
  void* p = d.Allocate(host.size() * sizeof(T), s).value();
  EXPECT_TRUE(d.CopyToDevice(p, host.data(), host.size() * sizeof(T), s).ok());
  return static_cast<T*>(p);
}

TEST(GptDeviceTest, RunsOnAStreamWithActivationsFromTheDeviceBudget) {
  const GptConfig c = test::Tiny();
  GptRunOptions o;
  o.batch_size = 2;
  o.num_threads = 2;
  o.activation_checkpointing = true;
  const int64_t BT = o.batch_size * c.max_seq_len;
  auto params = MakeParams(c, 8);
  auto tokens = RandomTokens(BT, c.vocab_size, 9), targets = RandomTokens(BT, c.vocab_size, 10);

  // Host run: the expected bits.
  auto host_model = MakeModel(c, o);
  auto expected_grads = MakeGrads<float>(c);
  const float expected_loss = test::Step(*host_model, params, expected_grads, tokens, targets);

  auto device = CheckingDevice(64 << 20);
  auto stream = std::move(device->CreateStream()).value();
  std::vector<const void*> dparams;
  std::vector<void*> dgrads;
  for (int u = 0; u < NumUnits(c); ++u) {
    dparams.push_back(Upload(*device, *stream, params[u]));
    dgrads.push_back(device->Allocate(params[u].size() * sizeof(float), *stream).value());
  }
  int32_t* dtokens = Upload(*device, *stream, tokens);
  int32_t* dtargets = Upload(*device, *stream, targets);
  float* dloss = static_cast<float*>(device->Allocate(sizeof(float), *stream).value());
  EXPECT_TRUE(cpu::IsTaggedDevicePointer(dloss));

  const uint64_t before = device->memory_stats().requested_bytes;
  auto gpt = GptDevice::Create(*device, *stream, c, o);
  ASSERT_TRUE(gpt.ok()) << gpt.status().ToString();
  EXPECT_EQ(device->memory_stats().requested_bytes - before, (*gpt)->activation_bytes());

  ASSERT_TRUE((*gpt)->EnqueueForward(dtokens, dtargets, dparams, dloss).ok());
  ASSERT_TRUE((*gpt)->EnqueueBackward(dparams, dgrads).ok());
  float loss = 0;
  ASSERT_TRUE(device->CopyToHost(&loss, dloss, sizeof(float), *stream).ok());
  auto grads = MakeGrads<float>(c);
  for (int u = 0; u < NumUnits(c); ++u) {
    ASSERT_TRUE(device->CopyToHost(grads[u].data(), dgrads[u], grads[u].size() * sizeof(float), *stream).ok());
  }
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(loss, expected_loss);
  for (int u = 0; u < NumUnits(c); ++u) EXPECT_EQ(grads[u], expected_grads[u]) << "unit " << u;

  gpt->reset();  // frees the arena, stream-ordered
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_EQ(device->memory_stats().requested_bytes, before);
}

TEST(GptDeviceTest, ActivationsBeyondTheBudgetAreOutOfMemory) {
  const GptConfig c = test::Tiny();
  GptRunOptions o;
  o.batch_size = 64;
  auto device = CheckingDevice(1 << 20);
  auto stream = std::move(device->CreateStream()).value();
  auto gpt = GptDevice::Create(*device, *stream, c, o);
  ASSERT_FALSE(gpt.ok());
  EXPECT_EQ(gpt.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(gpt.status().message().find("activations"), std::string::npos) << gpt.status().message();
}

TEST(GptDeviceTest, AStageErrorBecomesTheStreamError) {
  const GptConfig c = test::Tiny();
  GptRunOptions o;
  auto device = CheckingDevice(16 << 20);
  auto stream = std::move(device->CreateStream()).value();
  auto gpt = std::move(GptDevice::Create(*device, *stream, c, o)).value();
  auto params = MakeParams(c, 1);
  const void* block = Upload(*device, *stream, params[1]);
  ASSERT_TRUE(gpt->EnqueueBlockForward(0, block).ok());  // before EmbedForward
  EXPECT_EQ(stream->Synchronize().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace zinf::model
