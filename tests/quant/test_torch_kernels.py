"""Tests of the torch kernels (lightning_halo.quant._torch): what torch.compile sees on CUDA."""

from __future__ import annotations

import torch

from lightning_halo.quant import _torch as kernels
from lightning_halo.quant import dequantize, quantize
from lightning_halo.quant import format as codec_format
from tests.quant.rows import gen, structured


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
    fdq = torch.compile(kernels.dequant_fn(37, 4), backend="aot_eager", dynamic=True, fullgraph=True)
    assert torch.equal(fdq(q.data, z, s), dequantize(q))
