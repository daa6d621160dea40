// CPU-vs-CUDA parity: every op of the table, its value and its input gradients, computed on the CPU
// and on a CUDA device from the same inputs. Skips, saying why, where no GPU is visible.
#include <doctest/doctest.h>

#include <iostream>

#include "tests/engine/op_table.h"

using namespace evenflow;
using namespace evenflow::testing;

namespace {

bool have_cuda() {
  if (cuda_device_count() > 0) return true;
  std::cout << "[skipped] no CUDA device visible: " << cuda_unavailable_reason() << "\n";
  return false;
}

// Value and gradients of case c on `device`, returned on the CPU.
std::vector<Tensor> evaluate(const OpCase& c, DType dtype, const Device& device) {
  std::vector<Tensor> inputs = make_inputs(c, dtype, device);
  std::vector<Tensor> wrt;
  for (Tensor& t : inputs) {
    if (is_floating(t.dtype())) {
      t.requires_grad_(true);
      wrt.push_back(t);
    }
  }
  const Tensor out = c.fn(inputs);
  manual_seed(cpu(), 5);
  const Tensor v = randn(out.shape(), {.dtype = dtype}).to(device);
  std::vector<Tensor> results{out.detach().to(cpu())};
  for (const Tensor& g : grad({out}, wrt, {v}, {.allow_unused = true}))
    results.push_back(g.defined() ? g.to(cpu()) : Tensor());
  return results;
}

void check_parity(DType dtype, double atol, double rtol) {
  for (const OpCase& c : op_table()) {
    if (c.cpu_only) continue;
    CAPTURE(c.name);
    const auto ref = evaluate(c, dtype, cpu());
    const auto got = evaluate(c, dtype, cuda(0));
    REQUIRE(ref.size() == got.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      CHECK(ref[i].defined() == got[i].defined());
      if (!ref[i].defined() || !got[i].defined()) continue;
      const std::string diff = compare(got[i], ref[i], atol, rtol);
      CHECK_MESSAGE(diff.empty(),
                    c.name << (i == 0 ? " value" : " gradient of input " + std::to_string(i - 1)) << ": " << diff);
    }
  }
}

}  // namespace

TEST_CASE("cuda parity: every op, float64") {
  if (!have_cuda()) return;
  check_parity(kFloat64, 1e-10, 1e-8);
}

TEST_CASE("cuda parity: every op, float32") {
  if (!have_cuda()) return;
  check_parity(kFloat32, 1e-4, 1e-3);
}

TEST_CASE("cuda: copies between host, device and logical devices") {
  if (!have_cuda()) return;
  const Tensor x = arange(0, 1000, 1, {.dtype = kFloat64});
  const Tensor on_gpu = x.to(cuda(0));
  CHECK(on_gpu.device() == cuda(0));
  CHECK(on_gpu.to(cpu()).to_vector() == x.to_vector());
  if (cuda_device_count() > 1) {
    CHECK(on_gpu.to(cuda(1)).to(cpu()).to_vector() == x.to_vector());
  }
  // Same generator state, same numbers on both backends (Philox).
  manual_seed(cpu(), 9);
  manual_seed(cuda(0), 9);
  CHECK(randn({257}, {.dtype = kFloat64}).to_vector() ==
        randn({257}, {.dtype = kFloat64, .device = cuda(0)}).to_vector());
}

TEST_CASE("cuda: a host-to-device copy lets the caller reuse its buffer at once") {
  if (!have_cuda()) return;
  // Queue work first so the copies below are still in flight when the host buffer changes
  // (Note [Host-to-device copies]): each upload must hold the values the buffer had at its call.
  const Tensor busy = randn({2048, 2048}, {.device = cuda(0)});
  for (int i = 0; i < 8; ++i) (void)matmul(busy, busy);
  Tensor host = zeros({100000}, {.dtype = kFloat64});
  std::vector<Tensor> uploads;
  for (int i = 0; i < 32; ++i) {
    host.fill_(i);
    uploads.push_back(host.to(cuda(0)));
  }
  for (int i = 0; i < 32; ++i) CHECK(uploads[static_cast<size_t>(i)].sum().item() == 100000.0 * i);
  // Above the staging limit the copy is synchronous, with the same guarantee.
  Tensor big = full({int64_t{10} << 20}, 3.0, {.dtype = kFloat64});  // 80 MiB
  const Tensor big_on_gpu = big.to(cuda(0));
  big.fill_(0.0);
  CHECK(big_on_gpu.sum().item() == 3.0 * (int64_t{10} << 20));
}

TEST_CASE("cuda: an allocation failure is an ef::Error with the device's statistics") {
  if (!have_cuda()) return;
  std::string message;
  try {
    empty({int64_t{1} << 45}, {.device = cuda(0)});  // 128 TiB
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("out of memory on cuda:0") == 0);
  CHECK(zeros({4}, {.device = cuda(0)}).to_vector() == std::vector<double>(4, 0.0));
}
