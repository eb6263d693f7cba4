"""dlbridge.testing against torch, NumPy and dlbridge.Array, and the consumer paths."""

import array

import numpy as np
import pytest
import torch

import dlbridge
import dlbridge.testing as dt

TORCH = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}


def test_dlbridge_array_passes_every_producer_check():
    results = dt.check_producer(lambda shape, dtype: dlbridge.zeros(list(shape), dtype))
    assert [r.status for r in results] == ["pass"] * len(dt.CHECKS), results


def test_torch_deviations_are_recorded_as_known_failures():
    results = dt.check_producer(
        lambda shape, dtype: torch.zeros(shape, dtype=TORCH[dtype]),
        known_failures={
            "copy_true_copies_and_sets_is_copied": "torch copies on copy=True but leaves IS_COPIED unset",
            "stream_on_cpu_must_be_none": "torch raises AssertionError for a stream on a CPU tensor",
        },
    )
    by_name = {r.name: r.status for r in results}
    assert by_name["copy_true_copies_and_sets_is_copied"] == "known failure"
    assert by_name["stream_on_cpu_must_be_none"] == "known failure"
    assert all(s == "pass" for n, s in by_name.items() if n not in ("copy_true_copies_and_sets_is_copied", "stream_on_cpu_must_be_none"))


def test_numpy_deviations_are_recorded_as_known_failures():
    results = dt.check_producer(
        lambda shape, dtype: np.zeros(shape, dtype={"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64, "u8": np.uint8}[dtype]),
        known_failures={"stream_on_cpu_must_be_none": "numpy raises RuntimeError for a stream on a CPU array"},
    )
    bad = [r for r in results if r.status not in ("pass", "known failure")]
    assert not bad, bad


def test_a_stale_known_failure_declaration_is_an_error():
    with pytest.raises(AssertionError, match="but passes: remove the declaration"):
        dt.check_producer(lambda s, d: dlbridge.zeros(list(s), d), known_failures={"exports_are_zero_copy": "not really"})


def test_a_broken_producer_fails_with_the_checks_named():
    class Copies:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, dtype

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            return dlbridge.zeros(list(self.shape), self.dtype).__dlpack__(**kwargs)  # a fresh buffer every time

    with pytest.raises(AssertionError, match="exports_are_zero_copy"):
        dt.check_producer(Copies)


SOURCES = {
    "torch": lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3),
    "numpy": lambda: np.arange(6, dtype=np.float32).reshape(2, 3),
    "dlbridge.Array": lambda: dlbridge.from_dlpack(torch.arange(6, dtype=torch.float32).reshape(2, 3)),
    "bytearray": lambda: memoryview(bytearray(np.arange(6, dtype=np.float32).tobytes())).cast("f", (2, 3)),
    "array.array": lambda: array.array("f", range(6)),
}


def _ptr(obj):
    if isinstance(obj, torch.Tensor):
        return obj.data_ptr()
    if isinstance(obj, np.ndarray):
        return obj.__array_interface__["data"][0]
    if isinstance(obj, dlbridge.Array):
        return obj.data_ptr
    return dlbridge.asarray(obj).data_ptr


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_consumer_paths_are_zero_copy_and_outlive_the_producer(source):
    obj = SOURCES[source]()
    a = dlbridge.asarray(obj) if source in ("bytearray", "array.array") else dlbridge.from_dlpack(obj)
    assert a.data_ptr == _ptr(obj)
    values = a.tolist()
    del obj
    assert a.tolist() == values
    out = dlbridge.get_kernel("copy")(a)
    assert out.tolist() == values


@pytest.mark.parametrize("shape", [(), (0,), (3, 0)])
def test_zero_dim_and_zero_size_tensors_cross_every_path(shape):
    for obj in (torch.zeros(shape), np.zeros(shape, dtype=np.float32), dlbridge.zeros(list(shape))):
        a = dlbridge.from_dlpack(obj)
        assert a.shape == shape
        assert dlbridge.get_kernel("relu")(obj).shape == shape


def test_negative_strides_from_numpy_are_read_correctly():
    rev = np.arange(5, dtype=np.float64)[::-1]
    a = dlbridge.from_dlpack(rev)
    assert a.strides == (-1,) and a.tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]
    assert dlbridge.get_kernel("copy")(rev).tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]


def test_transposed_and_offset_views_keep_their_layout():
    t = torch.arange(20.0).reshape(4, 5)[1:, 1:].t()
    a = dlbridge.from_dlpack(t)
    assert a.strides == tuple(t.stride()) and a.tolist() == t.tolist()
    assert a.data_ptr == t.data_ptr()
