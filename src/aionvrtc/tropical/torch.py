"""PyTorch autograd for tropical matmul (the optional ``torch`` extra).

``aionvrtc.tropical.torch.matmul(a, b, semiring)`` takes CUDA tensors, shares their memory with
CuPy through DLPack (no copies), runs on PyTorch's current stream, and differentiates through
the argmax.
"""

from __future__ import annotations

from typing import Any

import cupy
import torch

from .products import backward_sync, matmul_sync

__all__ = ["matmul"]


def _cupy(x: torch.Tensor) -> Any:
    return cupy.from_dlpack(x.detach())


def _stream(x: torch.Tensor) -> Any:
    """PyTorch's current stream as a CuPy stream, so the work is ordered with PyTorch's."""
    stream = torch.cuda.current_stream(x.device)
    try:
        return cupy.cuda.Stream.from_external(stream)  # the CUDA stream protocol
    except (AttributeError, TypeError):  # an older PyTorch or CuPy
        return cupy.cuda.ExternalStream(stream.cuda_stream, x.device.index)


class _TropicalMatmul(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, semiring: str) -> torch.Tensor:
        with cupy.cuda.Device(a.device.index):
            c, argmax = matmul_sync(_cupy(a), _cupy(b), semiring, argmax=True, stream=_stream(a))
        ctx.save_for_backward(a, b)
        ctx.argmax = argmax
        ctx.semiring = semiring
        return torch.from_dlpack(c)

    @staticmethod
    def backward(ctx: Any, grad_c: torch.Tensor) -> tuple[Any, Any, None]:
        a, b = ctx.saved_tensors
        with cupy.cuda.Device(a.device.index):
            grad_a, grad_b = backward_sync(
                _cupy(grad_c), _cupy(a), _cupy(b), ctx.argmax, ctx.semiring, stream=_stream(a)
            )
        return torch.from_dlpack(grad_a), torch.from_dlpack(grad_b), None


def matmul(a: torch.Tensor, b: torch.Tensor, semiring: str = "maxplus") -> torch.Tensor:
    """C = A (x) B over ``semiring`` for CUDA tensors, differentiable (float32/float64).

    The tensors' memory is shared with CuPy through DLPack (no copies), and the product runs
    on PyTorch's current stream of ``a``'s device, as ``tropical.matmul_sync`` with
    ``argmax=True``. The argmax is kept for the backward pass, where the gradient flows
    through the winning k only (see ``tropical.backward``). Shapes, broadcasting and dtypes
    are as for ``tropical.matmul``; gradients exist for float32 and float64.

    Args:
        a: The left operand: a CUDA tensor of shape (M, K), or (batch, M, K).
        b: The right operand: a CUDA tensor of shape (K, N), or (batch, K, N), of ``a``'s
            dtype and on ``a``'s device.
        semiring: ``"maxplus"``, ``"minplus"``, ``"maxmul"`` or ``"andor"``.

    Returns:
        C, a CUDA tensor of shape (M, N), or (batch, M, N) where an operand is 3-D, on the
        autograd graph of ``a`` and ``b``.

    Raises:
        TypeError: ``a`` or ``b`` is not a CUDA tensor; they differ in dtype, or have one
            that ``semiring`` does not take.
        ValueError: ``semiring`` is not one of the four; the shapes do not multiply; the
            tensors are on different devices.
        cupy.cuda.memory.OutOfMemoryError: C and its argmax do not fit in GPU memory (they are
            allocated by CuPy's memory pool, not PyTorch's).
        CompileError: NVRTC refused the kernel. This and the errors below come from a
            kernel's first use on a device only.
        NvrtcError: NVRTC cannot be used, or cannot compile for this GPU.
        ModuleLoadError: The kernel could not be loaded onto the device
            (``GPUOutOfMemoryError`` where GPU memory is full).
    """
    if not (a.is_cuda and b.is_cuda):
        raise TypeError("a and b must be CUDA tensors")
    result: torch.Tensor = _TropicalMatmul.apply(a, b, semiring)
    return result
