"""benchmarks/profile_step.py's component table: each kind of kernel of a decode step lands in its component."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
profile_step = pytest.importorskip("profile_step")  # needs torch (the test oracles install CPU torch)


@pytest.mark.parametrize("kernel, component", [
    ("lbq::gemm<", "K-quant products (lbq::gemm)"),
    ("lbq::reduce_splits", "their split sums / activation passes"),
    ("lbq::prepare_x<", "their split sums / activation passes"),
    ("mul_mat_f<__nv_bfloat162, 32, 16, 8, false>", "other products (mmf, mmvq, mmq)"),
    ("", "attention"),  # the invariant attention's kernels (an anonymous namespace)
    ("flash_attn_ext_f16<128, 128, 16, 4, false, false, false>", "attention"),
    ("gated_delta_net_tree_cuda<128, false, true>", "delta net and conv"),
    ("ssm_conv_tree_f32<4>", "delta net and conv"),
    ("rms_norm_f32<1024, true, false, false>", "norms"),
    ("cpy_rows_bytes<int4, unsigned int>", "copies, concat, rows"),
    ("Memcpy DtoD ", "copies, concat, rows"),
    ("concat_transposed_dim0<unsigned int>", "copies, concat, rows"),
    ("k_bin_bcast<&_INTERNAL_b35b1e24_11_binbcast_cu_6840010b::op_add, float, float, float, float const*>",
     "elementwise, rope"),
    ("argmax_f32_parts", "selection (argmax, top-k)"),
    ("lb_top_k_select<8>", "selection (argmax, top-k)"),
    ("some_new_kernel<3>", "other"),
])
def test_component_of(kernel, component):
    assert profile_step.component_of(kernel) == component


def test_component_rows_sum_in_table_order():
    rows = [("rms_norm_f32<256, true, false, false>", 80, 0.25), ("lbq::gemm<", 289, 10.0),
            ("some_new_kernel<3>", 1, 0.5), ("rms_norm_f32<1024, true, false, false>", 130, 0.5)]
    assert profile_step.component_rows(rows) == [("K-quant products (lbq::gemm)", 289, 10.0), ("norms", 210, 0.75),
                                                 ("other", 1, 0.5)]


class _Event:
    def __init__(self, name, start, end):
        self.name, self.device_type = name, profile_step.torch.autograd.DeviceType.CUDA
        self.time_range = type("Range", (), {"start": start, "end": end})()


class _Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def test_exposed_time_credits_what_each_kernel_adds_to_the_union():
    # a norm (0-4 us); a product launched early (2-20) over it; a copy inside the product (5-6); a gap; a norm
    # (25-27): the union is 4 + 16 + 2 = 22 us, the product's 18 us of span expose 16
    prof = _Profile([_Event("lbq::gemm<", 2, 20), _Event("rms_norm_f32<1024, true>", 0, 4),
                     _Event("cpy_rows_bytes<int>", 5, 6), _Event("rms_norm_f32<256, true>", 25, 27)])
    per = profile_step.exposed_by(prof)
    assert per["K-quant products (lbq::gemm)"] == [1, 18.0, 16.0]
    assert per["norms"] == [2, 6.0, 6.0]
    assert per["copies, concat, rows"] == [1, 1.0, 0.0]
    assert profile_step.busy_ms(prof) == pytest.approx(0.022)
    by_kernel = profile_step.exposed_by(prof, key=lambda name: name)
    assert by_kernel["rms_norm_f32<1024, true>"] == [1, 4.0, 4.0]
    assert by_kernel["rms_norm_f32<256, true>"] == [1, 2.0, 2.0]
