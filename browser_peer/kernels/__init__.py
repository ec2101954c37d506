"""The WebAssembly SIMD kernels (``kernels.wat`` here), called on NumPy float32 arrays by address.

``static/worker.js`` links the built module into Pyodide's own linear memory (decision 0031), so an
array's data pointer is what a kernel reads and writes: no copies. ``exports`` is what the link
returned (``gemm_nn``, ``gemm_nt``, ``adam``). An operand a kernel cannot take as it lies (not
float32, not two-dimensional, an empty axis, strides that are negative or not whole elements, neither
operand of a product contiguous along the axis the kernel walks) goes to NumPy instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Kernels"]

F32 = npt.NDArray[np.float32]
_ITEM = 4  # bytes of a float32


def _address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def _element_strides(array: np.ndarray) -> tuple[int, ...] | None:
    """The strides of a float32 array with no empty axis in elements, or None where a kernel cannot walk it."""
    if array.dtype != np.float32 or array.size == 0:
        return None
    if any(stride < 0 or stride % _ITEM for stride in array.strides):
        return None
    return tuple(stride // _ITEM for stride in array.strides)


def _dense(array: np.ndarray) -> bool:
    return array.dtype == np.float32 and array.flags.c_contiguous and array.size > 0


class Kernels:
    """The linked kernels as the trainer's ``matmul`` and fused Adam update."""

    def __init__(self, exports: Any) -> None:
        self._gemm_nn = exports.gemm_nn
        self._gemm_nt = exports.gemm_nt
        self._adam = exports.adam

    def matmul(self, a: F32, b: F32) -> F32:
        """``a @ b`` for 2-D float32 operands: ``gemm_nn`` where ``b``'s rows are contiguous (``a`` any
        strides, so ``x.T`` costs nothing), ``gemm_nt`` where ``b`` is a transposed row-major matrix
        (``kernel.T``) and ``a``'s rows are contiguous; NumPy otherwise."""
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            return np.matmul(a, b)  # type: ignore[no-any-return]
        sa, sb = _element_strides(a), _element_strides(b)
        if sa is None or sb is None:
            return np.matmul(a, b)  # type: ignore[no-any-return]
        (m, k), n = a.shape, b.shape[1]
        c = np.empty((m, n), np.float32)
        if sb[1] == 1:
            self._gemm_nn(m, n, k, _address(a), sa[0], sa[1], _address(b), sb[0], _address(c), n, 0)
        elif sb[0] == 1 and sa[1] == 1:
            self._gemm_nt(m, n, k, _address(a), sa[0], _address(b), sb[1], _address(c), n)
        else:
            return np.matmul(a, b)  # type: ignore[no-any-return]
        return c

    def adam(
        self, param: F32, grad: F32, mu: F32, nu: F32, b1: float, b2: float, eps: float, step: float
    ) -> F32 | None:
        """``param`` after one fused Adam step, a new array (``param`` is left as it is; ``mu`` and ``nu``
        move in place): ``mu = b1·mu + (1-b1)·g``, ``nu = b2·nu + (1-b2)·g²``,
        ``param - step·mu / (sqrt(nu) + eps)``. None, with nothing touched, unless all four are
        C-contiguous float32 arrays of one shape and the moments are writeable."""
        arrays = (param, grad, mu, nu)
        if not all(_dense(array) and array.shape == param.shape for array in arrays):
            return None
        if not (mu.flags.writeable and nu.flags.writeable):
            return None
        updated = param.copy()
        self._adam(updated.size, _address(updated), _address(grad), _address(mu), _address(nu), b1, b2, eps, step)
        return updated
