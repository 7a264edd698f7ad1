"""``"nccl-double"``: a ``torch.distributed`` backend for CPU tests of code
written for NCCL. It is the C++ double of ``trainer/comm/nccl_double.h``
(``dynmo._nccl_double``), a Gloo group underneath that completes
point-to-point ops the way NCCL does:

- a received tensor holds 0xFF bytes (NaN for floats, -1 for integers) from
  the moment the receive is issued until the Work NCCL would complete is
  waited on: the one Work of ``dist.batch_isend_irecv`` (its coalescing
  group's), or outside a batch the op's own (``irecv(...).wait()``);
- within a batch, the two ranks of every pair must list their ops to each
  other in the same order with the same sizes and dtypes, or both raise
  ``torch.distributed.DistBackendError`` ("do not pair");
- collectives (broadcast, all-reduce, all-gather, barrier, ...) run on Gloo
  and complete at their Work's wait, as NCCL's do; a collective inside a
  batch is refused.

Tensors are CPU tensors, contiguous for point-to-point ops::

    import dynmo.nccl_double
    dynmo.nccl_double.register()             # in every rank, before init
    dist.init_process_group("nccl-double", ...)
    dist.new_group(ranks, backend="nccl-double")

``dynmo._nccl_double`` is built with the package only where CMake found
LibTorch (python/CMakeLists.txt).
"""

__all__ = ["NAME", "register"]

NAME = "nccl-double"


def register() -> str:
    """Registers the double with ``torch.distributed`` under :data:`NAME`
    for CPU tensors, once per process (later calls do nothing), and returns
    the name. Raises ImportError when ``dynmo._nccl_double`` was not built."""
    import torch.distributed as dist
    if NAME.upper() in dist.Backend._plugins:
        return NAME
    try:
        from dynmo import _nccl_double
    except ImportError as e:
        raise ImportError(
            "dynmo._nccl_double is not built: the build needs LibTorch "
            "(configure with scripts/cmake-torch-args.sh)") from e
    dist.Backend.register_backend(NAME, _nccl_double.create_backend, devices=["cpu"])
    return NAME
