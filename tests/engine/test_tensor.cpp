// Tensors: creation, views and their shared versions, copies across dtypes and devices, the seeded
// generators, the errors bad arguments get (sizes past int64 among them), and NaN propagation.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "evenflow/engine/context_internal.h"
#include "evenflow/engine/cpu/vector_math.h"
#include "evenflow/engine/ops.h"
#include "evenflow/engine/random_internal.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using evenflow::testing::error_of;
using evenflow::testing::vals;

// The gap above |r| among float32s: r's ulp, 2^-149 for zero and subnormals.
double float32_ulp(float r) {
  return static_cast<double>(std::nextafter(std::fabs(r), INFINITY) - std::fabs(r));
}

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

TEST_CASE("add_ with alpha: the bits of mul_scalar then add, and an operand in its own memory read before written") {
  manual_seed(cpu(), 11);
  for (const DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = randn({5, 7}, {.dtype = dtype}), y = randn({7}, {.dtype = dtype});
    for (const double alpha : {1.0, -0.1, 0.3}) {
      CAPTURE(alpha);
      const Tensor got = x.clone();
      got.add_(y, alpha);  // y broadcast over the rows: one kernel (AddScaled)
      CHECK(vals(got) == vals(add(x, mul_scalar(y, alpha))));
      // A row of `inplace` broadcast over it: every row gets the row's value from before.
      const Tensor inplace = x.clone();
      inplace.add_(select(inplace, 0, 2), alpha);
      CHECK(vals(inplace) == vals(add(x, mul_scalar(select(x, 0, 2), alpha))));
      const Tensor self = x.clone();  // itself, element for element
      self.add_(self, alpha);
      CHECK(vals(self) == vals(add(x, mul_scalar(x, alpha))));
    }
  }
}

TEST_CASE("add_ of a number: add_scalar's bits in place, an int64 counter incremented, bad input refused") {
  manual_seed(cpu(), 12);
  for (const DType dtype : {kFloat32, kFloat64}) {
    CAPTURE(dtype_name(dtype));
    const Tensor x = randn({5, 7}, {.dtype = dtype});
    const Tensor got = x.clone();
    CHECK(&got.add_(-0.3) == &got);
    CHECK(vals(got) == vals(add_scalar(x, -0.3)));
    const Tensor column = x.clone();  // a strided view: only its elements change
    column.select(1, 2).add_(0.5);
    const Tensor want = x.clone();
    want.select(1, 2).copy_(add_scalar(x.select(1, 2), 0.5));
    CHECK(vals(column) == vals(want));
  }
  // Batch norm's num_batches_tracked: exact past float32's 2^24 and float64's 2^53, wrapping at the top.
  const Tensor count = full({}, 0x1p53, {.dtype = kInt64});
  count.add_(1.0);
  CHECK(count.to_int_vector() == std::vector<int64_t>{(int64_t{1} << 53) + 1});
  count.add_(-3.0);
  CHECK(count.to_int_vector() == std::vector<int64_t>{(int64_t{1} << 53) - 2});
  const Tensor top = full({2}, 0.0, {.dtype = kInt64});
  top.fill_(0x1p62).add_(0x1p62).add_(0x1p62);  // 3·2^62 wraps to -2^62, as PyTorch's integer add
  CHECK(top.to_int_vector() == std::vector<int64_t>{-(int64_t{1} << 62), -(int64_t{1} << 62)});
  CHECK(error_of([&] { count.add_(0.5); }) == "add_: 0.5 is not an integer to add to an int64 tensor");
  // Other in-place scalar ops and unary ops on int64 still name the dtype (the backends' int64 path
  // is AddScalar's alone).
  CHECK(error_of([&] { count.mul_(2.0); }) == "mul_: input must be float32 or float64, got int64");
  CHECK(error_of([&] { (void)sign(count); }).find("int64 is not supported") != std::string::npos);
  CHECK(error_of([&] { count.add_(0x1p63); }).find("is not an integer to add to an int64 tensor") != std::string::npos);
  Tensor leaf = zeros({3});
  leaf.requires_grad_();
  CHECK(error_of([&] { leaf.add_(1.0); }).find("add_: ") == 0);
  {
    NoGradGuard no_grad;
    leaf.add_(2.0);
  }
  CHECK(vals(leaf) == std::vector<double>{2, 2, 2});
}

TEST_CASE("copy_: a source in the destination's memory read before written; copies past the streaming size exact") {
  // Shifted by one element: each element gets its left neighbour's value from before.
  const Tensor shifted = arange(0, 10);
  shifted.narrow(0, 1, 9).copy_(shifted.narrow(0, 0, 9));
  CHECK(vals(shifted) == std::vector<double>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  // The same down a column (a strided walk, element by element).
  const Tensor column = arange(0, 10).reshape({5, 2});
  column.select(1, 0).narrow(0, 1, 4).copy_(column.select(1, 0).narrow(0, 0, 4));
  CHECK(vals(column) == std::vector<double>{0, 1, 0, 3, 2, 5, 4, 7, 6, 9});
  const Tensor back = arange(0, 10);
  back.narrow(0, 0, 9).copy_(back.narrow(0, 1, 9));
  CHECK(vals(back) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 9});
  // A row broadcast over its own tensor: every row gets row 1 from before.
  const Tensor rows = arange(0, 6).reshape({3, 2});
  rows.copy_(rows.select(0, 1));
  CHECK(vals(rows) == std::vector<double>{2, 3, 2, 3, 2, 3});
  const Tensor self = arange(0, 4);
  self.copy_(self);
  CHECK(vals(self) == std::vector<double>{0, 1, 2, 3});

  // Past 16 MiB the CPU streams the output (Note [Streaming stores]): whole, by rows of a slice
  // (each row's start unaligned), from a broadcast row, and of bfloat16.
  manual_seed(cpu(), 5);
  const Tensor big = randn({1100, 4097});  // 18 MB of float32
  CHECK(vals(big.clone()) == vals(big));
  const Tensor part = big.narrow(1, 1, 4095);
  const Tensor part_copy = part.contiguous();
  CHECK(vals(part_copy) == vals(part));
  CHECK(part_copy.select(0, 7).to_vector() == part.select(0, 7).to_vector());
  const Tensor row = big.select(0, 3);
  const Tensor filled = empty({1100, 4097});
  filled.copy_(row);
  CHECK(filled.select(0, 1099).to_vector() == row.to_vector());
  CHECK(vals(filled) == vals(row.expand({1100, 4097})));
  const Tensor halves = randn({2100, 4097}).to(kBFloat16);  // 17 MB of bfloat16
  CHECK(vals(halves.clone()) == vals(halves));
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

// Note [Vectorized draws] in engine/cpu/cpu_elementwise.cpp: the CPU backend fills each kind in loops
// of its own, a normal draw in blocks of 256 from the start of each thread's range, on one thread
// and on a team of three, at counters whose 32-bit halves carry. Uniform and Bernoulli draws must be
// random::sample's (seed, offset + i) to the last bit, in float32 and float64. Normal draws take
// our log and cosine (Note [Vectorized log and cos]) where sample() takes glibc's: a draw
// a + b·R·cos θ (radius R = √(-2 log u)) within 2^-52·(|a| + 8·|b|·R) of it in float64, over a
// million values too (the log's 2 ulp in R, the cosine's 2.9·2^-52, the roundings); in float32, at
// most one float32 ulp off.
TEST_CASE("random draws: every element is random::sample's, normal ones to float64 rounding, on 1 and 3 threads") {
  Backend& cpu_kernels = context(cpu(0)).backend();
  const int threads_before = num_threads();
  for (const int threads : {1, 3}) {
    set_num_threads(threads);
    // This thread draws with a team of `threads`, unless a CPU device's worker has started in this
    // process (a whole-suite run; ctest runs each case on its own): then alone (Note [One OpenMP
    // team per core]).
    CHECK((kernel_threads() == threads || cpu_workers_started()));
    for (const RandomKind kind : {RandomKind::Uniform, RandomKind::Normal, RandomKind::Bernoulli}) {
      for (const DType dtype : {kFloat32, kFloat64}) {
        // 4000 x 32 > kParallelGrain (cpu_internal.h): a team draws it.
        const int64_t n = kind == RandomKind::Normal && dtype == kFloat64 ? int64_t{1} << 20 : 4000;
        const uint64_t seed = 0x0123456789abcdefULL, offset = 0xffffff00ULL;
        const double a = kind == RandomKind::Bernoulli ? 0.3 : -1.5, b = 2.5;
        Tensor t = empty({n}, {.dtype = dtype});
        cpu_kernels.random(t.view(), kind, a, b, RandomKey{.seed = seed, .offset = offset});
        const std::vector<double> got = vals(t);
        int64_t off = 0;  // elements outside the tolerance
        for (int64_t i = 0; i < n; ++i) {
          const double want = random::sample(static_cast<int>(kind), a, b, seed, offset + static_cast<uint64_t>(i));
          const double value = got[static_cast<size_t>(i)];
          if (kind != RandomKind::Normal) {
            off += value != (dtype == kFloat32 ? static_cast<double>(static_cast<float>(want)) : want);
          } else if (dtype == kFloat64) {
            const random::Philox4 r = random::philox(seed, offset + static_cast<uint64_t>(i));
            const double radius = std::sqrt(-2.0 * std::log(random::uniform01(r.v[0], r.v[1])));
            off += !(std::abs(value - want) <= 0x1p-52 * (std::abs(a) + 8.0 * b * radius));
          } else {
            const auto rounded = static_cast<float>(want);
            off += !(std::abs(value - rounded) <= float32_ulp(rounded));
          }
        }
        const std::string what = std::to_string(threads) + " threads, kind " + std::to_string(static_cast<int>(kind)) +
                                 ", " + dtype_name(dtype);
        CAPTURE(what);
        CHECK(off == 0);
      }
    }
  }
  set_num_threads(threads_before);
}

// Note [Vectorized log and cos] (engine/cpu/vector_math.h): the normal draws' log(u) and cos(2πu)
// against glibc's log(u) and cos(2π·u), over a million u of the draws' kind (multiples of 2^-53 in
// (0, 1]) and every power of two down to 2^-53: measured 2.0 ulp and 2.875·2^-52 at worst; 2.5 and
// 3.5 allowed (another compiler may round a step differently).
TEST_CASE("the normal draws' log and cos: within 2.5 ulp and 3.5 * 2^-52 of glibc's") {
  std::mt19937_64 rng(3);
  double worst_log = 0, worst_cos = 0;
  const auto check = [&](double u) {
    const double log_u = std::log(u);
    if (log_u != 0)
      worst_log = std::max(
          worst_log, std::abs(cpu_backend::log_vectorizable(u) - log_u) / std::abs(std::nextafter(log_u, 0.0) - log_u));
    worst_cos = std::max(worst_cos,
                         std::abs(cpu_backend::cos_two_pi_vectorizable(u) - std::cos(6.283185307179586 * u)) / 0x1p-52);
  };
  for (int i = 0; i < 1000000; ++i) check((static_cast<double>(rng() >> 11) + 1.0) * 0x1p-53);
  for (int k = 0; k <= 53; ++k) check(std::ldexp(1.0, -k));
  CAPTURE(worst_log);
  CAPTURE(worst_cos);
  CHECK(worst_log <= 2.5);
  CHECK(worst_cos <= 3.5);
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
  CHECK(error_of([&] {
          batch_norm(zeros({4, 0, 3}), {}, {}, {}, {}, true);
        }) == "batch_norm: input shape [4, 0, 3] has no channels");
  CHECK(error_of([&] {
          from_int_vector({5}, {1}).add_(from_int_vector({3}, {1}), 0.5);
        }).find("add_ with alpha other than 1: ") == 0);
  if (cuda_device_count() == 0) {
    CHECK(error_of([&] {
            zeros({1}, {.device = cuda(0)});
          }).find("unknown device cuda:0: no CUDA device is available") == 0);
  }
}

TEST_CASE("sizes past int64 are errors naming the shape (Note [Checked sizes])") {
  const int64_t big = int64_t{1} << 32;  // big·big = 2^64 wraps to 0 unchecked
  const auto elements = [](const std::string& op, const std::string& shape) {
    return op + ": shape " + shape + " has more elements than int64 can hold";
  };
  CHECK(error_of([&] { empty({big, big}); }) == elements("empty", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { zeros({int64_t{1} << 62, 4}); }) == elements("zeros", "[4611686018427387904, 4]"));
  CHECK(error_of([&] { ones({big, big + 1}); }) == elements("ones", "[4294967296, 4294967297]"));
  CHECK(error_of([&] { full({3, big, big}, 1.0); }) == elements("full", "[3, 4294967296, 4294967296]"));
  CHECK(error_of([&] { rand({big, big}); }) == elements("rand", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { randn({big, big}); }) == elements("randn", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { uniform({big, big}, 0, 1); }) == elements("uniform", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { bernoulli({big, big}, 0.5); }) == elements("bernoulli", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { from_vector({}, {big, big}); }) == elements("from_vector", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { from_int_vector({}, {big, big}); }) == elements("from_int_vector", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { arange(0, 1e30); }) == "arange: [0, 1e+30) in steps of 1 has more elements than int64 can hold");
  // Zero-size dims hold no elements, but the strides of the others must still fit.
  CHECK(error_of([&] { empty({0, big, big}); }).find(elements("empty", "[0, 4294967296, 4294967296]")) == 0);
  CHECK(empty({0, big}).numel() == 0);
  // Negative dims.
  CHECK(error_of([&] { full({2, -3}, 1.0); }) == "full: negative dimension in shape [2, -3]");
  CHECK(error_of([&] { randn({-1}); }) == "randn: negative dimension in shape [-1]");
  // The byte count: 2^61 float64 elements are 2^64 bytes; 2^61 bytes of int64 are fine to ask for.
  CHECK(error_of([&] { empty({int64_t{1} << 61}, {.dtype = kFloat64}); }) ==
        "empty: shape [2305843009213693952] of float64 has more bytes than int64 can hold (8 bytes per element)");
  CHECK(error_of([&] {
          zeros({int64_t{1} << 31, int64_t{1} << 31});
        }) ==
        "zeros: shape [2147483648, 2147483648] of float32 has more bytes than int64 can hold (4 bytes per element)");
  // Views compute shapes of their own.
  const Tensor none = empty({0});
  CHECK(error_of([&] { none.reshape({big, big}); }) == elements("reshape", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { none.view({big, big, 0}); }).find(elements("view", "[4294967296, 4294967296, 0]")) == 0);
  CHECK(error_of([&] { none.reshape({big, big, -1}); }) == elements("reshape", "[4294967296, 4294967296, -1]"));
  const Tensor one = ones({1, 1});
  CHECK(error_of([&] { one.expand({big, big}); }) == elements("expand", "[4294967296, 4294967296]"));
  CHECK(error_of([&] { one.expand({-5, 1}); }) == "expand: negative dimension in shape [-5, 1]");
  CHECK(one.expand({big, 1}).numel() == big);  // large views are fine: they allocate nothing
  const Tensor half = one.reshape({1}).expand({int64_t{1} << 62});
  CHECK(error_of([&] {
          cat({half, half}, 0);
        }) ==
        "cat: the sizes along dim 0 add up to more than int64 can hold (at tensors[1] of shape [4611686018427387904])");
  // The allocator refuses what no int64 byte offset can address (rounding it up would overflow).
  size_t block = 0;
  CHECK(error_of([&] { context(cpu()).allocator().allocate(SIZE_MAX, &block); }) ==
        "out of memory on cpu:0: 18446744073709551615 bytes requested, more than int64 can hold");
}

namespace {

// Element-wise equality where NaN equals NaN and numbers agree to a relative 1e-6 (float32 too).
std::string nan_aware_mismatch(const Tensor& got, const std::vector<double>& want) {
  const std::vector<double> g = got.to_vector();
  if (g.size() != want.size()) return std::to_string(g.size()) + " values, expected " + std::to_string(want.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same =
        std::isnan(want[i]) ? std::isnan(g[i]) : std::abs(g[i] - want[i]) <= 1e-6 * (1 + std::abs(want[i]));
    if (!same)
      return "element " + std::to_string(i) + ": " + std::to_string(g[i]) + ", expected " + std::to_string(want[i]);
  }
  return "";
}

#define EF_CHECK_VALUES(got, ...)                                                          \
  do {                                                                                     \
    const std::string mismatch = nan_aware_mismatch(got, std::vector<double> __VA_ARGS__); \
    CHECK_MESSAGE(mismatch.empty(), #got ": " << mismatch);                                \
  } while (0)

// Note [NaN propagation] and Note [NaN in backward masks], checked on one device and dtype against
// what PyTorch gives.
void check_nan_rules(const Device& device, DType dtype) {
  CAPTURE(device.str());
  CAPTURE(dtype_name(dtype));
  const double nan = std::nan(""), e = std::exp(-1.0);
  const TensorOptions o{.dtype = dtype, .device = device};
  const auto leaf = [&](const std::vector<double>& v) {
    return from_vector(v, {static_cast<int64_t>(v.size())}, {.dtype = dtype, .device = device, .requires_grad = true});
  };
  const auto vec = [&](const std::vector<double>& v) { return from_vector(v, {static_cast<int64_t>(v.size())}, o); };
  // d/dx of sum(g·f(x)), one input
  const auto grad1 = [](const Tensor& y, const Tensor& x, const Tensor& g) { return grad({y}, {x}, {g})[0]; };

  {  // relu: PyTorch's threshold_backward selects (x <= 0 ? 0 : g): NaN x passes g, a NaN g at x < 0 gives 0
    const Tensor x = leaf({nan, -1, 2, -3});
    const Tensor y = relu(x);
    EF_CHECK_VALUES(y, {nan, 0, 2, 0});
    EF_CHECK_VALUES(grad1(y, x, vec({1, 1, 1, nan})), {1, 0, 1, 0});
  }
  {  // leaky_relu: x > 0 ? g : slope·g
    const Tensor x = leaf({nan, -1, 2});
    const Tensor y = leaky_relu(x, 0.1);
    EF_CHECK_VALUES(y, {nan, -0.1, 2});
    EF_CHECK_VALUES(grad1(y, x, vec({1, 1, 1})), {0.1, 0.1, 1});
  }
  {  // elu: x <= 0 ? g·α·exp(x) : g; a large x must not give inf·0
    const Tensor x = leaf({nan, -1, 2, 1000});
    const Tensor y = elu(x, 1.0);
    EF_CHECK_VALUES(y, {nan, e - 1, 2, 1000});
    EF_CHECK_VALUES(grad1(y, x, vec({1, 1, 1, 1})), {1, e, 1, 1});
  }
  {  // softplus: NaN in, NaN out and NaN gradient (g·σ(NaN)), as in PyTorch
    const Tensor x = leaf({nan, -1, 30});
    const Tensor y = softplus(x);
    EF_CHECK_VALUES(y, {nan, std::log1p(e), 30});
    EF_CHECK_VALUES(grad1(y, x, vec({1, 1, 1})), {nan, e / (1 + e), 1});
  }
  {  // clamp: where(lo <= x <= hi, g, 0)
    const Tensor x = leaf({nan, -1, 0.25, 3});
    const Tensor y = clamp(x, -0.5, 0.5);
    EF_CHECK_VALUES(y, {nan, -0.5, 0.25, 0.5});
    EF_CHECK_VALUES(grad1(y, x, vec({1, nan, 1, 1})), {0, 0, 1, 0});
  }
  {  // maximum / minimum: NaN if either is; the loser gets 0 (even for a NaN g), a tie halves g,
     // and both get g where either is NaN
    const Tensor a = leaf({nan, 1, 3, 0}), b = leaf({2, nan, 3, 5});
    const Tensor g = vec({1, 1, 1, nan});
    const Tensor hi = maximum(a, b);
    EF_CHECK_VALUES(hi, {nan, nan, 3, 5});
    const std::vector<Tensor> ghi = grad({hi}, {a, b}, {g});
    EF_CHECK_VALUES(ghi[0], {1, 1, 0.5, 0});
    EF_CHECK_VALUES(ghi[1], {1, 1, 0.5, nan});
    const Tensor lo = minimum(a, b);
    EF_CHECK_VALUES(lo, {nan, nan, 3, 0});
    const std::vector<Tensor> glo = grad({lo}, {a, b}, {g});
    EF_CHECK_VALUES(glo[0], {1, 1, 0.5, nan});
    EF_CHECK_VALUES(glo[1], {1, 1, 0.5, 0});
  }
  {  // max_pool2d: a window holding a NaN gives NaN, and the gradient goes to the NaN
    const Tensor x = from_vector({1, nan, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 4},
                                 {.dtype = dtype, .device = device, .requires_grad = true});
    const Tensor y = max_pool2d(x, {.kernel = {2, 2}});
    EF_CHECK_VALUES(y, {nan, 8});
    EF_CHECK_VALUES(grad1(y, x, ones_like(y)), {0, 1, 0, 0, 0, 0, 0, 1});
  }
  {  // max / argmax / argmin / amax along a dim holding a NaN: NaN, at the NaN's index
    const Tensor x = leaf({1, nan, -3, 4});
    const auto [values, index] = max(x, 0);
    EF_CHECK_VALUES(values, {nan});
    CHECK(index.to_int_vector() == std::vector<int64_t>{1});
    CHECK(argmax(x, 0).to_int_vector() == std::vector<int64_t>{1});
    CHECK(argmin(x, 0).to_int_vector() == std::vector<int64_t>{1});
    EF_CHECK_VALUES(amax(x), {nan});
    EF_CHECK_VALUES(grad1(values, x, ones_like(values)), {0, 1, 0, 0});
    EF_CHECK_VALUES(softmax(reshape(x, {1, 4}), 1), {nan, nan, nan, nan});
  }
}

#undef EF_CHECK_VALUES

}  // namespace

TEST_CASE("NaN propagates as in PyTorch (activations clamp maximum minimum max_pool2d max): CPU") {
  for (DType dtype : {kFloat32, kFloat64}) check_nan_rules(cpu(), dtype);
}

TEST_CASE("NaN propagates as in PyTorch (activations clamp maximum minimum max_pool2d max): CUDA") {
  if (!evenflow::testing::cuda_devices_available()) return;
  for (DType dtype : {kFloat32, kFloat64}) check_nan_rules(cuda(0), dtype);
}

TEST_CASE("size(d) of a 0-d tensor is an error, not a read past its shape") {
  CHECK(error_of([] { scalar_tensor(1.0).size(0); }) == "size: a 0-d tensor has no dim 0");
  CHECK(error_of([] { scalar_tensor(1.0).size(-1); }) == "size: a 0-d tensor has no dim -1");
}

// Note [Vectorized tanh] (engine/cpu/vector_math.h): float32 tanh on the CPU is our own polynomial
// and exponential, not glibc's; over a spread of every float32 magnitude up to 12 (every 997th bit
// pattern, both signs) it stays within 1.5 ulp of tanh in float64 (a full sweep measured 1.37), the
// same in the contiguous and the strided loop, with NaN, infinities and signed zeros as tanh has
// them.
TEST_CASE("tanh of float32 on the CPU: within 1.5 ulp of the exact value, special values kept") {
  std::vector<double> xs;
  for (uint32_t bits = 0; std::bit_cast<float>(bits) <= 12.0f; bits += 997) {
    xs.push_back(std::bit_cast<float>(bits));
    xs.push_back(-std::bit_cast<float>(bits));
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  const Tensor x = from_vector(xs, {n}, {.dtype = kFloat32});
  const std::vector<double> y = tanh(x).to_vector();
  // Strided: the kernel's general loop over the same values, [n/2, 2] read as its transpose.
  const std::vector<double> y_strided = tanh(reshape(x, {n / 2, 2}).t()).to_vector();
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::tanh(xs[static_cast<size_t>(i)]);
    const float rounded = static_cast<float>(want);
    const double ulp = float32_ulp(rounded);
    worst = std::max(worst, std::fabs(y[static_cast<size_t>(i)] - want) / ulp);
    CHECK(y_strided[static_cast<size_t>((i % 2) * (n / 2) + i / 2)] == y[static_cast<size_t>(i)]);
  }
  CAPTURE(worst);
  CHECK(worst <= 1.5);
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> special =
      tanh(
          from_vector({std::nan(""), inf, -inf, 0.0, -0.0, 1e-30, -1e-30, 9.5, -20.0, 1e30}, {10}, {.dtype = kFloat32}))
          .to_vector();
  CHECK(std::isnan(special[0]));
  CHECK(special[1] == 1.0);
  CHECK(special[2] == -1.0);
  CHECK((special[3] == 0.0 && !std::signbit(special[3])));
  CHECK((special[4] == 0.0 && std::signbit(special[4])));
  CHECK(special[5] == static_cast<double>(1e-30f));
  CHECK(special[6] == -static_cast<double>(1e-30f));
  CHECK(special[7] == 1.0);
  CHECK(special[8] == -1.0);
  CHECK(special[9] == 1.0);
}

// Note [CPU argmax] (engine/cpu/cpu_reduce.cpp): its lanes, row parts and position blocks take the
// element a walk from the start takes -- the first of equal values, the first NaN -- in every
// layout: values of a few levels (so ties are everywhere), NaNs in some rows, float32 and float64,
// 1 to 3 threads (a long row split in parts), contiguous and transposed input; and amax's value (the
// Max reduction of the whole tensor) and gradient.
TEST_CASE("argmax, argmin and amax: the first best element, in every layout and thread count") {
  std::mt19937 rng(7);
  const int threads_before = num_threads();
  const struct {
    Shape shape;
    bool nans;
  } cases[] = {{{37}, false},           {{37}, true},        {{1000003}, false},     {{1000003}, true},
               {{3, 70001}, true},      {{5000, 10}, false}, {{4, 5, 300, 7}, true}, {{2, 21, 64, 64}, false},
               {{2, 21, 64, 64}, true}, {{9, 1, 40}, false}};
  for (const auto& c : cases)
    for (const DType dtype : {kFloat32, kFloat64}) {
      int64_t n = 1;
      for (const int64_t d : c.shape) n *= d;
      std::vector<double> v(static_cast<size_t>(n));
      std::uniform_int_distribution<int> level(-3, 3);
      for (double& e : v) e = level(rng) * 0.5;
      if (c.nans)
        for (int64_t k = 0; k < n / 997 + 1; ++k)
          v[static_cast<size_t>(std::uniform_int_distribution<int64_t>(0, n - 1)(rng))] = std::nan("");
      const Tensor x = from_vector(v, c.shape, {.dtype = dtype});
      for (int threads = 1; threads <= 3; ++threads) {
        set_num_threads(threads);
        for (int64_t dim = 0; dim < static_cast<int64_t>(c.shape.size()); ++dim)
          for (const bool is_max : {true, false}) {
            const Shape sh = c.shape;
            int64_t outer = 1, inner = 1;
            for (int64_t d = 0; d < dim; ++d) outer *= sh[static_cast<size_t>(d)];
            for (size_t d = static_cast<size_t>(dim) + 1; d < sh.size(); ++d) inner *= sh[d];
            const int64_t len = sh[static_cast<size_t>(dim)];
            std::vector<int64_t> want(static_cast<size_t>(outer * inner));
            for (int64_t o = 0; o < outer; ++o)
              for (int64_t i = 0; i < inner; ++i) {
                const auto at = [&](int64_t k) { return v[static_cast<size_t>((o * len + k) * inner + i)]; };
                int64_t best = 0;
                for (int64_t k = 1; k < len && !std::isnan(at(best)); ++k)
                  if (std::isnan(at(k)) || (is_max ? at(k) > at(best) : at(k) < at(best))) best = k;
                want[static_cast<size_t>(o * inner + i)] = best;
              }
            CAPTURE(sh);
            CAPTURE(dim);
            CAPTURE(is_max);
            CAPTURE(threads);
            const std::vector<int64_t> got = (is_max ? argmax(x, dim) : argmin(x, dim)).to_int_vector();
            CHECK(got == want);
            if (sh.size() == 2) {  // the transposed copy, read in place: the strided walk
              const Tensor xt = transpose(transpose(x, 0, 1).contiguous(), 0, 1);
              CHECK((is_max ? argmax(xt, dim) : argmin(xt, dim)).to_int_vector() == want);
            }
          }
      }
      // amax: the Max reduction's lanes (NaN if any element is), its gradient to the first largest.
      for (int threads = 1; threads <= 3; ++threads) {
        set_num_threads(threads);
        const Tensor xg = x.detach().requires_grad_();
        const Tensor m = amax(xg);
        CAPTURE(threads);
        if (c.nans) {
          CHECK(std::isnan(m.item()));
          continue;
        }
        const auto largest = std::max_element(v.begin(), v.end());
        CHECK(m.item() == *largest);
        const std::vector<double> g = grad({m}, {xg}, {ones_like(m)})[0].to_vector();
        CHECK(std::count(g.begin(), g.end(), 1.0) == 1);
        CHECK(g[static_cast<size_t>(largest - v.begin())] == 1.0);
      }
    }
  // Equal zeros and NaNs differ in their bits: amax gives the first one, whatever the lanes and
  // threads (the review's case: +0 at 1 and -0 at 20032 gave -0 on one thread, +0 on two).
  for (const bool plus_first : {true, false})
    for (int threads = 1; threads <= 3; ++threads) {
      set_num_threads(threads);
      std::vector<double> v(40000, -1.0);
      v[1] = plus_first ? 0.0 : -0.0;
      v[20032] = plus_first ? -0.0 : 0.0;
      const double m = amax(from_vector(v, {40000}, {.dtype = kFloat32})).item();
      CAPTURE(threads);
      CHECK((m == 0.0 && std::signbit(m) == !plus_first));
      std::vector<double> w(200, 1.0);
      w[7] = -std::nan("");
      w[100] = std::nan("");
      CHECK(std::signbit(amax(from_vector(w, {200}, {.dtype = kFloat64})).item()));
    }
  set_num_threads(threads_before);
  {  // amax keeps argmax's index, not x: x may change in place before the backward
    const Tensor x = from_vector({1, 5, 3}, {3}, {.dtype = kFloat64, .requires_grad = true});
    const Tensor m = amax(x);
    {
      NoGradGuard no_grad;
      x.mul_(2.0);
    }
    CHECK(grad({m}, {x}, {ones_like(m)})[0].to_vector() == std::vector<double>{0, 1, 0});
  }
}

// Note [Vectorized float32 exp, log, sigmoid, softplus and elu] (engine/cpu/vector_math.h): our
// own functions against the same functions in float64 (long double where float64's own would
// cancel): over a spread of float32 values (every 4099th bit pattern of each sign, so every binade,
// subnormals included) within 1 ulp (the Note gives what each path measured), the contiguous and
// the strided loop alike, and the special values.
// log(1 + e^t) without overflow, for the references.
long double log1p_exp(long double t) {
  return (t > 0 ? t : 0) + std::log1p(std::exp(-std::fabs(t)));
}

TEST_CASE("float32 exp, log, sigmoid, softplus, elu and erf on the CPU: within 1 ulp, special values kept") {
  std::vector<double> xs;
  for (uint32_t bits = 0; bits < 0x7F800000u; bits += 4099) {
    xs.push_back(std::bit_cast<float>(bits));
    xs.push_back(-std::bit_cast<float>(bits));
  }
  // Every float32 within 2^12 of ±asinh(1), where e^-|x| = √2 - 1 and the float32 softplus changes
  // its reduction (k = 0 to 1).
  const auto switch_bits = std::bit_cast<uint32_t>(static_cast<float>(std::asinh(1.0)));
  for (uint32_t bits = switch_bits - 4096; bits <= switch_bits + 4096; ++bits) {
    xs.push_back(std::bit_cast<float>(bits));
    xs.push_back(-std::bit_cast<float>(bits));
  }
  // The worst cases of sigmoid and softplus over every float32 (exhaustive sweeps): normal results
  // (sigmoid's at -5.198, softplus's at -26.684), a subnormal one, one between 2^-126 and 2^-100.
  for (const float worst_case : {0x1.4cb22cp+2f, 0x1.aaf346p+4f, 0x1.5e9f7ap+6f, 0x1.5966fcp+6f}) {
    xs.push_back(worst_case);
    xs.push_back(-worst_case);
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  const Tensor x = from_vector(xs, {n}, {.dtype = kFloat32});
  struct Function {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<long double(long double)> exact;
    double within = 1.0, within_tiny = 1.0;  // ulp, for results of at least 2^-100 and below it
  };
  const std::vector<Function> functions = {
      {"exp", [](const Tensor& t) { return exp(t); }, [](long double v) { return std::exp(v); }},
      {"log", [](const Tensor& t) { return log(t); }, [](long double v) { return std::log(v); }},
      // sigmoid and softplus with beta 1 in float32 where the copy has FMA (the Note's bounds, over
      // every float32): 0.7240 and 0.6708 ulp, and below 2^-100 0.7650 and 0.7717, where the last
      // scaling rounds again.
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); },
       [](long double v) { return v >= 0 ? 1 / (1 + std::exp(-v)) : std::exp(v) / (1 + std::exp(v)); }, 0.7240, 0.7650},
      {"softplus", [](const Tensor& t) { return softplus(t, 1.0, 20.0); },
       [](long double v) { return v > 20 ? v : log1p_exp(v); }, 0.6708, 0.7717},
      {"softplus, threshold 1000", [](const Tensor& t) { return softplus(t, 1.0, 1000.0); },
       [](long double v) { return v > 1000 ? v : log1p_exp(v); }, 0.6708, 0.7717},
      {"softplus, beta 2 and threshold 5", [](const Tensor& t) { return softplus(t, 2.0, 5.0); },
       [](long double v) { return 2 * v > 5 ? v : log1p_exp(2 * v) / 2; }},
      // Past exp's range below the threshold, and betas that are not powers of two (beta·x rounds
      // to float32 first, as the op computes it).
      {"softplus, beta 0.3 and threshold 1000", [](const Tensor& t) { return softplus(t, 0.3, 1000.0); },
       [](long double v) {
         const float bx = 0.3f * static_cast<float>(v);
         return bx > 1000.0f ? v : log1p_exp(bx) / static_cast<long double>(0.3f);
       }},
      {"softplus, beta 1e-6", [](const Tensor& t) { return softplus(t, 1e-6, 20.0); },
       [](long double v) {
         const float bx = 1e-6f * static_cast<float>(v);
         return bx > 20.0f ? v : log1p_exp(bx) / static_cast<long double>(1e-6f);
       }},
      {"elu", [](const Tensor& t) { return elu(t, 1.5); },
       [](long double v) { return v > 0 ? v : 1.5L * std::expm1(v); }},
      // float32 erf in float32 where the kernel copy has FMA: 0.7951 over every float32.
      {"erf", [](const Tensor& t) { return erf(t); }, [](long double v) { return std::erf(v); }, 0.7951, 0.7951},
  };
  for (const Function& f : functions) {
    const std::string name = f.name;
    CAPTURE(name);
    const std::vector<double> y = f.op(x).to_vector();
    // Strided: the kernel's general loop over the same values, [n/2, 2] read as its transpose.
    const std::vector<double> y_strided = f.op(reshape(x, {n / 2, 2}).t()).to_vector();
    double worst = 0, worst_tiny = 0;  // results of at least 2^-100, and below
    int64_t mismatched_strided = 0;
    for (int64_t i = 0; i < n; ++i) {
      const long double want = f.exact(xs[static_cast<size_t>(i)]);
      const double got = y[static_cast<size_t>(i)];
      mismatched_strided += !(y_strided[static_cast<size_t>((i % 2) * (n / 2) + i / 2)] == got || std::isnan(got));
      if (std::isnan(static_cast<double>(want))) {
        CHECK(std::isnan(got));
        continue;
      }
      const auto rounded = static_cast<float>(want);
      if (std::isinf(rounded)) {
        CHECK(got == static_cast<double>(rounded));
        continue;
      }
      const double error = static_cast<double>(std::fabs(static_cast<long double>(got) - want)) / float32_ulp(rounded);
      double& worst_here = std::fabs(rounded) >= 0x1p-100f ? worst : worst_tiny;
      worst_here = std::max(worst_here, error);
    }
    CAPTURE(worst);
    CAPTURE(worst_tiny);
    CHECK(worst <= f.within);
    CHECK(worst_tiny <= f.within_tiny);
    CHECK(mismatched_strided == 0);
  }
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor special = from_vector({std::nan(""), inf, -inf, 0.0, -0.0}, {5}, {.dtype = kFloat32});
  const std::vector<double> e = exp(special).to_vector(), l = log(special).to_vector(),
                            s = sigmoid(special).to_vector(), p = softplus(special, 1.0, 20.0).to_vector(),
                            u = elu(special, 1.0).to_vector(), f = erf(special).to_vector();
  CHECK(std::isnan(e[0]));
  CHECK((e[1] == inf && e[2] == 0.0 && e[3] == 1.0 && e[4] == 1.0));
  CHECK(std::isnan(l[0]));
  CHECK((l[1] == inf && std::isnan(l[2]) && l[3] == -inf && l[4] == -inf));
  CHECK(std::isnan(s[0]));
  CHECK((s[1] == 1.0 && s[2] == 0.0 && s[3] == 0.5 && s[4] == 0.5));
  CHECK(std::isnan(p[0]));
  CHECK((p[1] == inf && p[2] == 0.0 && p[3] == static_cast<double>(static_cast<float>(std::log(2.0)))));
  CHECK(std::isnan(u[0]));
  CHECK((u[1] == inf && u[2] == -1.0 && u[3] == 0.0 && !std::signbit(u[3])));
  CHECK((u[4] == 0.0 && std::signbit(u[4])));  // expm1(-0) = -0, as PyTorch's elu
  CHECK(p[4] == p[3]);
  const std::vector<double> p_no_threshold = softplus(special, 1.0, inf).to_vector();  // inf + log1p(0)
  CHECK((std::isnan(p_no_threshold[0]) && p_no_threshold[1] == inf && p_no_threshold[2] == 0.0));
  CHECK((p_no_threshold[3] == p[3] && p_no_threshold[4] == p[3]));
  CHECK(std::isnan(f[0]));
  CHECK((f[1] == 1.0 && f[2] == -1.0 && f[3] == 0.0 && !std::signbit(f[3]) && std::signbit(f[4])));
}

// Softmax over a dim that is not the last (Backend::softmax_dim1 on the CPU: the dim's elements of
// each inner position side by side) against the same dim moved last (softmax's rows): equal to
// float64 rounding in float64, within 2e-7 relative in float32 (the same e^x, summed in another
// order, then rounded; log-softmax's x - log-sum-exp relative to 1 + |x|, the size of its terms), over every dim of a
// 4-d tensor, several blocks of positions with a partial last one, a channels-last input, and a NaN that poisons its
// own position only.
TEST_CASE("softmax and log_softmax over a dim before the last: the same as with it moved last") {
  manual_seed(5);
  for (const DType dtype : {kFloat64, kFloat32}) {
    const std::string type = dtype_name(dtype);
    CAPTURE(type);
    const double tol = dtype == kFloat64 ? 1e-14 : 2e-7;
    const auto moved_last = [](const Tensor& t, int64_t d, bool log) {
      const int64_t last = t.dim() - 1;
      const Tensor moved = transpose(t, d, last).contiguous();
      return transpose(log ? log_softmax(moved, last) : softmax(moved, last), d, last);
    };
    for (const Shape& shape : {Shape{2, 5, 3, 7}, Shape{3, 21, 300}, Shape{1, 2, 1}}) {
      const Tensor x = mul_scalar(randn(shape, {.dtype = dtype}), 4.0);
      for (int64_t d = 0; d + 1 < x.dim(); ++d)
        for (const bool log : {false, true}) {
          CAPTURE(d);
          CAPTURE(log);
          const std::vector<double> got = (log ? log_softmax(x, d) : softmax(x, d)).to_vector();
          const std::vector<double> want = moved_last(x, d, log).contiguous().to_vector();
          const std::vector<double> xs = x.to_vector();
          REQUIRE(got.size() == want.size());
          double worst = 0;
          for (size_t i = 0; i < got.size(); ++i)
            worst = std::max(worst, std::fabs(got[i] - want[i]) /
                                        std::max(std::fabs(want[i]),
                                                 log ? 1.0 + std::fabs(xs[i]) : std::numeric_limits<double>::min()));
          CAPTURE(worst);
          CHECK(worst <= tol);
        }
    }
    // Channels-last [2, 3, 4, 5] over the channels: read through its logical layout.
    const Tensor x = randn({2, 3, 4, 5}, {.dtype = dtype});
    const std::vector<double> plain = softmax(x, 1).to_vector();
    const std::vector<double> from_channels_last = softmax(x.contiguous(MemoryFormat::ChannelsLast), 1).to_vector();
    CHECK(plain == from_channels_last);
    // A NaN at [0, 1, 2]: its position's outputs over dim 1 are NaN, every other one is not.
    std::vector<double> v(2 * 3 * 8);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 7) - 3.0;
    v[1 * 8 + 2] = std::nan("");
    for (const bool log : {false, true}) {
      const Tensor t = from_vector(v, {2, 3, 8}, {.dtype = dtype});
      const std::vector<double> y = (log ? log_softmax(t, 1) : softmax(t, 1)).to_vector();
      for (size_t i = 0; i < y.size(); ++i) {
        const bool poisoned = i / 24 == 0 && i % 8 == 2;
        CHECK(std::isnan(y[i]) == poisoned);
      }
    }
  }
}

#if defined(__FMA__)
// exp_of_nonpositive (engine/cpu/vector_math.h), softmax's e^x, over every 4099th float32 bit pattern
// ≤ 0, subnormal results included: within 0.88 ulp (every pattern measured 0.8791), and -inf, -0
// and NaN.
TEST_CASE("exp_of_nonpositive: within 0.88 ulp over float32s at most 0") {
  double worst = 0;
  for (uint32_t bits = 0x80000000u; bits < 0xFF800000u; bits += 4099) {
    const float x = std::bit_cast<float>(bits);
    const long double want = std::exp(static_cast<long double>(x));
    const auto rounded = static_cast<float>(want);
    const double ulp = float32_ulp(rounded);
    worst = std::max(
        worst,
        static_cast<double>(std::fabs(static_cast<long double>(cpu_backend::exp_of_nonpositive(x)) - want)) / ulp);
  }
  CAPTURE(worst);
  CHECK(worst <= 0.88);
  CHECK(cpu_backend::exp_of_nonpositive(-INFINITY) == 0.0f);
  CHECK(cpu_backend::exp_of_nonpositive(-0.0f) == 1.0f);
  CHECK(std::isnan(cpu_backend::exp_of_nonpositive(std::nanf(""))));
}
#endif

// float32 softmax against the exact softmax of the same float32 differences x - m (rounded as the
// op rounds them: that rounding is float32's, whatever e^x does). Each e^(x - m) is within 0.88 ulp
// (exp_of_nonpositive, engine/cpu/vector_math.h), so their float64 sum s is within 0.88 ulp of float32
// relative as well; 1/s is rounded, then the product: at most (0.88 + 0.88 + 0.5)·2 + 0.5 = 5.02 ulp
// of the output (an ulp of e or 1/s is up to twice the output's, relative to their sizes; a row
// built for it reached 3.48). Rows longer than a vector register's lanes, with a remainder, and over
// dim 1 (the same exponential); values to ±120, so that outputs run down through subnormals to zero.
// Then the maximum: rows of every length around the kernels' register widths with one element 200
// above the rest at each position, whose output is 1 and the rest's 0 (e^-200 rounds to 0), over
// rows and over dim 1: a maximum that missed it would give e^200, infinite.
TEST_CASE("float32 softmax: within 5.02 ulp of the exact one, over rows and over dim 1; the maximum found anywhere") {
  manual_seed(11);
  for (const Shape& shape : {Shape{16, 1027}, Shape{4, 37, 300}}) {
    const Tensor x = mul_scalar(randn(shape), 30.0);
    const std::vector<double> xs = x.to_vector();
    for (const int64_t d : {int64_t{1}, x.dim() - 1}) {
      CAPTURE(d);
      const std::vector<double> got = softmax(x, d).to_vector();
      // x as [outer, cols, inner] around dim d.
      const int64_t cols = shape[static_cast<size_t>(d)];
      int64_t inner = 1;
      for (int64_t k = d + 1; k < x.dim(); ++k) inner *= shape[static_cast<size_t>(k)];
      const int64_t outer = x.numel() / (cols * inner);
      double worst = 0;
      int64_t subnormal = 0;
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          const auto at = [&](int64_t c) { return static_cast<size_t>((o * cols + c) * inner + i); };
          float m = -INFINITY;
          for (int64_t c = 0; c < cols; ++c) m = std::max(m, static_cast<float>(xs[at(c)]));
          long double sum = 0;
          for (int64_t c = 0; c < cols; ++c)
            sum += std::exp(static_cast<long double>(static_cast<float>(xs[at(c)]) - m));
          for (int64_t c = 0; c < cols; ++c) {
            const long double want = std::exp(static_cast<long double>(static_cast<float>(xs[at(c)]) - m)) / sum;
            const auto rounded = static_cast<float>(want);
            subnormal += rounded != 0.0f && rounded < std::numeric_limits<float>::min();
            const double ulp = float32_ulp(rounded);
            worst = std::max(worst, static_cast<double>(std::fabs(got[at(c)] - want)) / ulp);
          }
        }
      CAPTURE(worst);
      CHECK(subnormal > 0);
      CHECK(worst <= 5.02);
    }
  }
  for (const int64_t length : {1, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129}) {
    CAPTURE(length);
    for (int64_t at = 0; at < length; ++at) {
      std::vector<double> v(static_cast<size_t>(length));
      for (int64_t c = 0; c < length; ++c) v[static_cast<size_t>(c)] = static_cast<double>(c % 5) - 2.0;
      v[static_cast<size_t>(at)] = 200.0;
      std::vector<double> want(v.size(), 0.0);
      want[static_cast<size_t>(at)] = 1.0;
      const Tensor row = from_vector(v, {1, length});
      CHECK(softmax(row, 1).to_vector() == want);
      CHECK(softmax(reshape(row, {1, length, 1}), 1).to_vector() == want);
    }
  }
}

// --- bfloat16 (engine/bfloat16.h) ----------------------------------------------------------------------

TEST_CASE("bfloat16: float32 rounds to nearest, ties to even; NaN, infinities and overflow") {
  const auto bits = [](float f) { return bfloat16(f).bits; };
  CHECK(bits(1.0f) == 0x3f80);
  CHECK(bits(1.0f + 0x1p-8f) == 0x3f80);             // halfway between 1 and 1 + 2^-7: to the even one
  CHECK(bits(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82);   // halfway, the other way up to even
  CHECK(bits(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);  // past halfway: up
  CHECK(bits(-2.5f) == 0xc020);
  CHECK(static_cast<float>(bfloat16(3.140625f)) == 3.140625f);  // exactly representable
  CHECK(bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bits(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past bfloat16's largest: infinity
  CHECK(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  CHECK(std::isnan(static_cast<float>(bfloat16(-std::nanf("")))));
  CHECK(bits(1e-40f) == 0x0001);  // a subnormal keeps its upper bits
}

TEST_CASE("bfloat16 tensors: casts from and to every dtype, and a clear error for arithmetic") {
  const Tensor x = from_vector({1.0, -2.5, 1.0 + 0x1p-8, 3.0e38, 1e-3, 255.5}, {6});
  const Tensor b = x.to(kBFloat16);
  CHECK(b.dtype() == kBFloat16);
  CHECK(dtype_size(b.dtype()) == 2);
  const std::vector<double> want = {1.0, -2.5, 1.0, 0x1.c4p127, 0x1.06p-10, 256.0};
  CHECK(b.to_vector() == want);
  CHECK(b.to(kFloat32).to_vector() == want);
  CHECK(from_int_vector({3, -7}, {2}).to(kBFloat16).to_int_vector() == std::vector<int64_t>{3, -7});
  CHECK(narrow(b, 0, 0, 3).to(kInt64).to_int_vector() == std::vector<int64_t>{1, -2, 1});
  CHECK(full({3}, 0.1, {.dtype = kBFloat16}).to_vector() == std::vector<double>(3, 0.10009765625));
  CHECK(error_of([&] { (void)(b + b); }).find("dtype bfloat16 is not supported") != std::string::npos);
  CHECK(error_of([&] { (void)randn({2}, {.dtype = kBFloat16}); }).find("bfloat16") != std::string::npos);
}

TEST_CASE("bfloat16 casts are differentiable, to second order: the gradient is cast back") {
  const Tensor x = from_vector({0.3, -1.7, 2.2}, {3}, {.dtype = kFloat32}).requires_grad_(true);
  const Tensor y = x.to(kBFloat16).to(kFloat32);
  CHECK(y.to_vector() == std::vector<double>{0.30078125, -1.703125, 2.203125});
  const Tensor loss = sum(square(y));
  const Tensor g = grad({loss}, {x}, {}, {.create_graph = true})[0];
  CHECK(g.to_vector() == std::vector<double>{0.6015625, -3.40625, 4.40625});  // 2y, y rounded
  const Tensor gg = grad({sum(g)}, {x})[0];
  CHECK(gg.to_vector() == std::vector<double>(3, 2.0));
}
