// Tensors: creation, views and their shared versions, copies across dtypes and devices, the seeded
// generators, and the errors bad arguments get.
#include <doctest/doctest.h>

#include "engine/ops.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::error_of;
using evenflow::testing::vals;

TEST_CASE("creation: zeros, ones, full, arange, from_vector") {
  CHECK(vals(zeros({2, 2})) == std::vector<double>{0, 0, 0, 0});
  CHECK(vals(ones({3}, {.dtype = kFloat64})) == std::vector<double>{1, 1, 1});
  CHECK(vals(full({2}, 2.5)) == std::vector<double>{2.5, 2.5});
  CHECK(vals(arange(0, 5, 2)) == std::vector<double>{0, 2, 4});
  CHECK(arange(0, 1, 0.25).numel() == 4);
  const Tensor s = scalar_tensor(3.0);
  CHECK(s.dim() == 0);
  CHECK(s.item() == 3.0);
  const Tensor v = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, {.dtype = kFloat64});
  CHECK(v.shape() == Shape{2, 3});
  CHECK(v.strides() == Shape{3, 1});
  CHECK(vals(v) == std::vector<double>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("views share storage and version; reshape copies only when it must") {
  const Tensor x = from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor t = x.transpose(0, 1);
  CHECK(t.shape() == Shape{3, 2});
  CHECK_FALSE(t.is_contiguous());
  CHECK(vals(t) == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK(t.storage() == x.storage());
  const Tensor r = t.reshape({6});
  CHECK(r.storage() != x.storage());  // a transposed tensor cannot be viewed flat
  CHECK(vals(r) == std::vector<double>{0, 3, 1, 4, 2, 5});
  const Tensor s = x.slice(1, 0, 3, 2);
  CHECK(vals(s) == std::vector<double>{0, 2, 3, 5});
  const uint64_t before = x.version();
  s.fill_(9);
  CHECK(x.version() == before + 1);
  CHECK(vals(x) == std::vector<double>{9, 1, 9, 9, 4, 9});
  const Tensor e = from_vector({1, 2}, {2, 1}).expand({2, 3});
  CHECK(e.strides()[1] == 0);
  CHECK(vals(e) == std::vector<double>{1, 1, 1, 2, 2, 2});
  CHECK(vals(x.select(0, 1)) == std::vector<double>{9, 4, 9});
  CHECK(x.unsqueeze(0).shape() == Shape{1, 2, 3});
  CHECK(x.flatten().shape() == Shape{6});
  CHECK(x.permute({1, 0}).shape() == Shape{3, 2});
  CHECK(vals(x.narrow(1, 1, 2)) == std::vector<double>{1, 9, 4, 9});
}

TEST_CASE("shape ops: cat, stack, split, chunk, pad") {
  const Tensor a = from_vector({1, 2, 3, 4}, {2, 2});
  const Tensor b = from_vector({5, 6}, {2, 1});
  CHECK(vals(cat({a, b}, 1)) == std::vector<double>{1, 2, 5, 3, 4, 6});
  CHECK(stack({a, a}, 0).shape() == Shape{2, 2, 2});
  const auto parts = split(arange(0, 5), 2, 0);
  REQUIRE(parts.size() == 3);
  CHECK(vals(parts[2]) == std::vector<double>{4});
  CHECK(chunk(arange(0, 10), 4, 0).size() == 4);
  CHECK(vals(pad(from_vector({1, 2}, {1, 2}), {1, 0}, -1)) == std::vector<double>{-1, 1, 2});
}

TEST_CASE("dtype conversions and CPU devices") {
  const Tensor x = from_vector({1.5, -2.25}, {2}, {.dtype = kFloat64});
  CHECK(x.to(kFloat32).dtype() == kFloat32);
  CHECK(vals(x.to(kFloat32)) == std::vector<double>{1.5, -2.25});
  CHECK(x.to(kInt64).to_int_vector() == std::vector<int64_t>{1, -2});
  const Tensor y = x.to(cpu(3));
  CHECK(y.device() == cpu(3));
  CHECK(vals(y) == vals(x));
  CHECK(Device("cpu:2") == cpu(2));
  CHECK(Device("cuda:1").str() == "cuda:1");
}

TEST_CASE("random numbers: seeded per device, reproducible, sensible moments") {
  manual_seed(cpu(0), 42);
  const Tensor a = randn({1000}, {.dtype = kFloat64});
  manual_seed(cpu(0), 42);
  const Tensor b = randn({1000}, {.dtype = kFloat64});
  CHECK(vals(a) == vals(b));
  const Tensor c = randn({1000}, {.dtype = kFloat64});
  CHECK(vals(a) != vals(c));
  CHECK(mean(a).item() == doctest::Approx(0).epsilon(0.1).scale(1));
  CHECK(var(a, {}).item() == doctest::Approx(1).epsilon(0.1));
  const Tensor u = rand({10000}, {.dtype = kFloat64});
  CHECK(amax(u).item() < 1.0);
  CHECK(-amax(-u).item() >= 0.0);
  CHECK(mean(u).item() == doctest::Approx(0.5).epsilon(0.03));
  const Tensor m = bernoulli({10000}, 0.3, {.dtype = kFloat64});
  CHECK(mean(m).item() == doctest::Approx(0.3).epsilon(0.05));
  // Another device has its own generator.
  manual_seed(cpu(1), 42);
  CHECK(vals(randn({1000}, {.dtype = kFloat64, .device = cpu(1)})) == vals(a));
}

TEST_CASE("errors name the op and the values") {
  const Tensor a = zeros({2, 3});
  CHECK(error_of([&] { add(a, zeros({4})); }) ==
        "add: shapes [2, 3] and [4] cannot be broadcast together (dim 1: 3 vs 4)");
  CHECK(error_of([&] {
          add(a, zeros({2, 3}, {.dtype = kFloat64}));
        }).find("add: first input is float32 but second input is float64") == 0);
  CHECK(error_of([&] {
          add(a, zeros({2, 3}, {.device = cpu(1)}));
        }).find("add: first input is on cpu:0 but second input is on cpu:1") == 0);
  CHECK(error_of([&] {
          matmul(zeros({2, 3}), zeros({4, 2}));
        }).find("matmul: shapes [2, 3] and [4, 2] cannot be multiplied") == 0);
  CHECK(error_of([&] {
          conv2d(zeros({1, 3, 5, 5}), zeros({2, 1, 3, 3}));
        }).find("conv2d: input has 3 channels, weight expects 1") == 0);
  CHECK(error_of([&] { a.reshape({4, -1}); }).find("reshape: shape [4, -1] is invalid for 6 elements") == 0);
  CHECK(error_of([&] { a.sum({2}); }).find("sum: dim 2 is out of range") == 0);
  CHECK(error_of([&] { Device("gpu:0"); }).find("unknown device 'gpu:0'") == 0);
  CHECK(error_of([&] { zeros({1}, {.device = cpu(99)}); }).find("unknown device cpu:99") == 0);
  CHECK(error_of([&] { gather(zeros({2, 2}), 1, from_int_vector({0, 5}, {2, 1})); }).find("gather") == 0);
  CHECK(error_of([&] { zeros({2}).item(); }).find("item: expected a tensor with one element") == 0);
  if (cuda_device_count() == 0) {
    CHECK(error_of([&] {
            zeros({1}, {.device = cuda(0)});
          }).find("unknown device cuda:0: no CUDA device is available") == 0);
  }
}
