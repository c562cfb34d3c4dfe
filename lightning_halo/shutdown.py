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

A process group's C++ destructor, run from Python's last reference, waits for its worker
threads with the GIL released, so collecting the objects that hold a group through a reference
cycle (such as an unwrapped ``DistributedDataParallel``'s reducer) and then destroying the
groups, before the interpreter shuts down, leaves no thread waiting. (In the other order the
collector would run a group's destructor with the GIL held: a deadlock with such a thread.)
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
        # Collect first what holds a group only through a reference cycle (DDP's reducer, after
        # Lightning unwrapped the model), while the registry still holds every group. Collected
        # after it, the reducer would drop a group's last reference inside the collector, whose
        # destructor joins the worker threads with the GIL held, while a worker still releasing the
        # last collective's tensors waits for the GIL: a rank hung at exit that way (torch 2.13,
        # ``~ProcessGroupGloo`` under ``gc_collect`` against ``~AsyncWork`` in ``decref_pyobject``).
        gc.collect()
        # Dropping the registry's references destroys the groups with the GIL released.
        dist.destroy_process_group()


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
