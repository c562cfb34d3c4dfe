"""torch internals lightning-halo relies on (pinned by ``tests/_compat/test_torch.py``)."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from typing import Any, Callable, ContextManager, NamedTuple

import torch
from torch import Tensor


def tensor_version(t: Tensor) -> int:
    """torch's counter of in-place changes of ``t`` (``Tensor._version``; views share their base's).

    Example:
        >>> t = torch.zeros(2); v = tensor_version(t); _ = t.add_(1); tensor_version(t) > v
        True
    """
    return t._version


def make_subclass(cls: type, t: Tensor) -> Tensor:
    """``t`` viewed as the tensor subclass ``cls`` (no copy; ``Tensor._make_subclass``)."""
    return Tensor._make_subclass(cls, t)


#: ``with plain_dispatch():`` tensor subclasses dispatch as plain tensors inside
#: (``torch._C.DisableTorchFunctionSubclass``; the class itself: it is entered on every product).
plain_dispatch: Callable[[], ContextManager[Any]] = torch._C.DisableTorchFunctionSubclass


def in_backward() -> bool:
    """Whether the caller runs inside a backward pass (``torch._C._current_graph_task_id() != -1``: autograd's
    graph task), where a module's forward is a recomputation (activation checkpointing, reversible layers).

    Example:
        >>> in_backward()
        False
    """
    return torch._C._current_graph_task_id() != -1


def checkpoint_hooks_active() -> bool:
    """Whether the innermost saved-tensor hooks are ``torch.utils.checkpoint``'s (``checkpoint(..., use_reentrant=False)``
    packs a segment's tensors through them and recomputes the segment in backward); other hooks, such as
    ``torch.autograd.graph.save_on_cpu``'s, recompute nothing.

    Example:
        >>> with torch.autograd.graph.save_on_cpu():
        ...     checkpoint_hooks_active()
        False
    """
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    return hooks is not None and getattr(hooks[0], "__module__", None) == "torch.utils.checkpoint"


def sparse_mm_functions() -> set[Any]:
    """Every function a sparse-dense product reaches ``__torch_function__`` through (``torch._sparse_mm`` included)."""
    funcs: set[Any] = {torch.sparse.mm, torch.mm, torch.matmul, Tensor.matmul, Tensor.__matmul__, Tensor.mm}
    if hasattr(torch, "_sparse_mm"):
        funcs.add(torch._sparse_mm)
    return funcs


def compiled_function(fn: Any) -> bool:
    """Whether ``fn`` (a function or bound method) is ``torch.compile``'s wrapper of another
    (torch's wrappers carry the original as ``_torchdynamo_orig_callable``)."""
    return getattr(getattr(fn, "__func__", fn), "_torchdynamo_orig_callable", None) is not None


def compiled_original(module: torch.nn.Module) -> "torch.nn.Module | None":
    """The module ``torch.compile`` wrapped, if ``module`` is its wrapper (``OptimizedModule._orig_mod``), else ``None``."""
    from torch._dynamo.eval_frame import OptimizedModule

    return module._orig_mod if isinstance(module, OptimizedModule) else None


def mark_sizes_dynamic(t: Tensor) -> None:
    """Ask ``torch.compile`` to trace every size of ``t`` as a symbol (``torch._dynamo.maybe_mark_dynamic``:
    sizes 0 and 1 stay specialised rather than raising, as ``mark_dynamic`` would)."""
    for dim in range(t.dim()):
        torch._dynamo.maybe_mark_dynamic(t, dim)


#: The base class of every batch norm (``BatchNorm1d/2d/3d``, their lazy and sync versions).
BATCH_NORM_BASE: type = torch.nn.modules.batchnorm._BatchNorm


# ------------------------------------------------------------------------- torch.save's zip files
def fake_tensor_mode() -> ContextManager[Any]:
    """A fresh ``FakeTensorMode``: inside it, factories make tensors with a shape and dtype but no memory.

    Example:
        >>> with fake_tensor_mode():
        ...     t = torch.empty(10**12)
        >>> is_fake(t), t.shape
        (True, torch.Size([1000000000000]))
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def is_fake(t: Tensor) -> bool:
    """Whether ``t`` is a ``FakeTensor`` (made under :func:`fake_tensor_mode`)."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class SavedTensor(NamedTuple):
    """Where a tensor of a ``torch.save`` zip file lies.

    Args:
        record_offset (int): byte offset in the file of its storage's record ``<archive>/data/<key>``.
        record_bytes (int): that record's size.
        storage_offset (int): elements of the storage before the tensor's first one.
    """

    record_offset: int
    record_bytes: int
    storage_offset: int


class _Storage(NamedTuple):
    key: str


class _Placed(NamedTuple):  # a tensor, as the pickle rebuilds it: its storage's key and its offset there
    key: str
    storage_offset: int


def _placed(storage: _Storage, storage_offset: int, *_: Any) -> _Placed:
    return _Placed(storage.key, int(storage_offset))


class _SkeletonReader(pickle.Unpickler):
    """Reads ``data.pkl`` of a file this process wrote, every dense tensor replaced by where it lies."""

    #: what torch.save's pickle rebuilds a dense tensor with: f(storage, storage_offset, size, stride, ...)
    REBUILD = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor_v3")}

    def persistent_load(self, pid: Any) -> _Storage:  # ("storage", storage type, key, location, numel)
        return _Storage(str(pid[2]))

    def find_class(self, module: str, name: str) -> Any:
        return _placed if (module, name) in self.REBUILD else super().find_class(module, name)


def saved_tensors(path: str | os.PathLike) -> dict[str, SavedTensor]:
    """Where each tensor of the dict ``torch.save`` wrote to ``path`` lies in the file, by the dict's key.

    Each tensor is matched to its storage by the key torch gave the storage (the zip record
    ``<archive>/data/<key>``), as the file's own pickle names it: never by size or order, which torch
    does not promise. Views of one storage (``x`` and ``halo_x``) share its record. Reads the zip
    directory and ``data.pkl`` only; run it on files this process wrote (the pickle's classes are
    imported). Relies on torch's zip format: each storage stored uncompressed as ``data/<key>``, each
    dense tensor pickled as ``torch._utils._rebuild_tensor_v2/v3(storage, storage_offset, ...)``.

    Raises:
        ValueError: if the file has no ``data.pkl``, a tensor is pickled otherwise, or a record is
            missing or compressed: torch changed its format.

    Example:
        >>> torch.save({"a": torch.zeros(3), "b": torch.ones(4)[1:]}, "t.pt")  # doctest: +SKIP
        >>> saved_tensors("t.pt")["b"]  # doctest: +SKIP
        SavedTensor(record_offset=1472, record_bytes=16, storage_offset=1)
    """
    with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
        infos = zf.infolist()
        pickles = [info for info in infos if info.filename.rpartition("/")[2] == "data.pkl"]
        if len(pickles) != 1:
            raise ValueError(f"{path} is not a torch.save zip file (it holds {len(pickles)} data.pkl records)")
        try:
            state = _SkeletonReader(io.BytesIO(zf.read(pickles[0]))).load()
        except Exception as err:  # noqa: BLE001 - a tensor rebuilt some other way meets our placeholders
            raise ValueError(f"{path}: torch.save pickled a tensor in an unknown way ({err!r})") from err
        records = {i.filename.rpartition("/")[2]: i for i in infos if i.filename.rpartition("/")[0].rpartition("/")[2] == "data"}
        out = {}
        for name, value in state.items():
            if not isinstance(value, _Placed):
                continue
            info = records.get(value.key)
            if info is None or info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{path}: the storage of {name!r} (record data/{value.key}) is missing or compressed")
            raw.seek(info.header_offset)
            local = raw.read(30)  # the zip local file header; its name and extra field lengths at bytes 26..30
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            out[name] = SavedTensor(info.header_offset + 30 + name_len + extra_len, info.file_size, value.storage_offset)
    return out
