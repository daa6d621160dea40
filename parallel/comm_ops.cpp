#include "evenflow/parallel/comm_ops.h"

namespace evenflow::parallel {

namespace {
void check_same_kind(const char* op, const std::vector<Tensor>& xs) {
  EF_CHECK(!xs.empty(), op, ": no tensors given");
  for (size_t i = 0; i < xs.size(); ++i) {
    EF_CHECK(xs[i].defined(), op, ": tensor ", i, " is undefined");
    EF_CHECK(xs[i].dtype() == xs[0].dtype(), op, ": tensor ", i, " is ", dtype_name(xs[i].dtype()), ", tensor 0 is ",
             dtype_name(xs[0].dtype()));
  }
}

std::vector<Device> devices_of(const std::vector<Tensor>& xs) {
  std::vector<Device> out;
  for (const Tensor& x : xs) out.push_back(x.device());
  return out;
}
}  // namespace

std::vector<Tensor> broadcast(const Tensor& x, const std::vector<Device>& devices) {
  EF_CHECK(x.defined(), "broadcast: input is undefined");
  EF_CHECK(!devices.empty(), "broadcast: no devices given");
  std::vector<Tensor> out;
  {
    NoGradGuard no_grad;
    for (const Device& d : devices) out.push_back(d == x.device() ? x.clone() : x.to(d));
  }
  const Device source = x.device();
  record("Broadcast", out, {x}, {},
         [source](const std::vector<Tensor>& g) { return std::vector<Tensor>{reduce_add(g, source)}; });
  return out;
}

Tensor reduce_add(const std::vector<Tensor>& xs, const Device& device) {
  check_same_kind("reduce_add", xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    EF_CHECK(xs[i].shape() == xs[0].shape(), "reduce_add: tensor ", i, " has shape ", shape_str(xs[i].shape()),
             ", tensor 0 has ", shape_str(xs[0].shape()));
  }
  Tensor total;
  {
    NoGradGuard no_grad;
    total = xs[0].to(device).clone();
    for (size_t i = 1; i < xs.size(); ++i) total.add_(xs[i].to(device));
  }
  const std::vector<Device> sources = devices_of(xs);
  record("ReduceAdd", {total}, xs, {}, [sources](const std::vector<Tensor>& g) { return broadcast(g[0], sources); });
  return total;
}

std::vector<int64_t> split_sizes(int64_t batch, int devices) {
  EF_CHECK(batch >= 1, "split: a batch of ", batch, " items cannot be split");
  EF_CHECK(devices >= 1, "split: no devices");
  const int64_t k = std::min<int64_t>(batch, devices);
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < k; ++i) sizes.push_back(batch / k + (i < batch % k ? 1 : 0));
  return sizes;
}

std::vector<Tensor> scatter(const Tensor& x, const std::vector<int64_t>& sizes, const std::vector<Device>& devices,
                            int64_t dim) {
  EF_CHECK(x.defined(), "scatter: input is undefined");
  EF_CHECK(x.dim() >= 1, "scatter: input is a scalar");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  EF_CHECK(d >= 0 && d < x.dim(), "scatter: dim ", dim, " is out of range for shape ", shape_str(x.shape()));
  EF_CHECK(sizes.size() == devices.size() && !sizes.empty(), "scatter: ", sizes.size(), " chunk sizes for ",
           devices.size(), " devices");
  int64_t total = 0;
  for (int64_t s : sizes) {
    EF_CHECK(s > 0, "scatter: chunk sizes must be positive (an idle device gets no chunk), got ", s);
    total += s;
  }
  EF_CHECK(total == x.size(d), "scatter: chunk sizes sum to ", total, " but dim ", d, " of ", shape_str(x.shape()),
           " has ", x.size(d));
  std::vector<Tensor> out;
  {
    NoGradGuard no_grad;
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor part = narrow(x, d, start, sizes[i]);
      out.push_back(devices[i] == x.device() ? part.clone() : part.contiguous().to(devices[i]));
      start += sizes[i];
    }
  }
  const Device source = x.device();
  record("Scatter", out, {x}, {},
         [source, d](const std::vector<Tensor>& g) { return std::vector<Tensor>{gather(g, source, d)}; });
  return out;
}

Tensor gather(const std::vector<Tensor>& xs, const Device& device, int64_t dim) {
  check_same_kind("gather", xs);
  const int64_t d = dim < 0 ? dim + xs[0].dim() : dim;
  EF_CHECK(d >= 0 && d < xs[0].dim(), "gather: dim ", dim, " is out of range for shape ", shape_str(xs[0].shape()));
  Tensor out;
  std::vector<int64_t> sizes;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> here;
    for (const Tensor& x : xs) {
      here.push_back(x.to(device));
      sizes.push_back(x.size(d));
    }
    out = cat(here, d);
  }
  const std::vector<Device> sources = devices_of(xs);
  record("Gather", {out}, xs, {},
         [sources, sizes, d](const std::vector<Tensor>& g) { return scatter(g[0], sizes, sources, d); });
  return out;
}

Tensor all_reduce(const std::shared_ptr<Communicator>& comm, int rank, const Tensor& x) {
  EF_CHECK(comm != nullptr, "all_reduce: no communicator");
  Tensor out;
  {
    NoGradGuard no_grad;
    out = comm->all_reduce(rank, x);
  }
  record("AllReduce", {out}, {x}, {},
         [comm, rank](const std::vector<Tensor>& g) { return std::vector<Tensor>{all_reduce(comm, rank, g[0])}; });
  if (out.grad_fn()) out.grad_fn()->mark_collective();  // Note [Collectives in backward] (autograd.cpp)
  return out;
}

}  // namespace evenflow::parallel
