"""Tests of the torch kernels (lightning_halo.quant._torch): the CPU reference and what CUDA runs."""

from __future__ import annotations

import pytest
import torch

from lightning_halo.quant import _torch as kernels
from lightning_halo.quant import dequantize, quantize, use_impl
from lightning_halo.quant import format as codec_format
from lightning_halo.quant.codec import QuantizedRows
from tests.quant.rows import DEVICE, adversarial_rows, gen, on_device, structured


def test_torch_path_traceable_by_dynamo():
    # The CUDA path compiles these chunk functions; make sure dynamo traces them
    # without graph breaks (aot_eager: no C++/CUDA toolchain needed).
    x = structured(16, 37)
    z, inv, _, _ = codec_format.encode_meta(x, 4)
    base = torch.tensor(123)
    fn = torch.compile(kernels.codes_chunk, backend="aot_eager", dynamic=True, fullgraph=True)
    assert torch.equal(fn(x, z, inv, base, 4), kernels.codes_chunk(x, z, inv, base, 4))
    fn16 = torch.compile(kernels.bf16_chunk, backend="aot_eager", dynamic=True, fullgraph=True)
    assert torch.equal(fn16(x, base), kernels.bf16_chunk(x, base))
    q = quantize(x, 4, gen(0))
    z, s = codec_format.decode_meta(q.data, 37, 4)
    fdq = torch.compile(kernels.dequant_fn(4), backend="aot_eager", dynamic=True, fullgraph=True)
    raw = q.data[:, : codec_format.code_nbytes(37, 4)].contiguous()
    assert torch.equal(fdq(raw, z, s)[:, :37], dequantize(q))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_one_compilation_serves_every_row_width(bits):
    """What CUDA runs (backend.compile_chunk): the bit width a constant of its own code object, the
    tensors' sizes symbols. One graph per kernel covers every row width and row count (the encoder
    one more for widths that leave padding slots), instead of one compilation per layer width; and
    no graph holds ``bits`` as a symbol (torch 2.11 failed to trace ``1 << bits`` on one)."""
    from lightning_halo.quant.backend import compile_chunk

    graphs: dict[str, list] = {"codes": [], "dequant": []}

    def counter(name):
        def count(gm, example_inputs):
            graphs[name].append([n.target for n in gm.graph.nodes if n.op == "placeholder"])
            return gm.forward

        return count

    enc = compile_chunk(("codes", bits, "test"), kernels.codes_fn(bits), backend=counter("codes"))
    dec = compile_chunk(("dequant", bits, "test"), kernels.dequant_fn(bits), backend=counter("dequant"))
    per = 8 // bits
    for n, d in ((20, 8 * 5), (33, 64), (7, 256), (50, 8 * 3)):
        x = structured(n, d)
        z, inv, _, _ = codec_format.encode_meta(x, bits)
        base = torch.tensor([123 + d])
        assert torch.equal(enc(x, z, inv, base), kernels.codes_fn(bits)(x, z, inv, base))
        q = quantize(x, bits, gen(d))
        zq, sq = codec_format.decode_meta(q.data, d, bits)
        raw = q.data[:, : codec_format.code_nbytes(d, bits)].contiguous()
        assert torch.equal(dec(raw, zq, sq), kernels.dequant_fn(bits)(raw, zq, sq))
    assert len(graphs["codes"]) == 1 and len(graphs["dequant"]) == 1, graphs
    x = structured(9, 8 * 3 + 1 if per > 1 else 25)  # padding slots at bits < 8: the encoder's second graph
    z, inv, _, _ = codec_format.encode_meta(x, bits)
    assert torch.equal(enc(x, z, inv, torch.tensor([5])), kernels.codes_fn(bits)(x, z, inv, torch.tensor([5])))
    assert len(graphs["codes"]) == (2 if per > 1 else 1), graphs
    for inputs in graphs["codes"] + graphs["dequant"]:
        assert not any("bits" in name for name in inputs), f"bits is a graph input (a symbol): {inputs}"


@on_device
@pytest.mark.parametrize("compiled", ["1", "0"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16])
def test_device_records_match_the_cpu_reference(monkeypatch, compiled, bits):
    """Records written on DEVICE (numba on CPU; the torch kernels, compiled or eager, on CUDA)
    are the torch reference's bytes. The one allowed difference: compiled CUDA code may fuse
    ``(x - z) * inv + u`` into an FMA, moving a code by one where that sum lands within a
    rounding of an integer (still unbiased). Decoding is exact everywhere (``c * s`` is exact)."""
    monkeypatch.setenv("LIGHTNING_HALO_COMPILE", compiled)
    d = 37
    x = torch.cat([structured(3000, d, seed=bits), adversarial_rows(d)])
    with use_impl("torch"):
        ref = quantize(x, bits, gen(3))
        ref_y = dequantize(ref)
    got = quantize(x.to(DEVICE), bits, gen(3)).data.cpu()
    if bits == 16 or not (DEVICE == "cuda" and compiled == "1"):
        assert torch.equal(got, ref.data)
    else:
        cb = codec_format.code_nbytes(d, bits)
        assert torch.equal(got[:, cb:], ref.data[:, cb:]), "headers are computed eagerly: identical"
        a, b = QuantizedRows(got, bits, d).codes.int(), ref.codes.int()
        assert int((a - b).abs().max()) <= 1 and float((a != b).float().mean()) < 1e-3
    y = dequantize(QuantizedRows(ref.data.to(DEVICE), bits, d)).cpu()
    assert torch.equal(y, ref_y)
