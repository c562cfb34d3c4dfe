"""Tests of the backend choice (lightning_halo.quant.backend): numba vs torch parity, selection, fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_halo.quant import SUPPORTED_BITS, dequantize, get_impl, numba_available, quantize, set_impl, use_impl
from lightning_halo.quant import backend
from tests.quant.rows import adversarial_rows, gen, needs_numba, structured

SHAPES = [(1, 1), (1, 3), (1, 8), (2, 7), (5, 37), (64, 8), (9, 64), (13, 257), (300, 100)]


@needs_numba
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_torch_numba_identical(bits, dtype):
    for k, (n, d) in enumerate(SHAPES):
        x = structured(n, d, seed=k, dtype=dtype)
        if n * d > 10:
            x.view(-1)[:: 7] = x.view(-1)[0]  # ties with the first value
        with use_impl("torch"):
            qt = quantize(x, bits, gen(k))
        with use_impl("numba"):
            qn = quantize(x, bits, gen(k))
        assert torch.equal(qt.data, qn.data), (n, d)
        for out_dtype in (None, torch.float64, torch.bfloat16):
            with use_impl("torch"):
                yt = dequantize(qt, out_dtype)
            with use_impl("numba"):
                yn = dequantize(qt, out_dtype)
            assert torch.equal(yt, yn), (n, d, out_dtype)
    adv = adversarial_rows(37)
    if dtype == torch.float16:
        adv = adv.clamp(-6e4, 6e4)  # keep the ±1e30 rows finite in fp16
    with use_impl("torch"):
        at = quantize(adv.to(dtype), bits, gen(1))
    with use_impl("numba"):
        an = quantize(adv.to(dtype), bits, gen(1))
    assert torch.equal(at.data, an.data)


def test_fallback_without_numba(monkeypatch):
    # Simulate a machine without numba: auto mode must use the torch path.
    monkeypatch.setattr(backend, "_numba_kernels", None)
    monkeypatch.setattr(backend, "_numba_failed", True)
    assert not numba_available() and get_impl() == "torch"
    with pytest.raises(RuntimeError):
        set_impl("numba")
    x = structured(10, 37)
    assert dequantize(quantize(x, 4, gen(0))).shape == (10, 37)


def test_impl_selection(monkeypatch):
    with pytest.raises(ValueError, match="auto"):
        set_impl("fast")
    with use_impl("torch"):
        assert get_impl() == "torch"
    monkeypatch.setenv("LIGHTNING_HALO_NUMBA", "0")
    assert get_impl() == "torch"
    monkeypatch.setenv("LIGHTNING_HALO_NUMBA", "1")
    assert get_impl() == ("numba" if numba_available() else "torch")


class _FakeDispatcher:
    """Stands in for a numba dispatcher: each call is a cache miss (compile) or a hit."""

    def __init__(self, compiles: bool) -> None:
        from collections import Counter
        from types import SimpleNamespace

        self.compiles = compiles
        self.stats = SimpleNamespace(cache_path="/cache/dir", cache_hits=Counter(), cache_misses=Counter())

    def __call__(self) -> None:
        (self.stats.cache_misses if self.compiles else self.stats.cache_hits)["sig"] += 1


class _FakeNumba:
    def __init__(self, compiles: bool) -> None:
        self.q, self.dq = _FakeDispatcher(compiles), _FakeDispatcher(compiles)
        self.calls = 0

    def dispatchers(self, bits):
        return (self.q, self.dq)

    def quantize_rows(self, x, out, seed, bits):
        self.calls += 1
        self.q()
        return -1

    def dequantize_rows(self, data, out, bits):
        self.dq()


@pytest.mark.parametrize("rank", ["0", "1"])
def test_first_compilation_is_logged_once_on_rank_zero(monkeypatch, caplog, rank):
    monkeypatch.setenv("RANK", rank)
    fake = _FakeNumba(compiles=True)
    kernels = backend.NumbaKernels(fake)
    with caplog.at_level("DEBUG", logger="lightning_halo.quant"):
        done = kernels.prepare(4)
        assert kernels.prepare(4) is None and fake.calls == 1, "prepared once per bit width"
        x = torch.zeros(2, 8)
        kernels.quantize_rows(x, torch.zeros(2, 9, dtype=torch.uint8), 0, 4)
    assert done is not None and done.compiled and done.cache_dir == "/cache/dir" and done.seconds >= 0
    info = [r for r in caplog.records if r.levelname == "INFO"]
    if rank == "0":
        assert len(info) == 1 and "compiled the numba codec kernels for bits=4" in info[0].getMessage()
        assert "/cache/dir" in info[0].getMessage()
    else:
        assert not info


def test_loading_from_the_cache_is_not_announced(monkeypatch, caplog):
    monkeypatch.setenv("RANK", "0")
    kernels = backend.NumbaKernels(_FakeNumba(compiles=False))
    with caplog.at_level("DEBUG", logger="lightning_halo.quant"):
        done = kernels.prepare(1)
    assert done is not None and not done.compiled
    assert [r.levelname for r in caplog.records] == ["DEBUG"] and "loaded" in caplog.records[0].getMessage()


@needs_numba
def test_real_kernels_report_their_cache(monkeypatch):
    # The real dispatchers: once the codec has used them in this process, a fresh adapter
    # finds them in memory (no compilation); the cache directory is numba's own answer.
    with use_impl("numba"):
        quantize(torch.randn(3, 8), 2)
    kernels = backend.NumbaKernels(backend.kernels_for(torch.device("cpu")).mod)
    done = kernels.prepare(2)
    assert done is not None and not done.compiled and Path(done.cache_dir).is_dir()


def test_compile_wrapper_compiles_once_logs_once_and_falls_back(monkeypatch, caplog):
    # torch.compile replaced by a stand-in: the wrapper's own logic (cache per key, the one
    # INFO line, eager fallback when the compiled function fails) runs without a GPU.
    compiled_calls = []

    def fake_compile(fn, dynamic, backend):
        # compile_chunk: sizes marked dynamic per call, the closed-over constants not; a code object per key
        assert dynamic is False and backend == "inductor"
        assert fn.__code__ is not double.__code__ and fn.__code__ is not broken.__code__

        def run(*args):
            name = fn.__name__.split("_")[0]  # "<name>_<key...>"
            compiled_calls.append(name)
            if name == "broken":
                raise RuntimeError("inductor says no")
            return fn(*args)

        return run

    def double(t):
        return t * 2

    def broken(t):
        return t + 1

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(backend, "_compiled", {})
    monkeypatch.setattr(backend, "_compile_logged", False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("LIGHTNING_HALO_COMPILE", raising=False)
    t = torch.arange(3.0)
    with caplog.at_level("DEBUG", logger="lightning_halo.quant"):
        f = backend._compile_wrap(("double", 1), double)
        assert backend._compile_wrap(("double", 1), double) is f, "one wrapper per key"
        assert torch.equal(f(t), t * 2) and torch.equal(f(t), t * 2) and compiled_calls == ["double"] * 2
        g = backend._compile_wrap(("double", 2), double)
        g(t)
        with pytest.warns(UserWarning, match="inductor says no"):
            h = backend._compile_wrap(("broken", 1), broken)
            assert torch.equal(h(t), t + 1), "a failing compiled function falls back to eager"
        assert torch.equal(h(t), t + 1) and compiled_calls.count("broken") == 1
        assert backend._compile_wrap(("broken", 1), broken) is broken
    info = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(info) == 1 and "('double', 1)" in info[0], info
    monkeypatch.setenv("LIGHTNING_HALO_COMPILE", "0")
    assert backend._compile_wrap(("double", 1), double) is double
