#include "evenflow/parallel/process_group.h"

#include <cstdlib>

#include "evenflow/engine/capture_internal.h"
#include "evenflow/parallel/comm_ops.h"
#include "evenflow/parallel/process_group_internal.h"

namespace evenflow::parallel {

ProcessGroup::ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

namespace {

// One process: every collective is the identity.
class SingleProcess final : public ProcessGroup {
 public:
  SingleProcess() : ProcessGroup(0, 1) {}
  const char* kind() const override { return "single"; }
  std::shared_ptr<ProcessGroup> duplicate() override {
    auto copy = std::make_shared<SingleProcess>();
    copy->set_timeout(timeout());
    return copy;
  }
  void all_reduce(const Tensor& x) override { check_host_tensor("all_reduce", x); }
  void broadcast(const Tensor& x, int root) override {
    check_host_tensor("broadcast", x);
    EF_CHECK(root == 0, "broadcast: root process ", root, " is out of range for 1 process");
  }
  Tensor all_gather(const Tensor& x) override {
    check_host_tensor("all_gather", x);
    EF_CHECK(x.dim() >= 1, "all_gather: needs at least one dim, got a scalar");
    return x.clone();
  }
  std::string broadcast_bytes(const std::string& bytes, int root) override {
    EF_CHECK(root == 0, "broadcast_bytes: root process ", root, " is out of range for 1 process");
    return bytes;
  }
  void fail(const std::string&) noexcept override {}
};

bool started_by_launcher() {
  // Open MPI's mpirun, MPICH's and Intel MPI's Hydra, PMIx launchers (srun --mpi=pmix, prterun).
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace

void add_host(void* dst, const void* src, int64_t n, DType dtype) {
  const auto add = [n](auto* d, const auto* s) {
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  };
  switch (dtype) {
    case kFloat32:
      return add(static_cast<float*>(dst), static_cast<const float*>(src));
    case kFloat64:
      return add(static_cast<double*>(dst), static_cast<const double*>(src));
    case kInt64:
      return add(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src));
    default:
      EF_ERROR("sum of ", dtype_name(dtype), " values: only float32, float64 and int64 are summed");
  }
}

Tensor host_copy(const Tensor& x) {
  return x.device().is_cpu() ? x.contiguous().clone() : x.to(Device()).contiguous();
}

void check_host_tensor(const char* op, const Tensor& x) {
  // The processes meet on the host, which a replayed step does not (Note [A step that can be replayed]).
  EF_CHECK(detail::step_thread().capture == nullptr, op,
           " across processes inside a recorded step: the processes meet on the host, which a replay does not "
           "repeat; record steps of one process");
  EF_CHECK(x.defined(), op, ": undefined tensor");
  EF_CHECK(x.device().is_cpu() && x.is_contiguous(), op, ": needs a contiguous CPU tensor, got ", x.str());
  EF_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64 || x.dtype() == kInt64, op,
           ": float32, float64 or int64 only, got ", dtype_name(x.dtype()));
}

#if !EF_MPI
bool multi_process_support() {
  return false;
}
std::shared_ptr<ProcessGroup> make_mpi_process_group() {
  EF_ERROR("processes: this build of evenflow has no MPI (install Open MPI, libopenmpi-dev, and rebuild)");
}
#endif

std::shared_ptr<ProcessGroup> single_process() {
  return std::make_shared<SingleProcess>();
}

const std::shared_ptr<ProcessGroup>& processes() {
  static const std::shared_ptr<ProcessGroup> job = []() -> std::shared_ptr<ProcessGroup> {
    if (multi_process_support() && started_by_launcher()) return make_mpi_process_group();
    return std::make_shared<SingleProcess>();
  }();
  return job;
}

double ProcessGroup::sum(double x) {
  if (size() == 1) return x;
  const Tensor t = full({1}, x, {.dtype = kFloat64});
  all_reduce(t);
  return t.item();
}

ProcessShare process_share(int64_t batch, int devices_per_process, const ProcessGroup& group) {
  EF_CHECK(devices_per_process >= 1, "process_share: ", devices_per_process, " devices per process");
  const int ranks = devices_per_process * group.size();
  EF_CHECK(group.size() == 1 || batch >= ranks, "process_share: a batch of ", batch, " items over ", group.size(),
           " processes of ", devices_per_process, " devices: every one of the ", ranks,
           " devices needs at least one item");
  const std::vector<int64_t> sizes = split_sizes(batch, ranks);
  ProcessShare share;
  for (size_t r = 0; r < sizes.size(); ++r) {
    const int process = static_cast<int>(r) / devices_per_process;
    if (process < group.rank()) share.start += sizes[r];
    if (process == group.rank()) share.count += sizes[r];
  }
  return share;
}

}  // namespace evenflow::parallel
