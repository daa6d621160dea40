// The CUDA backend's entry points, as seen from dispatch.cpp (plain C++: no CUDA headers here, so
// g++-compiled files can include it). A backend is one logical CUDA device: a physical GPU plus its
// own stream and library handles (see Note [Logical CUDA devices] in device.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "evenflow/engine/backend.h"
#include "evenflow/engine/capture_internal.h"

namespace evenflow::cuda_backend {

// The backend of logical device cuda:<logical_index>, running on GPU <physical_id>.
std::unique_ptr<Backend> make_backend(int logical_index, int physical_id);

// Number of physical GPUs. Never throws: on any error (no driver, driver too old, no device) it
// returns 0 and, when why_none is not null, stores the reason there.
int physical_device_count(std::string* why_none);

// Copies nbytes from src (on src_backend's GPU) to dst (on dst_backend's GPU). Stream-ordered, without
// waiting on the host: the copy runs after the work queued on both devices, and the work either
// device queues afterwards runs after the copy, so either side may free or overwrite its buffer
// right away (its memory is reused only through its device's stream: the caching allocator is per
// logical device, each with one stream). Between the GPUs of an NCCL communicator, see Note [Peer
// copies and collectives] in cuda_backend.cu.
void copy_peer(Backend& dst_backend, void* dst, Backend& src_backend, const void* src, size_t nbytes);

// Starts recording the work of `backends` (CUDA logical devices of one GPU) into one CUDA graph
// (cuda_graph.cu: Note [Recording CUDA devices]).
std::unique_ptr<::evenflow::detail::DeviceRecording> begin_recording(const std::vector<Backend*>& backends);

}  // namespace evenflow::cuda_backend
