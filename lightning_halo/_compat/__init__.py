"""Every use of another library's internals, in one place, each pinned by a test.

lightning-halo leans on a few things torch, PyG and Lightning do not promise. They are used
only through the functions of this folder, and ``tests/_compat/`` checks each assumption
directly, so an upgrade that breaks one fails there, with its name, and nowhere else:

* :mod:`~lightning_halo._compat.torch`: a tensor's in-place version counter, tensor-subclass
  plumbing (``Tensor._make_subclass``, disabling ``__torch_function__``, ``torch._sparse_mm``),
  the private base class of the batch norms, the module ``torch.compile`` wraps, gloo's worker threads at teardown,
  fake tensors, and where ``torch.save`` puts each tensor's bytes in its zip file (partition files are written in place);
* :mod:`~lightning_halo._compat.pyg`: the names a layer reads at the sources of its edges
  (``MessagePassing._user_args``), whether PyG generated a class's ``propagate`` with its fused
  branch (a search of the generated source), PyG's per-layer caches and normalisation flags, and
  whether ``data.num_nodes`` was set explicitly (``Data._store``);
* :mod:`~lightning_halo._compat.pymetis`: METIS' C API inside pymetis' extension module and the
  index width pymetis reports (several balance constraints, which ``part_graph`` does not pass);
* :mod:`~lightning_halo._compat.lightning`: the ranks Lightning's subprocess launcher started
  (a private class), to stop them when a run fails; the class of Lightning's strategy registry.

Only the Lightning module imports Lightning, so the layers and the exchange stay free of it
(and only it is loaded again for ``lightning_halo.pytorch_lightning``, whose launcher classes
are others).
"""

#: The modules of this folder; each has its pinning tests in ``tests/_compat/test_<name>.py``.
MODULES = (
    "lightning_halo._compat.torch", "lightning_halo._compat.pyg", "lightning_halo._compat.lightning",
    "lightning_halo._compat.pymetis",
)  # fmt: skip
