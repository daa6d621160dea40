// Device groups, the local communicator, and the differentiable comm ops, on CPU devices.
#include <doctest/doctest.h>

#include <chrono>

#include "evenflow/parallel/comm_ops.h"
#include "evenflow/parallel/device_group.h"
#if EF_NCCL
#include "evenflow/parallel/nccl_communicator_internal.h"
#endif
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::parallel;
using namespace evenflow::testing;

namespace {
Tensor filled(double base, Shape shape, const Device& d) {
  return add_scalar(arange(0, static_cast<double>(numel_of(shape)), 1, {.dtype = kFloat64}), base).reshape(shape).to(d);
}
}  // namespace

TEST_CASE("devices: specs name CPU device counts and CUDA device lists") {
  CHECK(devices("cpu").size() == 1);
  const auto three = devices("cpu:3");
  REQUIRE(three.size() == 3);
  CHECK(three[2] == cpu(2));
  CHECK(error_of([] { devices("cpu:0"); }).find("number of CPU devices") != std::string::npos);
  CHECK(error_of([] { devices("tpu:2"); }).find("unknown device kind in 'tpu:2'") != std::string::npos);
  CHECK(error_of([] { devices("cpu:x"); }).find("comma-separated list of numbers") != std::string::npos);
  if (cuda_device_count() == 0) {
    CHECK(error_of([] { devices("cuda"); }).find("there is none") != std::string::npos);
    CHECK(error_of([] { devices("cuda:0,1"); }).find("unknown device cuda:0") != std::string::npos);
  }
  CHECK(error_of([] { DeviceGroup({cpu(0), cpu(0)}); }).find("listed twice") != std::string::npos);
}

TEST_CASE("local communicator: every collective, identical results on every rank") {
  DeviceGroup group(devices("cpu:3"));
  std::vector<Tensor> reduced(3), broadcasted(3), reduced_to_1(3), gathered(3), scattered(3);
  group.run([&](int r) {
    const auto& comm = group.comm();
    const Tensor x = filled(10.0 * r, {3, 2}, group.device(r));
    reduced[r] = comm->all_reduce(r, x);
    broadcasted[r] = comm->broadcast(r, x, 2);
    reduced_to_1[r] = comm->reduce(r, x, 1);
    gathered[r] = comm->all_gather(r, x);
    scattered[r] = comm->reduce_scatter(r, x);
  });
  const Tensor sum = filled(0, {3, 2}, cpu()) + filled(10, {3, 2}, cpu()) + filled(20, {3, 2}, cpu());
  for (int r = 0; r < 3; ++r) {
    CHECK(reduced[r].device() == cpu(r));
    CHECK(vals(reduced[r]) == vals(sum));
    CHECK(vals(broadcasted[r]) == vals(filled(20, {3, 2}, cpu())));
    CHECK(reduced_to_1[r].defined() == (r == 1));
    CHECK(gathered[r].shape() == Shape{9, 2});
    CHECK(vals(gathered[r]) ==
          vals(cat({filled(0, {3, 2}, cpu()), filled(10, {3, 2}, cpu()), filled(20, {3, 2}, cpu())}, 0)));
    CHECK(vals(scattered[r]) == vals(narrow(sum, 0, r, 1)));
  }
  CHECK(vals(reduced_to_1[1]) == vals(sum));
}

TEST_CASE("local communicator: mismatched calls, a missing rank and a failing rank are errors, then it works again") {
  DeviceGroup group(devices("cpu:3"));
  group.set_timeout(std::chrono::milliseconds(300));

  // Rank 2 calls a different collective: every rank gets an error naming both calls.
  std::string mismatch = error_of([&] {
    group.run([&](int r) {
      const Tensor x = zeros({4}, {.dtype = kFloat64, .device = group.device(r)});
      if (r == 2)
        group.comm()->all_gather(r, x);
      else
        group.comm()->all_reduce(r, x);
    });
  });
  CHECK(mismatch.find("collective mismatch") != std::string::npos);
  CHECK(mismatch.find("all_gather [4] float64") != std::string::npos);

  // Rank 1 never calls: the others give up after the timeout instead of hanging.
  const auto start = std::chrono::steady_clock::now();
  std::string timeout = error_of([&] {
    group.run([&](int r) {
      if (r != 1) group.comm()->all_reduce(r, ones({2}, {.device = group.device(r)}));
    });
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(timeout.find("timed out after 300 ms") != std::string::npos);
  CHECK(timeout.find("no call from cpu:1") != std::string::npos);
  CHECK(seconds < 5.0);

  // Rank 0 throws before the collective the others wait in: they are released at once.
  const auto start2 = std::chrono::steady_clock::now();
  group.set_timeout(std::chrono::milliseconds(60000));
  std::string thrown = error_of([&] {
    group.run([&](int r) {
      if (r == 0) EF_ERROR("boom on purpose");
      group.comm()->all_reduce(r, ones({2}, {.device = group.device(r)}));
    });
  });
  CHECK(thrown == "on cpu:0: boom on purpose");
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start2).count() < 30.0);

  // The group and its communicator are usable again.
  std::vector<double> totals(3);
  group.run(
      [&](int r) { totals[r] = group.comm()->all_reduce(r, full({}, r + 1.0, {.device = group.device(r)})).item(); });
  CHECK(totals == std::vector<double>{6, 6, 6});
}

TEST_CASE("split_sizes: uneven and smaller-than-group batches") {
  CHECK(split_sizes(10, 4) == std::vector<int64_t>{3, 3, 2, 2});
  CHECK(split_sizes(2, 4) == std::vector<int64_t>{1, 1});
  CHECK(split_sizes(8, 4) == std::vector<int64_t>{2, 2, 2, 2});
  CHECK(error_of([] { split_sizes(0, 4); }).find("cannot be split") != std::string::npos);
}

TEST_CASE("comm ops: gradcheck and gradgradcheck of broadcast, reduce_add, scatter and gather") {
  const std::vector<Device> devs = devices("cpu:3");
  manual_seed(cpu(), 3);
  const Tensor x = randn({5, 2}, {.dtype = kFloat64});
  const Tensor w = randn({5, 2}, {.dtype = kFloat64});
  // Products with x (and w) make second derivatives non-trivial.
  const Fn through_broadcast = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> copies = broadcast(in[0], devs);
    for (size_t i = 0; i < copies.size(); ++i) copies[i] = copies[i] * copies[i] * static_cast<double>(i + 1);
    return reduce_add(copies, cpu(1)).to(cpu());
  };
  const Fn through_scatter = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> parts = scatter(in[0] * in[1], {2, 2, 1}, devs);
    for (Tensor& p : parts) p = tanh(p) * p;
    return gather(parts, cpu(2)).to(cpu());
  };
  const Fn along_dim1 = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> parts = scatter(in[0], {1, 1}, {cpu(1), cpu(2)}, 1);
    return gather({square(parts[1]), parts[0] * parts[0]}, cpu(0), 1);
  };
  for (const auto& [name, fn] : std::vector<std::pair<std::string, Fn>>{
           {"broadcast/reduce_add", through_broadcast}, {"scatter/gather", through_scatter}, {"dim 1", along_dim1}}) {
    CAPTURE(name);
    const std::vector<Tensor> inputs{x.clone().requires_grad_(true), w.clone().requires_grad_(true)};
    CHECK(gradcheck(fn, inputs) == "");
    CHECK(gradgradcheck(fn, inputs) == "");
  }
}

TEST_CASE("comm ops: all_reduce is differentiable twice across ranks") {
  DeviceGroup group(devices("cpu:3"));
  manual_seed(cpu(), 4);
  // f(x0, x1, x2) = gather_r (y_r * y_r * x_r) with y_r = Σ x: every rank's backward node runs the
  // collective again, and under create_graph the backward of that one too.
  const Fn fn = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> out(3);
    group.run([&](int r) {
      const Tensor x = in[r].to(group.device(r));
      const Tensor y = all_reduce(group.comm(), r, x);
      out[r] = y * y * x;
    });
    return gather(out, cpu(0));
  };
  std::vector<Tensor> inputs;
  for (int r = 0; r < 3; ++r) inputs.push_back(randn({2, 2}, {.dtype = kFloat64}).requires_grad_(true));
  CHECK(gradcheck(fn, inputs) == "");
  CHECK(gradgradcheck(fn, inputs) == "");
}

TEST_CASE("comm ops: bad arguments are clear errors") {
  const Tensor x = zeros({4, 2});
  CHECK(error_of([&] {
          scatter(x, {3, 2}, {cpu(0), cpu(1)});
        }).find("chunk sizes sum to 5 but dim 0") != std::string::npos);
  CHECK(error_of([&] { scatter(x, {4, 0}, {cpu(0), cpu(1)}); }).find("must be positive") != std::string::npos);
  CHECK(error_of([&] {
          reduce_add({zeros({2}), zeros({3})}, cpu(0));
        }).find("tensor 1 has shape [3]") != std::string::npos);
  CHECK(error_of([&] {
          gather({zeros({2}), zeros({2}, {.dtype = kFloat64})}, cpu(0));
        }).find("tensor 1 is float64") != std::string::npos);
}

// Note [NCCL watchdog]: calls queue their collectives and return. One GPU is a one-rank NCCL
// communicator, which still runs the whole path: events, the watchdog, the tensors it holds.
TEST_CASE("nccl: collectives are queued without waiting, bucket reduces hold their tensors, join orders them") {
#if EF_NCCL
  if (!cuda_devices_available()) return;
  const std::shared_ptr<Communicator> comm = make_nccl_communicator({cuda(0)});
  CHECK(std::string(comm->kind()) == "nccl");
  const Tensor x = arange(0, 1000, 1, {.dtype = kFloat64}).to(cuda(0));
  Tensor y = x;
  for (int i = 0; i < 3000; ++i) y = comm->all_reduce(0, y);  // one rank: the sum is y itself
  CHECK(y.to(cpu()).to_vector() == x.to(cpu()).to_vector());
  // Temporaries handed to in-place reduces and dropped at once: the watchdog keeps them until done.
  for (int i = 0; i < 200; ++i)
    comm->all_reduce_in_place({{full({1 << 16}, static_cast<double>(i), {.dtype = kFloat32, .device = cuda(0)})}});
  const Tensor g = full({4096}, 2.0, {.dtype = kFloat32, .device = cuda(0)});
  comm->all_reduce_in_place({{g}});
  comm->join_in_place();
  CHECK(g.to(cpu()).to_vector() == std::vector<double>(4096, 2.0));
  // A communicator split from it (as a DeviceGroup's for fewer active ranks is).
  const std::shared_ptr<Communicator> child = make_nccl_communicator({cuda(0)}, nullptr, comm);
  CHECK(child->all_reduce(0, x).to(cpu()).to_vector() == x.to(cpu()).to_vector());
  CHECK(error_of([&] {
          make_nccl_communicator({cuda(0)}, nullptr, make_communicator({cpu(0), cpu(1)}));
        }).find("the parent is a local communicator") != std::string::npos);
  synchronize(cuda(0));
#else
  EF_SKIP_CUDA_TEST("this build has no NCCL (parallel/nccl.cmake found no nccl.h and libnccl)");
#endif
}
