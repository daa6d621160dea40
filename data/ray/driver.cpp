// ef_ray_driver ADDRESS PIPELINE: the Ray client of RayBatches (data/ray_batches.h), in a process of
// its own, speaking protocol.h on fd 3. It connects to the cluster at ADDRESS, says it is ready, then
// submits a MakeBatch task per request and answers each as it completes, in any order. It exits when
// fd 3 closes (the trainer ended or let go), disconnecting from the cluster.
#include <poll.h>
#include <ray/api.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <list>
#include <string>
#include <vector>

#include "data/ray/protocol.h"
#include "data/ray/task.h"

namespace proto = evenflow::data::ray_protocol;
namespace task = evenflow::data::ray_task;

namespace {

constexpr int kSocket = 3;

bool answer(uint64_t id, uint32_t status, const std::string& bytes) {
  const proto::ResponseHeader h{id, status, 0, bytes.size()};
  return proto::write_exact(kSocket, &h, sizeof(h)) && proto::write_exact(kSocket, bytes.data(), bytes.size());
}

struct Pending {
  uint64_t id;
  ray::ObjectRef<std::string> result;
};

// Reads one request and submits its task; false when the socket has closed.
bool submit(const std::string& pipeline, std::list<Pending>& pending) {
  proto::RequestHeader h{};
  if (!proto::read_exact(kSocket, &h, sizeof(h))) return false;
  std::vector<int64_t> indices(h.count);
  if (!proto::read_exact(kSocket, indices.data(), indices.size() * sizeof(int64_t))) return false;
  // Copied into the list, never moved: moving a fresh ObjectRef breaks Ray 2.60's reference
  // counting for results in the object store (ray-cpp.md, pitfall 2); list nodes never move.
  const ray::ObjectRef<std::string> ref = ray::Task(task::MakeBatch).Remote(pipeline, indices, h.seed, h.epoch);
  pending.push_back(Pending{h.id, ref});
  return true;
}

// Answers the tasks that have finished, waiting up to `timeout_ms` for the first; false when the
// socket has closed. `library`: the task library's path, for the message when workers lack it.
bool answer_finished(std::list<Pending>& pending, int timeout_ms, const std::string& library) {
  std::vector<ray::ObjectRef<std::string>> refs;
  for (const Pending& p : pending) refs.push_back(p.result);
  const ray::WaitResult<std::string> done = ray::Wait(refs, 1, timeout_ms);
  for (const auto& ready : done.ready) {
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      if (it->result.ID() != ready.ID()) continue;
      bool sent = false;
      try {
        sent = answer(it->id, proto::kOk, *ray::Get(it->result));
      } catch (const std::exception& e) {
        std::string message = e.what();
        if (message.find("RayFunctionNotFound") != std::string::npos)
          message += " (the workers load the task library " + library + ": it must be at that path on every node)";
        sent = answer(it->id, proto::kFailed, message);
      }
      pending.erase(it);
      if (!sent) return false;
      break;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ADDRESS PIPELINE (started by evenflow's RayBatches, protocol on fd 3)\n", argv[0]);
    return 2;
  }
  const std::string pipeline = argv[2];
  ray::RayConfig config;
  config.address = argv[1];
  // Workers load the task library from where this driver found it (the same path on every node).
  const std::string library = task::TaskLibrary();
  config.code_search_path = {std::filesystem::path(library).parent_path().string()};
  try {
    ray::Init(config);
  } catch (const std::exception& e) {
    answer(proto::kReady, proto::kFailed, e.what());
    return 1;
  }
  int rc = 0;
  if (answer(proto::kReady, proto::kOk, "")) {
    std::list<Pending> pending;
    for (;;) {
      pollfd p{kSocket, POLLIN, 0};
      // Block for a request when nothing is in flight; otherwise only look, and wait on the tasks.
      const int n = ::poll(&p, 1, pending.empty() ? -1 : 0);
      if (n < 0 && errno != EINTR) break;
      if (n > 0 && !submit(pipeline, pending)) break;
      if (n <= 0 && !pending.empty() && !answer_finished(pending, 5, library)) break;
    }
  } else {
    rc = 1;
  }
  ray::Shutdown();
  return rc;
}
