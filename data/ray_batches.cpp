// RayBatches: the driver process, the socket to it and the thread that reads its answers.
#include "evenflow/data/ray_batches.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "data/ray/protocol.h"
#include "evenflow/data/pipeline.h"
#include "evenflow/engine/error.h"

extern char** environ;

namespace evenflow::data {

namespace proto = ray_protocol;
using Clock = std::chrono::steady_clock;

// Note [Ray preprocessing]
// The trainer never links Ray. RayBatches starts `ef_ray_driver ADDRESS PIPELINE` with one end of a
// socket pair as its fd 3 (protocol.h); the driver connects to the cluster, and for each request
// submits a task (data/ray/task.cpp) that makes the batch on a worker: the worker builds the
// pipeline from its description once (cached per process) and runs make_batch, which draws each
// image's random numbers from (seed, epoch, dataset index), so where the task runs, and whether Ray
// ran it twice after a worker died, changes nothing in the bits. The batch comes back encoded
// (encode_batch: magic number and CRC-32), because Ray hands some failures to the caller as a
// result. The DataLoader orders the batches; this class only pairs answers with requests (by id)
// and turns every way the chain can break into an ef::Error with the address: the driver missing
// or ending (its stderr, saved to a file, is quoted), no ready message within connect_timeout_s,
// no answer within batch_timeout_s, a task that threw (its message).
struct RayBatches::Connection {
  struct Answer {
    uint32_t status = proto::kOk;
    std::string bytes;
  };

  const RayOptions& options;
  int fd = -1;              // our end of the socket pair
  std::string stderr_path;  // the driver's stderr and stdout
  std::thread reader;

  // The driver process: reaped by whichever thread sees it end first (the reader at the end of the
  // stream, or stop()), the other reads how it ended.
  std::mutex process_mu;
  pid_t pid = -1;
  std::string ended;  // "exit status 1", "killed by signal 9", once reaped

  std::mutex mu;
  std::condition_variable cv;
  std::optional<Answer> ready;                        // the driver's first message
  std::map<uint64_t, std::optional<Answer>> waiting;  // requests sent, by id, and their answers
  uint64_t next_id = 1;
  std::optional<std::string> broken;  // why the driver can no longer answer
  std::mutex write_mu;

  explicit Connection(const RayOptions& o) : options(o) {}

  std::string driver_output() const {
    std::ifstream in(stderr_path);
    std::stringstream s;
    s << in.rdbuf();
    std::string text = s.str();
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (text.size() > 1500) text = "..." + text.substr(text.size() - 1500);
    return text.empty() ? std::string() : "; the driver said: " + text;
  }

  // How the driver process ended, waiting for it up to `seconds` ("" if it is still running).
  std::string reap(double seconds) {
    std::lock_guard<std::mutex> lock(process_mu);
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (pid > 0) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        pid = -1;
        ended = WIFEXITED(status)     ? "exit status " + std::to_string(WEXITSTATUS(status))
                : WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                      : "ended";
      } else if (r < 0 || Clock::now() >= until) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return ended;
  }

  void kill_driver() {
    std::lock_guard<std::mutex> lock(process_mu);
    if (pid > 0) ::kill(pid, SIGKILL);
  }

  void read_answers() {
    for (;;) {
      proto::ResponseHeader h{};
      Answer a;
      bool ok = proto::read_exact(fd, &h, sizeof(h));
      if (ok) {
        a.status = h.status;
        a.bytes.resize(h.size);
        ok = proto::read_exact(fd, a.bytes.data(), a.bytes.size());
      }
      if (!ok) {
        const std::string how = reap(5.0);  // without `mu`: callers may give up meanwhile
        std::lock_guard<std::mutex> lock(mu);
        broken = "the Ray driver " + options.driver + " stopped answering" + (how.empty() ? "" : " (" + how + ")") +
                 driver_output();
        cv.notify_all();
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (h.id == proto::kReady) {
        ready = std::move(a);
      } else if (auto it = waiting.find(h.id); it != waiting.end()) {
        it->second = std::move(a);
      }  // else: a request that timed out; its late answer is dropped
      cv.notify_all();
    }
  }

  void start() {
    int pair[2];
    EF_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0, "RayBatches: socketpair failed");
    fd = pair[0];
    char path[] = "/tmp/ef_ray_driver_XXXXXX";
    const int log = ::mkstemp(path);
    if (log < 0) {
      ::close(pair[1]);
      EF_ERROR("RayBatches: cannot create a file for the driver's output in /tmp");
    }
    stderr_path = path;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, log, 1);
    posix_spawn_file_actions_adddup2(&actions, log, 2);
    posix_spawn_file_actions_adddup2(&actions, pair[1], 3);
    std::vector<std::string> args = {options.driver, options.address, options.pipeline};
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int rc = ::posix_spawn(&pid, options.driver.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pair[1]);
    ::close(log);
    if (rc != 0) {
      pid = -1;
      EF_ERROR("RayBatches: cannot start the Ray driver ", options.driver, ": ", std::strerror(rc));
    }
    reader = std::thread([this] { read_answers(); });
  }

  void wait_ready() {
    std::unique_lock<std::mutex> lock(mu);
    const bool answered = cv.wait_for(lock, std::chrono::duration<double>(options.connect_timeout_s),
                                      [&] { return ready.has_value() || broken.has_value(); });
    if (!answered) {
      lock.unlock();
      stop(0.0);
      EF_ERROR("RayBatches: no Ray cluster answered at ", options.address, " within ", options.connect_timeout_s,
               " s (is it running? `ray start --head` prints its address)", driver_output());
    }
    if (broken) EF_ERROR("RayBatches: could not connect to the Ray cluster at ", options.address, ": ", *broken);
    if (ready->status != proto::kOk)
      EF_ERROR("RayBatches: could not connect to the Ray cluster at ", options.address, ": ", ready->bytes);
  }

  // Closes our end, which tells the driver to disconnect and exit; kills it after `grace` seconds.
  void stop(double grace) {
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    if (reap(grace).empty()) {
      kill_driver();
      reap(10.0);
    }
    if (reader.joinable()) reader.join();
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  Batch make(const std::vector<int64_t>& indices, uint64_t seed, uint64_t epoch) {
    const std::string what = "the batch of " + std::to_string(indices.size()) + " examples from dataset index " +
                             (indices.empty() ? std::string("-") : std::to_string(indices[0])) +
                             " on the Ray cluster at " + options.address;
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (broken) EF_ERROR(what, ": ", *broken);
      id = next_id++;
      waiting[id];
    }
    {
      std::lock_guard<std::mutex> lock(write_mu);
      const proto::RequestHeader h{id, seed, epoch, indices.size()};
      // A failed write means the driver is gone; the reader thread says why.
      if (proto::write_exact(fd, &h, sizeof(h)))
        proto::write_exact(fd, indices.data(), indices.size() * sizeof(int64_t));
    }
    std::unique_lock<std::mutex> lock(mu);
    const bool answered = cv.wait_for(lock, std::chrono::duration<double>(options.batch_timeout_s),
                                      [&] { return waiting[id].has_value() || broken.has_value(); });
    std::optional<Answer> a = std::move(waiting[id]);
    waiting.erase(id);
    lock.unlock();
    if (a && a->status == proto::kOk) return decode_batch(a->bytes, what);
    if (a) EF_ERROR(what, " failed: ", a->bytes);
    if (!answered) EF_ERROR(what, ": no answer within ", options.batch_timeout_s, " s");
    EF_ERROR(what, ": ", *broken);
  }
};

std::string resolve_ray_address(const std::string& given, const std::string& current_cluster) {
  const auto cluster_file_address = [&]() -> std::string {
    std::ifstream in(current_cluster);
    std::string line;
    if (!in || !std::getline(in, line)) return "";
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    return line;
  };
  std::string address = given;
  if (address.empty() || address == "auto") {
    const char* env = std::getenv("RAY_ADDRESS");
    address = env != nullptr && *env != '\0' && std::string(env) != "auto" ? env : cluster_file_address();
    EF_CHECK(!address.empty(),
             "Ray: no cluster address: RAY_ADDRESS is not set and no cluster was started on this "
             "machine (",
             current_cluster, " is missing); start one with `ray start --head` or give its ip:port");
  }
  EF_CHECK(address.rfind("ray://", 0) != 0, "Ray: ", address,
           " is a Ray Client address, which Ray's C++ API cannot use; give the cluster's own address (ip:port, as "
           "`ray start --head` prints it, port 6379 by default)");
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  EF_CHECK(
      !host.empty() && !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos,
      "Ray: '", address, "' is not an address ip:port (as `ray start --head` prints it)");
  if (host == "localhost" || host == "127.0.0.1") {
    // Ray registers a node under its network address, and its C++ client must dial that one.
    const std::string local = cluster_file_address();
    if (local.size() > port.size() && local.compare(local.size() - port.size() - 1, std::string::npos, ":" + port) == 0)
      return local;
  }
  return address;
}

RayBatches::RayBatches(RayOptions options) : options_(std::move(options)) {
  if (options_.driver.empty()) options_.driver = built_driver();
  EF_CHECK(!options_.driver.empty(),
           "RayBatches: this evenflow was built without Ray (configure with -DEF_RAY=ON after "
           "`bash scripts/setup.sh --ray`)");
  EF_CHECK(::access(options_.driver.c_str(), X_OK) == 0, "RayBatches: the Ray driver ", options_.driver,
           " is missing or not executable");
  options_.address = resolve_ray_address(options_.address);
  EF_CHECK(options_.connect_timeout_s > 0 && options_.batch_timeout_s > 0, "RayBatches: timeouts must be positive");
  connection_ = std::make_unique<Connection>(options_);
  try {
    connection_->start();
    connection_->wait_ready();
  } catch (...) {
    connection_->stop(0.0);
    throw;
  }
}

RayBatches::~RayBatches() {
  if (connection_) connection_->stop(15.0);
  if (connection_ && !connection_->stderr_path.empty()) std::remove(connection_->stderr_path.c_str());
}

Batch RayBatches::make(const std::vector<int64_t>& indices, uint64_t seed, uint64_t epoch) const {
  return connection_->make(indices, seed, epoch);
}

std::string RayBatches::built_driver() {
#ifdef EF_RAY_DRIVER
  return EF_RAY_DRIVER;
#else
  return "";
#endif
}

}  // namespace evenflow::data
