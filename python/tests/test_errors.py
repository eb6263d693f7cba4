"""Bad input is a Python exception naming the kernel and argument, never a crash."""

import numpy as np
import pytest
import torch

import dlbridge


def test_dtype_mismatch_is_a_type_error():
    with pytest.raises(TypeError, match=r"matmul: argument a: dtype mismatch: expected T \(one of f32, f64\), got i32"):
        dlbridge.get_kernel("matmul")(torch.ones(2, 2, dtype=torch.int32), torch.ones(2, 2))


def test_shape_mismatch_is_a_value_error():
    with pytest.raises(ValueError, match=r"matmul: argument b: dim K = 3 \(bound by a\) but got 4"):
        dlbridge.get_kernel("matmul")(torch.ones(2, 3), torch.ones(4, 5))


def test_wrong_argument_counts_and_keywords_are_type_errors():
    add = dlbridge.get_kernel("add")
    with pytest.raises(TypeError, match=r"add\(\) takes 2 arguments \(a, b\), or 3 with the outputs \(out\) appended but 1 was given"):
        add(torch.ones(2))
    with pytest.raises(TypeError):
        add(torch.ones(2), torch.ones(2), bogus=1)
    with pytest.raises(TypeError, match="out= needs 1 tensor, got"):
        add(torch.ones(2), torch.ones(2), out=(torch.ones(2), torch.ones(2)))
    with pytest.raises(TypeError, match="expected a float"):
        dlbridge.get_kernel("axpy")("two", torch.ones(2), torch.ones(2))


def test_unknown_kernel_is_a_key_error():
    with pytest.raises(KeyError, match="no kernel named `nope`"):
        dlbridge.get_kernel("nope")


def test_read_only_numpy_array_in_a_mut_slot_is_refused_and_not_written():
    y = np.ones(3, dtype=np.float32)
    y.flags.writeable = False
    with pytest.raises(BufferError, match="axpy: argument y"):
        dlbridge.get_kernel("axpy")(1.0, np.ones(3, dtype=np.float32), y)
    np.testing.assert_array_equal(y, 1.0)


def test_read_only_buffer_as_out_is_refused():
    ro = np.zeros(2, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        dlbridge.get_kernel("add")(np.ones(2, dtype=np.float32), np.ones(2, dtype=np.float32), out=ro)
    assert not ro.any()


def test_bytes_are_read_only_inputs():
    out = dlbridge.get_kernel("copy")(b"\x01\x02\x03")
    assert out.tolist() == [1, 2, 3]


def test_an_output_over_part_of_an_input_reads_a_copy_of_the_input():
    # As CuPy copies overlapping inputs first: the result is the out-of-place one.
    x = torch.arange(8.0)
    dlbridge.get_kernel("add")(x[:4], x[4:], out=x[2:6])
    torch.testing.assert_close(x, torch.tensor([0.0, 1.0, 4.0, 6.0, 8.0, 10.0, 6.0, 7.0]))
    x = torch.arange(8.0)
    dlbridge.get_kernel("add")(x, x, out=x)  # exactly an input: in place
    torch.testing.assert_close(x, 2 * torch.arange(8.0))
    m = torch.arange(9.0).reshape(3, 3)
    want = m @ m
    dlbridge.get_kernel("matmul")(m, m, out=m)
    torch.testing.assert_close(m, want)


def test_two_written_tensors_that_overlap_are_refused():
    k = dlbridge.ElementwiseKernel("T a", "T s, T d", "s = a + 1; d = a - 1", "errors_two_outputs")
    z = torch.zeros(6)
    with pytest.raises(ValueError, match=r"^errors_two_outputs: output s: overlaps output d in memory") as ei:
        k(torch.ones(4), out=(z[:4], z[2:]))
    assert _attrs(ei.value) == ("errors_two_outputs", "s", True)
    assert (z == 0).all(), "nothing was written"


def test_consumed_capsule_passed_twice_raises():
    cap = torch.utils.dlpack.to_dlpack(torch.ones(3))
    dlbridge.from_dlpack(cap)
    with pytest.raises((ValueError, BufferError, RuntimeError, TypeError)):
        dlbridge.from_dlpack(cap)


def test_object_with_neither_dlpack_nor_buffer_is_a_type_error():
    with pytest.raises(TypeError, match="expected a tensor"):
        dlbridge.get_kernel("relu")(object())
    with pytest.raises(TypeError):
        dlbridge.from_dlpack(object())


def test_a_dlpack_method_that_raises_propagates():
    class Broken:
        def __dlpack__(self, **kwargs):
            raise RuntimeError("producer exploded")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(RuntimeError, match="producer exploded"):
        dlbridge.get_kernel("relu")(Broken())


def test_non_native_byte_order_is_refused():
    big_endian = np.arange(4, dtype=">f4")
    with pytest.raises(BufferError, match="byte order|not in native"):
        dlbridge.asarray(big_endian)
    with pytest.raises((BufferError, TypeError, ValueError)):
        dlbridge.get_kernel("relu")(big_endian)


def test_unsupported_device_is_refused():
    class OnCuda:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise BufferError("no CUDA here")

    with pytest.raises(BufferError):
        dlbridge.get_kernel("relu")(OnCuda())


def test_tensors_that_require_grad_are_refused_as_outputs():
    z = torch.zeros(2, requires_grad=True)
    with pytest.raises((BufferError, ValueError, RuntimeError)):
        dlbridge.get_kernel("add")(torch.ones(2), torch.ones(2), out=z)
    assert not z.detach().any()


def test_kernel_runtime_errors_are_runtime_or_value_errors():
    with pytest.raises(ValueError, match=r"^div: argument b: integer division by zero \(it has a zero\)$") as ei:
        dlbridge.get_kernel("div")(torch.tensor([1]), torch.tensor([0]))
    assert _attrs(ei.value) == ("div", "b", False)
    # A refused call writes nothing, so autograd sees no write either.
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError):
        dlbridge.get_kernel("div")(torch.tensor([1]), torch.tensor([0]), out=out)
    assert out._version == 0 and out.tolist() == [0]


def test_outputs_given_twice_are_named_as_such():
    x = torch.ones(2)
    with pytest.raises(TypeError, match=r"^add\(\): the outputs are given twice, appended to the arguments and with out=; give them once$"):
        dlbridge.get_kernel("add")(x, x, torch.empty(2), out=torch.empty(2))


def test_prepare_outputs_of_a_kernel_with_a_mut_parameter():
    axpy = dlbridge.get_kernel("axpy")
    assert axpy.prepare_outputs(1.0, np.ones(3), np.ones(3)) == []
    assert axpy.prepare_outputs(1.0, torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)) == []
    # Arguments are bound as the call binds them: a read-only tensor in a `mut` slot is refused.
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="^axpy: argument y: the tensor is read-only"):
        axpy.prepare_outputs(1.0, np.ones(3), ro)


@pytest.mark.parametrize("n", [1, 1 << 16])
def test_every_refusal_names_kernel_and_argument_once(n):
    with pytest.raises(ValueError) as e:
        dlbridge.get_kernel("div")(torch.ones(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32))
    assert str(e.value).count("div:") == 1, e.value
    x = torch.ones(n, 2)
    broadcast = torch.ones(n, 1).expand(n, 2)  # stride 0 in the last dim: elements share memory
    with pytest.raises(ValueError) as e:
        dlbridge.get_kernel("add")(x, x, out=broadcast)
    assert str(e.value).startswith("add: output out: ") and str(e.value).count("add:") == 1, e.value
    with pytest.raises(ValueError) as e:
        dlbridge.get_kernel("axpy")(1.0, torch.ones(2), torch.ones(1).expand(2))
    assert str(e.value).startswith("axpy: argument y: ") and str(e.value).count("axpy:") == 1, e.value


def test_load_plugin_on_a_missing_file_is_file_not_found(tmp_path):
    missing = tmp_path / "nope" / "libmissing.so"
    with pytest.raises(FileNotFoundError, match="libmissing.so"):
        dlbridge.load_plugin(str(missing))


def test_load_plugin_keeps_the_loaders_own_reason(tmp_path):
    not_a_library = tmp_path / "libtext.so"
    not_a_library.write_text("this is not an ELF file\n" * 100)
    with pytest.raises(Exception) as e:
        dlbridge.load_plugin(str(not_a_library))
    assert not isinstance(e.value, FileNotFoundError)
    # dlerror's text, e.g. "invalid ELF header" or "file too short"
    assert "ELF" in str(e.value) or "too short" in str(e.value), e.value


@pytest.mark.parametrize("dl_device, field", [((1, 2**40), "device_id"), ((2**40, 0), "device_type"), ((1, "x"), "device_id")])
def test_an_out_of_range_dl_device_names_the_field(dl_device, field):
    with pytest.raises(ValueError, match=f"dl_device: {field} = .* is out of range"):
        dlbridge.zeros((2,)).__dlpack__(dl_device=dl_device)


def test_an_out_of_range_dlpack_device_names_the_field():
    a = dlbridge.zeros((2,))

    class HugeDevice:
        def __dlpack__(self, **kwargs):
            return a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return (1, 2**40)

    with pytest.raises(ValueError, match="device_id"):
        dlbridge.from_dlpack(HugeDevice(), device="cpu")


def _attrs(e):
    return (e.kernel, e.argument, e.output)


def test_argument_errors_carry_kernel_and_argument_as_attributes():
    add = dlbridge.get_kernel("add")
    # A check of the registry (shapes).
    with pytest.raises(ValueError, match=r"^add: argument b: \.\.\.S = \[3\] \(bound by a\) but got \[4\]$") as ei:
        add(np.ones(3, np.float32), np.ones(4, np.float32))
    assert _attrs(ei.value) == ("add", "b", False)
    # A refusal met while importing (a read-only NumPy array given as the output).
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match=r"^add: output out: the tensor is read-only \(DLPack READ_ONLY\) and this argument is written$") as ei:
        add(np.ones(3, np.float32), np.ones(3, np.float32), out=ro)
    assert _attrs(ei.value) == ("add", "out", True)
    assert (ro == 1).all()
    # A scalar of the wrong type.
    with pytest.raises(TypeError, match="^axpy: argument alpha: expected a float, got str$") as ei:
        dlbridge.get_kernel("axpy")("two", torch.ones(2), torch.ones(2))
    assert _attrs(ei.value) == ("axpy", "alpha", False)
    # The context is attached once, never twice.
    assert str(ei.value).count("axpy:") == 1


def test_an_exception_from_user_code_keeps_its_type_and_gains_a_note():
    class Boom(Exception):
        pass

    class Alpha:
        def __float__(self):
            raise Boom("no float today")

    y = torch.ones(2)
    with pytest.raises(Boom, match="^no float today") as ei:
        dlbridge.get_kernel("axpy")(Alpha(), torch.ones(2), y)
    assert _attrs(ei.value) == ("axpy", "alpha", False)
    assert ei.value.__notes__ == ["in dlbridge kernel axpy: argument alpha"]
    assert torch.equal(y, torch.ones(2)), "nothing written"
