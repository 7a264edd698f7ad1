// NcclDouble: a c10d backend for CPU tests that completes point-to-point
// ops the way NCCL does, over a real Gloo group that carries the bytes. It
// is how every GPU bug of the "read before it landed" class fails on a CPU
// (issue 26): NCCL cannot run between two ranks on the one-GPU machine.
//
// What it enforces, each as NCCL would behave:
//   - A receive buffer is filled with 0xFF bytes (NaN for floats, -1 for
//     integers) when the recv is issued, and gets its data only when the
//     Work NCCL would complete is waited on: the Work endCoalescing()
//     returns, or outside a coalescing group the op's own Work.
//   - Inside a coalescing group, the per-op Works send/recv return are
//     never completed: wait() returns at once and delivers nothing (NCCL's
//     per-op end event is recorded before the group's kernel launches), so
//     code that waits on them reads poison.
//   - At endCoalescing, the two ranks of every pair exchange the list of
//     their ops to each other (bytes and dtype, in order) and both throw
//     c10::DistBackendError when the sends of one and the receives of the
//     other do not pair in the same order (NCCL would hang or deliver the
//     wrong bytes).
//   - Collectives (broadcast, all-reduce, reduce, all-gather, gather,
//     scatter, reduce-scatter, all-to-all, barrier) go straight to Gloo:
//     their Works complete them, as NCCL's do. Inside a coalescing group
//     they are refused.
// The bytes move at endCoalescing (the host blocks there, as Gloo does);
// only their delivery into the caller's buffers waits for wait().
// dynmo-train selects it with --backend=nccl-double (the transport then
// also stages every tensor through a separate buffer, as it stages a CPU
// tensor for NCCL: process_group_transport.h); Python selects it as the
// torch.distributed backend "nccl-double" (dynmo.nccl_double.register(),
// python/torch_src/). Not thread-safe: one thread drives a group, as with
// any c10d backend.
#ifndef DYNMO_TRAINER_COMM_NCCL_DOUBLE_H_
#define DYNMO_TRAINER_COMM_NCCL_DOUBLE_H_

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace dynmo::trainer {

// The double over `carrier` (a Gloo group of CPU tensors), with its rank and
// size.
c10::intrusive_ptr<c10d::Backend> MakeNcclDouble(
    c10::intrusive_ptr<c10d::Backend> carrier);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_COMM_NCCL_DOUBLE_H_
