// ProcessGroup over MPI (Note [Processes] in process_group.h). Built only where CMake found MPI.
//
// Note [MPI from several threads]
// Several threads of a process use MPI: each device communicator's last-arriving rank, and each
// model's gradient thread. MPI_THREAD_SERIALIZED is enough: one mutex guards every MPI call, and no
// thread holds it while it waits, because every collective is nonblocking (MPI_I*) and waited for by
// polling MPI_Test with the mutex taken only around each call. A blocking call under the mutex would
// deadlock two channels whose calls the processes make in different orders; polling also gives the
// timeout and lets a waiting call notice, at every poll, a failure another process reported (fail():
// a message on a channel of its own). Open MPI progresses nonblocking collectives only inside MPI
// calls, so the poll spins (yielding) for its first millisecond, then sleeps 50 µs between polls.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "evenflow/parallel/process_group_internal.h"

namespace evenflow::parallel {

bool multi_process_support() {
  return true;
}

namespace {

std::mutex g_mpi;  // guards every MPI call (Note [MPI from several threads])

constexpr int kFailureTag = 7001;
constexpr int kRingTag = 7002;  // all_reduce's messages, on the channel's own communicator

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

#define EF_MPI_CHECK(call, what)                                                                  \
  do {                                                                                            \
    const int ef_mpi_code = (call);                                                               \
    EF_CHECK(ef_mpi_code == MPI_SUCCESS, what, ": ", #call, " failed: ", mpi_error(ef_mpi_code)); \
  } while (false)

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case kFloat32:
      return MPI_FLOAT;
    case kFloat64:
      return MPI_DOUBLE;
    case kInt64:
      return MPI_INT64_T;
    default:
      break;
  }
  EF_ERROR("MPI: no MPI type for ", dtype_name(t));
}

// What the job shares: MPI's state, the failure channel and the first failure heard of.
struct Job {
  int rank = 0;
  int size = 1;
  MPI_Comm failures = MPI_COMM_NULL;  // fail()'s messages
  std::string failed;                 // the first failure another process reported (guarded by g_mpi)
  bool this_failed = false;           // fail() was called here: end with MPI_Abort, not MPI_Finalize
  std::vector<MPI_Request> notices;   // fail()'s sends

  Job() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      EF_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI");
    }
    EF_CHECK(provided >= MPI_THREAD_SERIALIZED,
             "MPI: evenflow calls MPI from several threads, one at a time, and needs MPI_THREAD_SERIALIZED; this "
             "MPI library offers only level ",
             provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    EF_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI");
    EF_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI");
    EF_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &failures), "MPI");
  }

  ~Job() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // A process that failed ends the job (the launcher stops the others, which have heard why);
    // a clean one waits for the others in MPI_Finalize.
    if (this_failed) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }

  // Takes one failure notice another process sent, if one has arrived, keeping the first as
  // `failed`. Caller holds g_mpi.
  void take_notice() {
    int flag = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, failures, &flag, &status);
    if (!flag) return;
    int len = 0;
    MPI_Get_count(&status, MPI_CHAR, &len);
    std::string why(static_cast<size_t>(len), '\0');
    MPI_Recv(why.data(), len, MPI_CHAR, status.MPI_SOURCE, kFailureTag, failures, MPI_STATUS_IGNORE);
    if (failed.empty()) failed = detail::str_cat("process ", status.MPI_SOURCE, " of ", size, " failed: ", why);
  }

  // Throws the failure another process reported, if any. Caller holds g_mpi.
  void check_failures(const char* op) {
    if (failed.empty() && size > 1) take_notice();
    EF_CHECK(failed.empty(), op, " on process ", rank, ": ", failed);
  }
};

Job& job() {
  static Job the_job;
  return the_job;
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, int rank, int size) : ProcessGroup(rank, size), comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiProcessGroup() override {
    // A channel with a call left pending (a timeout, a failure) cannot be freed safely.
    if (broken_.empty()) {
      std::lock_guard<std::mutex> lock(g_mpi);
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm_);
    }
  }
  const char* kind() const override { return "mpi"; }

  std::shared_ptr<ProcessGroup> duplicate() override {
    const Call call(*this, "duplicate");
    const auto copy = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    MPI_Request request;
    {
      std::lock_guard<std::mutex> lock(g_mpi);
      EF_MPI_CHECK(MPI_Comm_idup(comm_, copy.get(), &request), "duplicate");
    }
    wait(&request, 1, "duplicate", {.tensors = {}, .memory = copy});
    auto group = std::make_shared<MpiProcessGroup>(*copy, rank(), size());
    group->set_timeout(timeout());
    return group;
  }

  // Note [Ring all-reduce]
  // x is cut into size() chunks. Reduce-scatter: in step s each process sends chunk (rank - s) to
  // the next process and adds the previous one's chunk (rank - s - 1) into its own, so after
  // size() - 1 steps process r holds the whole sum of chunk r + 1. All-gather: the finished chunks
  // travel the same ring, received straight into x. Each chunk's sum is added up once, in one order
  // (along the ring), and copied to the others, so every process gets the same bits, which
  // MPI_Allreduce does not promise. It is built on MPI_Isend/MPI_Irecv because Open MPI's
  // nonblocking collectives (MPI_Iallreduce among them) are slow, and a blocking one cannot be
  // waited for with a timeout (Note [MPI from several threads]); this ring matches the blocking
  // MPI_Allreduce (docs/benchmarks.md, "Data parallel across processes").
  void all_reduce(const Tensor& x) override {
    check_host_tensor("all_reduce", x);
    const Call call(*this, "all_reduce");
    if (size() == 1 || x.numel() == 0) return;
    const int p = size();
    const int64_t n = x.numel();
    const auto chunk_start = [&](int c) { return n / p * c + std::min<int64_t>(c, n % p); };
    const auto chunk_size = [&](int c) { return chunk_start(c + 1) - chunk_start(c); };
    EF_CHECK(chunk_size(0) <= INT32_MAX, "all_reduce: ", n, " elements is more than MPI's int counts hold per process");
    const MPI_Datatype type = mpi_type(x.dtype());
    const size_t esize = dtype_size(x.dtype());
    char* data = static_cast<char*>(x.data_ptr());
    const auto at = [&](int c) { return data + static_cast<size_t>(chunk_start(c)) * esize; };
    const auto incoming = std::make_shared<std::vector<char>>(static_cast<size_t>(chunk_size(0)) * esize);
    const int next = (rank() + 1) % p, previous = (rank() + p - 1) % p;
    const auto exchange = [&](const char* send, int send_chunk, char* receive, int receive_chunk) {
      MPI_Request requests[2];
      {
        std::lock_guard<std::mutex> lock(g_mpi);
        EF_MPI_CHECK(MPI_Irecv(receive, static_cast<int>(chunk_size(receive_chunk)), type, previous, kRingTag, comm_,
                               &requests[0]),
                     "all_reduce");
        EF_MPI_CHECK(
            MPI_Isend(send, static_cast<int>(chunk_size(send_chunk)), type, next, kRingTag, comm_, &requests[1]),
            "all_reduce");
      }
      wait(requests, 2, "all_reduce", {.tensors = {x}, .memory = incoming});
    };
    for (int s = 0; s < p - 1; ++s) {
      const int send = (rank() - s + p) % p, receive = (rank() - s - 1 + p) % p;
      exchange(at(send), send, incoming->data(), receive);
      add_host(at(receive), incoming->data(), chunk_size(receive), x.dtype());
    }
    for (int s = 0; s < p - 1; ++s) {
      const int send = (rank() + 1 - s + p) % p, receive = (rank() - s + p) % p;
      exchange(at(send), send, at(receive), receive);
    }
  }

  void broadcast(const Tensor& x, int root) override {
    check_host_tensor("broadcast", x);
    EF_CHECK(root >= 0 && root < size(), "broadcast: root process ", root, " is out of range for ", size(),
             " processes");
    const Call call(*this, "broadcast");
    if (size() == 1 || x.numel() == 0) return;
    EF_CHECK(x.numel() <= INT32_MAX, "broadcast: ", x.numel(), " elements is more than MPI's int counts hold");
    MPI_Request request;
    {
      std::lock_guard<std::mutex> lock(g_mpi);
      EF_MPI_CHECK(MPI_Ibcast(x.data_ptr(), static_cast<int>(x.numel()), mpi_type(x.dtype()), root, comm_, &request),
                   "broadcast");
    }
    wait(&request, 1, "broadcast", {.tensors = {x}, .memory = nullptr});
  }

  Tensor all_gather(const Tensor& x) override {
    check_host_tensor("all_gather", x);
    EF_CHECK(x.dim() >= 1, "all_gather: needs at least one dim, got a scalar");
    const Call call(*this, "all_gather");
    Shape shape = x.shape();
    shape[0] *= size();
    Tensor out = empty(shape, {.dtype = x.dtype()});
    if (x.numel() == 0) return out;
    EF_CHECK(out.numel() <= INT32_MAX, "all_gather: ", out.numel(), " elements is more than MPI's int counts hold");
    const MPI_Datatype type = mpi_type(x.dtype());
    MPI_Request request;
    {
      std::lock_guard<std::mutex> lock(g_mpi);
      EF_MPI_CHECK(MPI_Iallgather(x.data_ptr(), static_cast<int>(x.numel()), type, out.data_ptr(),
                                  static_cast<int>(x.numel()), type, comm_, &request),
                   "all_gather");
    }
    wait(&request, 1, "all_gather", {.tensors = {x, out}, .memory = nullptr});
    return out;
  }

  std::string broadcast_bytes(const std::string& bytes, int root) override {
    EF_CHECK(root >= 0 && root < size(), "broadcast_bytes: root process ", root, " is out of range for ", size(),
             " processes");
    const Call call(*this, "broadcast_bytes");
    if (size() == 1) return bytes;
    const auto length = std::make_shared<int64_t>(static_cast<int64_t>(bytes.size()));
    MPI_Request request;
    {
      std::lock_guard<std::mutex> lock(g_mpi);
      EF_MPI_CHECK(MPI_Ibcast(length.get(), 1, MPI_INT64_T, root, comm_, &request), "broadcast_bytes");
    }
    wait(&request, 1, "broadcast_bytes", {.tensors = {}, .memory = length});
    EF_CHECK(*length >= 0 && *length <= INT32_MAX, "broadcast_bytes: ", *length,
             " bytes is more than MPI's counts hold");
    const auto out =
        std::make_shared<std::string>(rank() == root ? bytes : std::string(static_cast<size_t>(*length), '\0'));
    {
      std::lock_guard<std::mutex> lock(g_mpi);
      EF_MPI_CHECK(MPI_Ibcast(out->data(), static_cast<int>(*length), MPI_CHAR, root, comm_, &request),
                   "broadcast_bytes");
    }
    wait(&request, 1, "broadcast_bytes", {.tensors = {}, .memory = out});
    return *out;
  }

  void fail(const std::string& why) noexcept override {
    try {
      Job& j = job();
      std::unique_lock<std::mutex> lock(g_mpi);
      if (j.this_failed) return;
      j.this_failed = true;
      // Synchronous sends: complete once the other process has taken the message, so it has heard
      // why before the launcher stops it. A few seconds at most: some may be gone already.
      static std::string message;
      message = why;
      for (int p = 0; p < j.size; ++p) {
        if (p == j.rank) continue;
        MPI_Request r;
        if (MPI_Issend(message.data(), static_cast<int>(message.size()), MPI_CHAR, p, kFailureTag, j.failures, &r) ==
            MPI_SUCCESS)
          j.notices.push_back(r);
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      while (std::chrono::steady_clock::now() < deadline) {
        int all = 0;
        MPI_Testall(static_cast<int>(j.notices.size()), j.notices.data(), &all, MPI_STATUSES_IGNORE);
        if (all) break;
        // Take the others' notices too: when every process fails at once, each waits for the others.
        j.take_notice();
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
      }
    } catch (...) {
    }
  }

 private:
  // One call at a time on a channel (Note [Processes]); and none on a broken one.
  class Call {
   public:
    Call(MpiProcessGroup& g, const char* op) : g_(g) {
      EF_CHECK(g_.broken_.empty(), op, " on process ", g_.rank(),
               ": this channel is unusable after an earlier error: ", g_.broken_);
      EF_CHECK(!g_.busy_.exchange(true), op, " on process ", g_.rank(),
               ": another thread is in a call on this channel; its calls must come one at a time");
    }
    ~Call() { g_.busy_ = false; }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    MpiProcessGroup& g_;
  };

  // What a call's requests read or write: when the call fails its requests stay pending (MPI cannot
  // cancel a collective, and a late message may still arrive), so wait() keeps these alive, with
  // the channel, instead of letting the caller free them.
  struct InFlight {
    std::vector<Tensor> tensors;
    std::shared_ptr<void> memory;
  };

  // Waits for `count` requests (Note [MPI from several threads]); on failure keeps `in_flight`.
  void wait(MPI_Request* requests, int count, const char* op, InFlight in_flight) {
    try {
      wait_for(requests, count, op);
    } catch (...) {
      left_in_flight_.push_back(std::move(in_flight));
      throw;
    }
  }

  void wait_for(MPI_Request* requests, int count, const char* op) {
    Job& j = job();
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout();
    for (;;) {
      int done = 0;
      {
        std::lock_guard<std::mutex> lock(g_mpi);
        try {
          j.check_failures(op);
        } catch (const Error& e) {
          broken_ = e.what();
          throw;
        }
        const int code = MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
        if (code != MPI_SUCCESS) {
          broken_ = detail::str_cat(op, " on process ", rank(), ": MPI failed: ", mpi_error(code));
          throw Error(broken_);
        }
      }
      if (done) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        broken_ = detail::str_cat(op, " on process ", rank(), " of ", size(), " timed out after ", timeout().count(),
                                  " ms waiting for the other processes");
        throw Error(broken_);
      }
      if (now - start < std::chrono::milliseconds(1)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  MPI_Comm comm_;
  std::atomic<bool> busy_{false};
  std::string broken_;                    // why this channel is unusable (a call left pending)
  std::vector<InFlight> left_in_flight_;  // the failed calls' buffers (see wait)
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_process_group() {
  Job& j = job();
  MPI_Comm comm = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(g_mpi);
    EF_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI");
  }
  return std::make_shared<MpiProcessGroup>(comm, j.rank, j.size);
}

}  // namespace evenflow::parallel
