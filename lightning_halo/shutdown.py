r"""A clean process exit: the process groups are released before the interpreter shuts down.

After every gloo collective, one of the process group's worker threads drops its references to
the collective's tensors once the caller's ``wait()`` has returned, and that takes the GIL
(torch 2.13: a C++ reference count falling from 2 to 1 releases the tensor's Python object,
``TensorImpl::decref_pyobject``). If the main thread starts shutting the interpreter down while
such a thread still waits for the GIL, Python (3.11 to 3.13) ends that thread as it gets the GIL
(``PyThread_exit_thread``, i.e. ``pthread_exit``); the forced unwind runs into a ``noexcept``
destructor (``~AsyncWork``) and C++ calls ``std::terminate``: the process prints
``terminate called without an active exception`` and aborts (exit status 134), after a run that
succeeded. Whether a thread is still waiting depends on scheduling, hence an intermittent abort.

A process group's C++ destructor waits for its worker threads with the GIL released, so
destroying the groups (and collecting the objects that still hold them, such as an unwrapped
``DistributedDataParallel``) before the interpreter shuts down leaves no thread waiting.
:class:`~lightning_halo.HaloQuantStrategy` registers :func:`release_process_groups` to run at
exit; the ``lightning-halo`` command calls it when a verb has finished.
"""

from __future__ import annotations

import atexit
import gc

import torch.distributed as dist

__all__ = ["release_at_exit", "release_process_groups"]

_registered = False


def release_process_groups() -> None:
    """Destroy every process group of this process and join their worker threads.

    Does nothing when ``torch.distributed`` was never initialised (or is already torn down).
    Collectives are impossible afterwards: call it when the process is done with them.

    Example:
        >>> release_process_groups()  # no process group: nothing to do
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        # A group kept alive only by a reference cycle (DDP's wrapper after Lightning unwrapped the
        # model) would otherwise be destroyed during interpreter shutdown, too late.
        gc.collect()


def release_at_exit() -> None:
    """Run :func:`release_process_groups` at interpreter exit (registered once per process).

    ``atexit`` handlers run before the interpreter starts finalising, while worker threads can
    still take the GIL and finish.

    Example:
        >>> release_at_exit()  # idempotent
    """
    global _registered
    if not _registered:
        atexit.register(release_process_groups)
        _registered = True
