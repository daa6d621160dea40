// ef_ray_driver ADDRESS PIPELINE: the Ray client of RayBatches (data/ray_batches.h), in a process of
// its own, speaking protocol.h on fd 3. It connects to the cluster at ADDRESS, says it is ready, then
// submits a MakeBatch task per request and answers each as it completes, in any order (a task whose
// worker died is submitted again first, up to kSubmissions times in all). It exits when fd 3 closes
// (the trainer ended or let go), disconnecting from the cluster.
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

// How many times a batch's task is submitted before a worker that keeps dying fails the batch.
// Ray's C++ API retries a task whose worker died only once, and a retry can land on a worker that
// dies too (every worker killed at once: CI saw batch 11 fail that way, Ray's message empty).
// The task is deterministic (Note [Ray preprocessing] in ray_batches.cpp), so submitting it again
// changes no bit of the batch.
constexpr int kSubmissions = 4;

struct Pending {
  proto::RequestHeader request{};
  std::vector<int64_t> indices;
  ray::ObjectRef<std::string> result;
  int submissions = 0;
};

// Submits (again) the task of `p`. The reference is copied, never moved: moving a fresh ObjectRef
// breaks Ray 2.60's reference counting for results in the object store (ray-cpp.md, pitfall 2).
void submit(const std::string& pipeline, Pending& p) {
  const ray::ObjectRef<std::string> ref =
      ray::Task(task::MakeBatch).Remote(pipeline, p.indices, p.request.seed, p.request.epoch);
  p.result = ref;
  ++p.submissions;
}

// Reads one request and submits its task; false when the socket has closed.
bool read_request(const std::string& pipeline, std::list<Pending>& pending) {
  proto::RequestHeader h{};
  if (!proto::read_exact(kSocket, &h, sizeof(h))) return false;
  std::vector<int64_t> indices(h.count);
  if (!proto::read_exact(kSocket, indices.data(), indices.size() * sizeof(int64_t))) return false;
  // Made in place and submitted there: list nodes never move (see submit).
  Pending& p = pending.emplace_back();
  p.request = h;
  p.indices = std::move(indices);
  submit(pipeline, p);
  return true;
}

// Ray's message, or what the exception means when Ray gave none (a dead worker's is often empty).
std::string message_of(const std::exception& e, const char* meaning) {
  const std::string message = e.what();
  return message.empty() ? std::string(meaning) : message;
}

// Answers the tasks that have finished, waiting up to `timeout_ms` for the first, and submits again
// those whose worker died or whose result was lost; false when the socket has closed. `library`:
// the task library's path, for the message when workers lack it.
bool answer_finished(const std::string& pipeline, std::list<Pending>& pending, int timeout_ms,
                     const std::string& library) {
  std::vector<ray::ObjectRef<std::string>> refs;
  for (const Pending& p : pending) refs.push_back(p.result);
  const ray::WaitResult<std::string> done = ray::Wait(refs, 1, timeout_ms);
  for (const auto& ready : done.ready) {
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      if (it->result.ID() != ready.ID()) continue;
      std::string lost;  // why the batch did not come back, when submitting it again may help
      try {
        if (!answer(it->request.id, proto::kOk, *ray::Get(it->result))) return false;
      } catch (const ray::internal::RayWorkerException& e) {
        lost = "its Ray worker died on each of " + std::to_string(it->submissions) + " submissions (" +
               message_of(e, "Ray gave no reason") + ")";
      } catch (const ray::internal::UnreconstructableException& e) {
        lost = "its result was lost on each of " + std::to_string(it->submissions) + " submissions (" +
               message_of(e, "Ray gave no reason") + ")";
      } catch (const std::exception& e) {
        // The task threw (the pipeline's own error) or the workers lack the task library: no
        // second submission would do better.
        std::string message = message_of(e, "the task failed and Ray gave no reason");
        if (message.find("RayFunctionNotFound") != std::string::npos)
          message += " (the workers load the task library " + library + ": it must be at that path on every node)";
        if (!answer(it->request.id, proto::kFailed, message)) return false;
      }
      if (!lost.empty() && it->submissions < kSubmissions) {
        submit(pipeline, *it);
        break;
      }
      if (!lost.empty() && !answer(it->request.id, proto::kFailed, lost)) return false;
      pending.erase(it);
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
      if (n > 0 && !read_request(pipeline, pending)) break;
      if (n <= 0 && !pending.empty() && !answer_finished(pipeline, pending, 5, library)) break;
    }
  } else {
    rc = 1;
  }
  ray::Shutdown();
  return rc;
}
