/// @file
/// RayBatches: batches made by a Ray cluster (Dpex's design: the data pipeline's CPU work on other
/// machines). A DataLoader given one (DataLoaderOptions::ray) sends each batch's dataset indices to
/// the cluster and gets the finished batch back; the cluster's workers rebuild the pipeline from a
/// text description (`pipeline`, e.g. the programs' apps/common/pipelines.h) and run make_batch, so
/// the batch is the same bits as one made here (Note [Ray preprocessing] in ray_batches.cpp).
///
/// The Ray client runs in a helper process, `ef_ray_driver` (built with -DEF_RAY=ON), that this
/// class starts and talks to over a socket: Ray's C++ library needs the old libstdc++ string ABI and
/// ends its process when a cluster cannot be reached, and neither may touch the training process.
/// Every failure (no driver, a cluster that does not answer, a task that throws, a driver that
/// dies) ends in an ef::Error naming the address, path or batch, within the stated timeouts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "evenflow/data/dataset.h"

namespace evenflow::data {

/// Where and how RayBatches reaches a cluster.
struct RayOptions {
  /// A running cluster's "ip:port", as `ray start --head` prints it, or "auto" (resolve_ray_address)
  std::string address = {};
  std::string pipeline = {};       ///< what the workers build the pipeline from (the task library's make_pipeline)
  std::string driver = {};         ///< the ef_ray_driver executable; empty: the one this build made
  double connect_timeout_s = 120;  ///< for the driver to connect to the cluster
  double batch_timeout_s = 600;    ///< for one batch, retries of a lost worker included
};

/// The address Ray's C++ client needs, from what a user gives: "auto" (or empty) is RAY_ADDRESS,
/// else the cluster started last on this machine (what `ray start --head` writes to
/// `current_cluster`); "localhost:PORT" and "127.0.0.1:PORT" name the local node, whose address
/// (the one Ray registered, read from `current_cluster` when its port matches) is what the client
/// must dial. ef::Error, saying what to give instead, for no address to be found, a Ray Client
/// address ("ray://..."), or text that is not host:port.
std::string resolve_ray_address(const std::string& given,
                                const std::string& current_cluster = "/tmp/ray/ray_current_cluster");

/// A connection to a Ray cluster that makes batches (see the file's description). make() may be
/// called from several threads at once: each call is one task on the cluster, and as many run at
/// a time as there are callers (a DataLoader's workers).
class RayBatches {
 public:
  /// Starts the driver and waits until it has connected to the cluster. ef::Error when the driver is
  /// missing (evenflow was built without -DEF_RAY=ON), the address is empty, or the cluster does not
  /// answer within connect_timeout_s; the message names the address and quotes the driver's own.
  explicit RayBatches(RayOptions options);
  /// Ends the driver (it disconnects from the cluster); tasks in flight are dropped.
  ~RayBatches();
  RayBatches(const RayBatches&) = delete;
  RayBatches& operator=(const RayBatches&) = delete;

  /// The examples at `indices`, transformed for epoch `epoch` with `seed` (make_batch on a worker of
  /// the cluster). ef::Error naming the first index and the address when the task threw, the driver
  /// or the cluster failed, or no answer came within batch_timeout_s.
  Batch make(const std::vector<int64_t>& indices, uint64_t seed, uint64_t epoch) const;

  /// The options it was made with, the address resolved (resolve_ray_address): the one it dialed.
  const RayOptions& options() const { return options_; }

  /// The ef_ray_driver this build made, or "" when it was built without -DEF_RAY=ON.
  static std::string built_driver();

 private:
  struct Connection;  ///< the driver process, its socket and the reader thread (ray_batches.cpp)
  RayOptions options_;
  std::unique_ptr<Connection> connection_;
};

}  // namespace evenflow::data
