// Data parallelism across processes (Note [Processes] in parallel/process_group.h). Run under
// `mpirun -np 2` (tests/CMakeLists.txt), each process with two CPU devices: 2 processes x 2 devices
// must compute what one device computes on the whole batch, float64 1e-10, dropout, SyncBatchNorm
// and a gradient penalty included.
#include <doctest/doctest.h>

#include "evenflow/layers/layers.h"
#include "evenflow/losses/losses.h"
#include "evenflow/optim/optim.h"
#include "evenflow/parallel/data_parallel.h"
#include "evenflow/parallel/process_group.h"
#include "evenflow/parallel/sync_batch_norm.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::parallel;
using namespace evenflow::testing;

namespace {

constexpr double kTol = 1e-10;
const TensorOptions f64{.dtype = kFloat64};
const nn::ModuleOptions m64{.dtype = kFloat64};

ProcessGroup& job() {
  return *processes();
}

}  // namespace

TEST_CASE("processes: the job is two processes over MPI") {
  REQUIRE(multi_process_support());
  CHECK(std::string(job().kind()) == "mpi");
  CHECK(job().size() == 2);
}

TEST_CASE("processes: sums, broadcasts and gathers give every process the same values") {
  const auto channel = job().duplicate();
  const double me = job().rank();
  // 5 elements over 2 processes: blocks of 3 and 2 (each summed by one process).
  const Tensor x = from_vector({me, 1 + me, 0.1 * me, -me, 1e-17 + me}, {5}, f64);
  channel->all_reduce(x);
  CHECK(vals(x) == std::vector<double>{1, 3, 0.1, -1, 1e-17 + 1});
  const Tensor counts = from_int_vector({3, static_cast<int64_t>(me)}, {2});
  channel->all_reduce(counts);
  CHECK(vals(counts) == std::vector<double>{6, 1});
  const Tensor b = full({2, 2}, me + 7, f64);
  channel->broadcast(b, 1);
  CHECK(vals(b) == std::vector<double>(4, 8));
  CHECK(vals(channel->all_gather(full({1, 2}, me, {.dtype = kFloat32}))) == std::vector<double>{0, 0, 1, 1});
  CHECK(channel->broadcast_bytes(job().rank() == 0 ? "from process 0" : "", 0) == "from process 0");
  // Misuse is named before anything is sent.
  CHECK(error_of([&] {
          channel->all_reduce(transpose(zeros({2, 3}, f64), 0, 1));
        }).find("all_reduce: needs a contiguous CPU tensor") == 0);
  CHECK(error_of([&] { channel->broadcast(zeros({2}, f64), 2); }) ==
        "broadcast: root process 2 is out of range for 2 processes");
}

// Also run on 3 processes (tests/CMakeLists.txt): the ring's chunks and steps depend on the count.
TEST_CASE("processes: all_reduce sums every element once, the same bits on every process") {
  const auto channel = job().duplicate();
  const int p = job().size();
  for (int64_t n : {int64_t{1}, int64_t{p - 1}, int64_t{p}, int64_t{7}, int64_t{1001}}) {
    if (n == 0) continue;
    std::vector<double> mine, expected(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      // Integers (exact sums) plus a part whose rounding depends on the order of the additions.
      const auto value = [&](int q) { return 1000.0 * (q + 1) + static_cast<double>(i) + 0.1 * (q + 1) / 3; };
      mine.push_back(value(job().rank()));
    }
    const Tensor x = from_vector(mine, {n}, f64);
    channel->all_reduce(x);
    for (int64_t i = 0; i < n; ++i) {
      double integer = 0;
      for (int q = 0; q < p; ++q) integer += 1000.0 * (q + 1) + static_cast<double>(i);
      CHECK(std::abs(x.data<double>()[i] - integer - 0.1 * p * (p + 1) / 6) < 1e-9);
    }
    // Every process's result, gathered: bitwise equal rows.
    const Tensor all = channel->all_gather(reshape(x, {1, n}));
    for (int q = 1; q < p; ++q) CHECK(vals(all.select(0, q)) == vals(all.select(0, 0)));
  }
}

TEST_CASE("processes: a communicator's ranks run over every device of every process") {
  DeviceGroup group(devices("cpu:2"), processes());
  REQUIRE(group.world_size() == 4);
  CHECK(group.first_rank() == 2 * job().rank());
  const auto& comm = group.comm();
  CHECK(comm->size() == 4);
  CHECK(comm->local_size() == 2);
  group.run([&](int rank) {
    const int global = comm->first_rank() + rank;
    const Device d = group.device(rank);
    const TensorOptions o{.dtype = kFloat64, .device = d};
    CHECK(vals(comm->all_reduce(rank, full({3}, global + 1, o))) == std::vector<double>(3, 10));
    CHECK(vals(comm->all_gather(rank, full({1}, global, o))) == std::vector<double>{0, 1, 2, 3});
    CHECK(vals(comm->broadcast(rank, full({2}, global + 1, o), 3)) == std::vector<double>{4, 4});
    const Tensor reduced = comm->reduce(rank, full({1}, global + 1, o), 2);
    CHECK(reduced.defined() == (global == 2));
    if (global == 2) CHECK(vals(reduced) == std::vector<double>{10});
    // Rank g's slice of sum_r (r + 1) * [0, 1, 2, 3] is 10 * g.
    const Tensor parts = mul_scalar(arange(0, 4, 1, o), global + 1);
    CHECK(vals(comm->reduce_scatter(rank, parts)) == std::vector<double>{10.0 * global});
  });
  // The in-place sum gradient buckets use, from one thread: a list of two tensors per rank.
  std::vector<std::vector<Tensor>> per_rank;
  for (int r = 0; r < 2; ++r) {
    const double g = 2 * job().rank() + r;
    per_rank.push_back({full({4}, g, {.dtype = kFloat64, .device = group.device(r)}),
                        full({2, 3}, 10 * g, {.dtype = kFloat64, .device = group.device(r)})});
  }
  comm->all_reduce_in_place(per_rank);
  for (const auto& list : per_rank) {
    CHECK(vals(list[0]) == std::vector<double>(4, 6));
    CHECK(vals(list[1]) == std::vector<double>(6, 60));
  }
}

namespace {

// A critic with SyncBatchNorm and dropout, trained for `steps` SGD steps with the WGAN-GP loss
// (a per-device double backward) on batches of 7: on one device of this process when
// `across_processes` is false (the reference), else on cpu:2 in each of the job's processes, each
// reading only its share of every batch. Returns the losses and the final state. SGD, not Adam: the
// first layer's bias, before a batch norm, has a gradient of 0 up to rounding, whose sign Adam's
// first step would turn into ±lr.
std::pair<std::vector<double>, nn::NamedTensors> train_critic(bool across_processes, int steps, size_t bucket_bytes) {
  manual_seed(cpu(), 30);
  auto net = std::make_shared<nn::Sequential>(nn::Linear(6, 8, true, m64), SyncBatchNorm(8, {}, m64), nn::Dropout(0.5),
                                              nn::Tanh(), nn::Linear(8, 1, true, m64));
  const auto loss_of = [](nn::Module& critic, const Tensor& real, const Tensor& fake) {
    const losses::Critic d = [&](const Tensor& x) { return critic(x); };
    return losses::wasserstein_critic_loss(critic(real), critic(fake)) + losses::wgan_gp_penalty(d, real, fake);
  };
  std::vector<double> losses_seen;
  if (!across_processes) {
    optim::SGD opt(net->parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int step = 0; step < steps; ++step) {
      const Tensor real = randn({7, 6}, f64), fake = randn({7, 6}, f64);
      opt.zero_grad();
      const Tensor loss = loss_of(*net, real, fake);
      loss.backward();
      opt.step();
      losses_seen.push_back(loss.item());
    }
    return {losses_seen, net->state_dict()};
  }
  DataParallelModel model(net, devices("cpu:2"), {.bucket_bytes = bucket_bytes});
  DataParallelCriterion criterion(model);
  ReplicatedOptimizer<optim::SGD> opt(model, optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  for (int step = 0; step < steps; ++step) {
    // Every process draws the whole batch and keeps its share (what a distributed sampler reads).
    const Tensor real = randn({7, 6}, f64), fake = randn({7, 6}, f64);
    // The real batch with its rows (no collective), the fake one learning them (an all-gather).
    const auto reals = model.scatter(model.process_part(real), model.process_rows(7));
    const std::vector<BatchRows> given = model.batch_rows();
    const auto fakes = model.scatter(model.process_part(fake));
    for (size_t r = 0; r < given.size(); ++r) {
      CHECK(model.batch_rows()[r].start == given[r].start);
      CHECK(model.batch_rows()[r].count == given[r].count);
      CHECK(model.batch_rows()[r].total == 7);
    }
    opt.zero_grad();
    const Tensor loss = criterion([&](int r) { return loss_of(model.replica(r), reals[r], fakes[r]); });
    loss.backward();
    opt.step();
    losses_seen.push_back(loss.item());
    model.check_replicas();
  }
  return {losses_seen, model.module().state_dict()};
}

}  // namespace

TEST_CASE("processes: 2 processes x 2 devices train as one device on the whole batch") {
  const auto [want_losses, want_state] = train_critic(false, 4, 0);
  for (const size_t bucket_bytes : {size_t{1}, size_t{25} << 20}) {
    CAPTURE(bucket_bytes);
    const auto [losses_seen, state] = train_critic(true, 4, bucket_bytes);
    REQUIRE(losses_seen.size() == want_losses.size());
    for (size_t i = 0; i < want_losses.size(); ++i)
      CHECK(losses_seen[i] == doctest::Approx(want_losses[i]).epsilon(kTol));
    REQUIRE(state.size() == want_state.size());
    for (size_t i = 0; i < want_state.size(); ++i) {
      CAPTURE(want_state[i].first);
      const Tensor diff = abs(state[i].second.to(kFloat64) - want_state[i].second.to(kFloat64));
      CHECK(amax(diff).item() <= kTol * (1 + amax(abs(want_state[i].second.to(kFloat64))).item()));
    }
  }
  CHECK(want_losses[0] != want_losses[1]);
}

TEST_CASE("processes: a batch too small for every device of the job is refused, naming the counts") {
  CHECK(error_of([] { process_share(3, 2, job()); }) ==
        "process_share: a batch of 3 items over 2 processes of 2 devices: every one of the 4 devices needs at least "
        "one item");
  CHECK(process_share(7, 2, job()).count == (job().rank() == 0 ? 4 : 3));
}

TEST_CASE("processes: sum adds a host number over the processes, the same on each") {
  const double total = job().sum(job().rank() + 0.25);
  const int p = job().size();
  CHECK(total == p * (p - 1) / 2 + 0.25 * p);
}

TEST_CASE("processes: no_sync accumulates micro-batches, and the last backward sums them over every process") {
  // Two micro-batches of 7, the first backward under no_sync: every replica of every process ends
  // with the gradients one device accumulates over the two, 1-byte buckets (one per parameter).
  manual_seed(cpu(), 41);
  const auto make_net = [] {
    return std::make_shared<nn::Sequential>(nn::Linear(5, 4, true, m64), nn::Tanh(), nn::Linear(4, 1, true, m64));
  };
  auto reference = make_net();
  auto net = make_net();
  net->load_state_dict(reference->state_dict());
  const Tensor a = randn({7, 5}, f64), b = randn({7, 5}, f64);
  const auto loss_of = [](const Tensor& y) { return mean(square(y)); };
  loss_of((*reference)(a)).backward();
  loss_of((*reference)(b)).backward();

  DataParallelModel model(net, devices("cpu:2"), {.bucket_bytes = 1});
  DataParallelCriterion criterion(model);
  const auto my_chunks = [&](const Tensor& x) { return model.scatter(model.process_part(x), model.process_rows(7)); };
  const auto xa = my_chunks(a), xb = my_chunks(b);
  {
    const auto pause = model.no_sync();
    criterion([&](int r) { return loss_of(model.replica(r)(xa[r])); }).backward();
  }
  criterion([&](int r) { return loss_of(model.replica(r)(xb[r])); }).backward();
  const std::vector<Tensor> want = reference->parameters();
  for (int r = 0; r < model.size(); ++r) {
    const std::vector<Tensor> got = model.replica(r).parameters();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(amax(abs(got[i].grad().to(cpu()) - want[i].grad())).item() <= kTol);
    }
  }
}
