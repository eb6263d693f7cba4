"""Kernels from source stay in their place: their text cannot leave the generated
function or run code when their library is loaded, and an in-place call reads
the old values."""

import errno
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import dlbridge
import dlbridge.cuda

torch = pytest.importorskip("torch")


def _in_child(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (code that ran at load must not touch this one)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize(
    "operation",
    [
        # Digraphs close the lambda, the function and the namespace, then reopen them.
        "z = x; %> %> %>\n__attribute__((constructor)) static void pwn() <% setenv(\"DLB_PWNED\", \"1\", 1); %>\n"
        "namespace <% void f() <% auto g = [&]() <% do <%",
        # The same with line splices inside the digraphs.
        "z = x; %\\\n> %\\\n> %\\\n>\n__attribute__((constructor)) static void pwn() <% setenv(\"DLB_PWNED\", \"1\", 1); %>\n"
        "namespace <% void f() <% auto g = [&]() <% do <%",
    ],
)
def test_digraphs_cannot_close_the_generated_function_or_run_code_at_load(operation):
    r = _in_child(
        f"""
        import os, numpy as np, dlbridge
        try:
            k = dlbridge.ElementwiseKernel("T x", "T z", {operation!r}, "escape_digraphs",
                                           preamble="#include <cstdlib>")
            k(np.arange(4, dtype=np.float32))
        except ValueError as e:
            print("refused:", e)
        print("ran at load:", os.environ.get("DLB_PWNED"))
        """
    )
    assert r.returncode == 0, r.stderr
    assert "refused: ElementwiseKernel `escape_digraphs`" in r.stdout and "close" in r.stdout, r.stdout
    assert "ran at load: None" in r.stdout, r.stdout


def test_a_directive_spelled_with_a_digraph_belongs_in_the_preamble():
    with pytest.raises(ValueError, match="belongs in the preamble"):
        dlbridge.ElementwiseKernel("T x", "T z", "%:define Y 1\nz = x", "digraph_define")


def test_a_preamble_constructor_is_refused_before_the_library_is_opened():
    r = _in_child(
        """
        import os, numpy as np, dlbridge
        k = dlbridge.ElementwiseKernel("T x", "T z", "z = x", "ctor_preamble",
            preamble='#include <cstdlib>\\nstatic struct S { S() { setenv("DLB_PWNED", "1", 1); } } s;')
        try:
            k(np.arange(4, dtype=np.float32))
        except ValueError as e:
            print("refused:", e)
        print("ran at load:", os.environ.get("DLB_PWNED"))
        """
    )
    assert r.returncode == 0, r.stderr
    assert "may not run when its library is loaded" in r.stdout, r.stdout
    assert "ran at load: None" in r.stdout, r.stdout


def test_a_pasted_return_in_loop_prep_is_refused_and_one_in_the_operation_ends_its_element():
    k = dlbridge.ElementwiseKernel(
        "T x", "T z", "z = 0", "pasted_return", preamble="#define J(a, b) a##b", loop_prep="J(ret, urn);"
    )
    with pytest.raises(ValueError, match="loop_prep.*return"):
        k(np.arange(1000, dtype=np.float32))
    k = dlbridge.ElementwiseKernel(
        "T x", "T z", "z = 1; J(ret, urn); z = 2;", "pasted_return_op", preamble="#define J(a, b) a##b"
    )
    assert (k(np.arange(1000, dtype=np.float32)) == 1).all()


def test_a_preamble_macro_named_like_generated_code_is_refused():
    k = dlbridge.ElementwiseKernel("T x", "T z", "z = x", "hijack_loop", preamble="#define for_runs(...) size")
    with pytest.raises(ValueError, match="macro `for_runs` rewrites the generated code"):
        k(np.arange(1000, dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.complex64])
def test_an_output_that_is_exactly_its_input_reads_the_old_value(dtype):
    k = dlbridge.ElementwiseKernel("T x", "T y", "y = x + 1; y = y * x", "inplace_reads_old")
    x = (np.arange(-50, 50) % 7).astype(dtype).reshape(10, 10)
    want = (x + 1) * x
    assert np.array_equal(k(x.copy()), want)
    for view in (lambda a: a, lambda a: a.T, lambda a: a[::-1, ::2]):
        base = x.copy()
        v = view(base)
        expected = (view(x) + 1) * view(x)
        assert k(v, out=v) is v
        assert np.array_equal(v, expected)
    t = torch.from_numpy(x.copy()) if dtype != np.complex64 else None
    if t is not None:
        assert k(t, out=t) is t
        assert np.array_equal(t.numpy(), want)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"options": "-O3 --use_fast_math"}, TypeError, "options must be a list of str"),
        ({"block": -1}, ValueError, "block must be positive, got -1"),
        ({"grid": -4}, ValueError, "grid must be positive, got -4"),
        ({"block": 2.5}, TypeError, "block must be an int"),
        ({"block": 2**40}, ValueError, r"RawKernel 'k': block must be at most 2\*\*31 - 1"),
        ({"grid": 2**33}, ValueError, r"RawKernel 'k': grid must be at most 2\*\*31 - 1"),
    ],
)
def test_raw_kernel_arguments_are_checked_where_they_are_given(kwargs, error, match):
    src = 'extern "C" __global__ void k(float* x, long long n) {}'
    with pytest.raises(error, match=match):
        dlbridge.cuda.RawKernel(src, "k", "k(x: mut f32[N])", **kwargs)


@pytest.mark.parametrize("placeholder, what", [("i", "the flat index `i`"), ("n", "the size `n`")])
def test_a_type_placeholder_named_like_the_index_or_size_is_refused_when_the_kernel_is_made(placeholder, what):
    with pytest.raises(ValueError, match=f"type placeholder `{placeholder}` has the name of {what}"):
        dlbridge.ElementwiseKernel(f"{placeholder} x", f"{placeholder} z", "z = x", f"placeholder_{placeholder}")


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_LAYOUTS = {
    "contiguous": lambda b: b[:4, :4],
    "transposed": lambda b: b[:4, :4].T,
    "negative strides": lambda b: b[3::-1, 3::-1],
    "shifted": lambda b: b[1:5, 1:5],
    "strided": lambda b: b[::2, ::2],
    "broadcast row": lambda b: np.broadcast_to(b[0, :4], (4, 4)),
}


@settings(max_examples=60, deadline=None)
@given(
    x_layout=st.sampled_from(sorted(_LAYOUTS)),
    y_layout=st.sampled_from(sorted(_LAYOUTS)),
    out_layout=st.sampled_from([k for k in sorted(_LAYOUTS) if k != "broadcast row"]),
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.complex128]),
)
def test_an_in_place_call_equals_the_out_of_place_result_in_every_layout(x_layout, y_layout, out_layout, dtype):
    k = dlbridge.ElementwiseKernel("T x, T y", "T z", "z = x + 1; z = z * x + y", "in_place_layouts")
    buf = (np.arange(64) % 11 - 5).astype(dtype).reshape(8, 8)
    x, y, out = _LAYOUTS[x_layout](buf), _LAYOUTS[y_layout](buf), _LAYOUTS[out_layout](buf)
    want = k(x.copy(), y.copy())
    assert k(x, y, out=out) is out
    np.testing.assert_array_equal(out, want)


def test_a_full_disk_is_an_error_naming_the_directory_not_a_compile_error(tmp_path):
    # A compiler that preprocesses, then fails as GCC does when its disk is full.
    fake = tmp_path / "fullcxx"
    fake.write_text(
        "#!/bin/sh\n"
        'case " $* " in *" --version "*) echo "g++ (full disk) 12"; exit 0;; esac\n'
        'case " $* " in *" -E "*) exec c++ "$@";; esac\n'
        'echo "fatal error: error writing to /tmp/ccAbCd.s: No space left on device" >&2\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    r = _in_child(
        """
        import numpy as np, dlbridge
        k = dlbridge.ElementwiseKernel("T x", "T z", "z = x + 1", "full_disk")
        try:
            k(np.arange(4, dtype=np.float32))
        except Exception as e:
            print(type(e).__name__, e)
        """,
        env={**os.environ, "CXX": str(fake), "DLBRIDGE_CACHE_DIR": str(cache)},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("RuntimeError full_disk: ElementwiseKernel full_disk"), r.stdout
    assert f"cannot build in {cache}" in r.stdout and "no space left on its file system" in r.stdout, r.stdout
    assert "rejected the kernel" not in r.stdout, r.stdout


def test_a_function_declared_and_never_defined_is_an_error_naming_it_not_a_dead_process():
    r = _in_child(
        """
        import numpy as np, dlbridge
        k = dlbridge.ElementwiseKernel("T x", "T z", "z = helper(x);", "undefined_helper", preamble="int helper(int v);")
        try:
            k(np.arange(6, dtype=np.int32))
        except ValueError as e:
            print("refused:", e)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "`_Z6helperi`" in r.stdout and "declares and never defines" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "where, text",
    [
        # A static local with a destructor registers it with __cxa_atexit: it would run at exit.
        ("operation", "static Bye b; z = x;"),
        # A thread_local one registers it with __cxa_thread_atexit: it would run when the thread ends.
        ("operation", "thread_local Bye b; z = x;"),
    ],
)
def test_an_object_whose_destructor_would_run_at_exit_is_refused(where, text):
    preamble = '#include <cstdio>\nstruct Bye { ~Bye() { std::fputs("the destructor ran\\n", stderr); } };'
    r = _in_child(
        f"""
        import numpy as np, dlbridge
        try:
            k = dlbridge.ElementwiseKernel("T x", "T z", {text!r}, "exit_hook", preamble={preamble!r})
            k(np.arange(6, dtype=np.int32))
        except ValueError as e:
            print("refused:", e)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "exits: a kernel's text may not" in r.stdout, r.stdout
    assert "the destructor ran" not in r.stderr, r.stderr


@pytest.mark.parametrize("kind", ["ElementwiseKernel", "load_inline"])
def test_an_include_that_never_ends_is_stopped_at_the_time_limit(kind, tmp_path):
    # A FIFO nobody writes: the preprocessor would wait for it for ever.
    fifo = tmp_path / "never.h"
    os.mkfifo(fifo)
    make = {
        "ElementwiseKernel": f"""dlbridge.ElementwiseKernel("T x", "T z", "z = x", "fifo_include",
                                                 preamble='#include "{fifo}"')(np.arange(4, dtype=np.float32))""",
        "load_inline": f"""dlbridge.load_inline("fifo_inline", c_source='#include "{fifo}"\\nvoid f(float* y, long long n) {{ y[0] = 1; }}',
                                          functions={{"f": "f(y: mut f32[N])"}})""",
    }[kind]
    r = _in_child(
        f"""
        import time, numpy as np, dlbridge
        t = time.monotonic()
        try:
            {make}
        except ValueError as e:
            print("refused:", e)
        print("seconds:", round(time.monotonic() - t, 1))
        """,
        env=dict(os.environ, DLBRIDGE_COMPILE_TIMEOUT="2", DLBRIDGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert r.returncode == 0, r.stderr
    assert "did not finish within 2 s and was stopped" in r.stdout and "DLBRIDGE_COMPILE_TIMEOUT" in r.stdout, r.stdout
    assert float(r.stdout.split("seconds:")[1]) < 60, r.stdout
    # Nothing the compiler started is left reading the FIFO: with no reader, opening it
    # for writing without blocking fails.
    time.sleep(0.5)
    with pytest.raises(OSError) as e:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert e.value.errno == errno.ENXIO, e.value


def test_a_macro_cannot_reach_a_system_headers_lines_to_skip_the_checks():
    # The preamble's macro would be expanded on <assert.h>'s own lines, which
    # the build leaves to the system, to replace the raw input's bounds check.
    pre = (
        "#undef _ASSERT_H_DECLS\n#undef __BEGIN_DECLS\n#undef __END_DECLS\n"
        "#define __BEGIN_DECLS template<> const int& dl ## bridge::Raw<const int>::operator[](ptrdiff_t k) const "
        "{ return data_[k]; }\n#define __END_DECLS\n#include <assert.h>\n"
    )
    with pytest.raises(ValueError, match="includes its headers before it defines or undefines any macro"):
        dlbridge.ElementwiseKernel("raw T x", "T z", "z = x[i + 1000]", "sys_header_macro", preamble=pre)


def test_a_kernels_rounding_mode_and_traps_end_with_its_call():
    r = _in_child(
        """
        import numpy as np, dlbridge
        up = dlbridge.ElementwiseKernel("T x", "T z", "fesetround(FE_UPWARD); z = x", "fenv_up_py", preamble="#include <cfenv>")
        trap = dlbridge.ElementwiseKernel("T x", "T z", "feenableexcept(FE_DIVBYZERO); z = x", "fenv_trap_py",
                                          preamble="#include <cfenv>")
        up(np.arange(4.0)); trap(np.arange(4.0))
        # A load_inline function too: the caller's environment survives it.
        src = "#include <cfenv>\\nvoid fenv_up_inline(const double* x, double* y, long long n) { fesetround(FE_UPWARD); feenableexcept(FE_DIVBYZERO); for (long long k = 0; k < n; ++k) y[k] = x[k]; }"
        mod = dlbridge.load_inline("fenv_inline_py", src, ["fenv_up_inline(x: f64[N]) -> (y: f64[N])"])
        mod.fenv_up_inline(np.arange(4.0))
        print(repr(float(np.float64(1.0) / np.float64(3.0))))
        with np.errstate(all="ignore"):
            print(np.array([1.0]) / np.array([0.0]))
        """
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["0.3333333333333333", "[inf]"], r.stdout


@pytest.mark.parametrize("kind", ["ElementwiseKernel", "ReductionKernel"])
def test_a_text_no_compiler_could_read_is_an_error_naming_its_argument(kind):
    with pytest.raises(ValueError, match=r"preamble holds '\\ud800' at position 3, which is not a character UTF-8 can encode"):
        if kind == "ElementwiseKernel":
            dlbridge.ElementwiseKernel("T x", "T z", "z = x", "surrogate", preamble="// \ud800")
        else:
            dlbridge.ReductionKernel("T x", "T y", "x", "a + b", "y = a", "0", "surrogate_r", preamble="// \ud800")


_DIVIDING_EXCEPTION = r"""
struct E : std::exception {
  int d;
  explicit E(int d_) : d(d_) {}
  E(const E& o) : d(o.d) {}
  ~E() { volatile int z = d; volatile int q = 7 / z; (void)q; }
  const char* what() const noexcept override { return "E thrown"; }
};
"""


@pytest.mark.parametrize("n", [8, 200_000])
def test_exceptions_of_every_chunk_are_released_under_the_division_check(n):
    # With several chunks each throws; those not rethrown are released by the runtime, and
    # their destructors (the text's code) divide by zero: an error, not a process killed.
    r = _in_child(
        f"""
        import numpy as np, dlbridge
        pre = {_DIVIDING_EXCEPTION!r}
        k = dlbridge.ElementwiseKernel("T x", "T y", "if (x > 0) throw E(0); y = x;", "chunks_throw", preamble=pre)
        try:
            k(np.ones({n}, np.float32))
        except RuntimeError as e:
            print("raised:", e)
        print("alive")
        """
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "raised: chunks_throw:" in r.stdout and "integer division or modulo by zero" in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("alive"), r.stdout


FOREIGN = r"""
#include <unwind.h>
#include <cxxabi.h>
namespace fx {
inline void cleanup(_Unwind_Reason_Code, _Unwind_Exception*) { BODY }
inline _Unwind_Exception ue;
}
"""
RAISE_FOREIGN = (
    "fx::ue.exception_class = 0x464f524549474e00ULL; fx::ue.exception_cleanup = fx::cleanup; "
    "abi::__cxa_begin_catch(&fx::ue); abi::__cxa_rethrow(); y = x;"
)


@pytest.mark.parametrize("body", ['std::fprintf(stderr, "[cleanup]\\n");', "volatile int z = 0; volatile int q = 1 / z; (void)q;"])
def test_a_foreign_exceptions_cleanup_runs_under_the_division_check_within_the_call(body):
    pre = FOREIGN.replace("BODY", body)
    r = _in_child(
        f"""
        import sys, numpy as np, dlbridge
        k = dlbridge.ElementwiseKernel("T x", "T y", {RAISE_FOREIGN!r}, "foreign_cleanup", preamble={pre!r})
        try:
            k(np.ones(4, np.float32))
        except RuntimeError as e:
            print("raised:", e, flush=True)
        print("alive", flush=True)
        print("[after the call]", file=sys.stderr, flush=True)
        """
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "raised: foreign_cleanup:" in r.stdout and r.stdout.rstrip().endswith("alive"), r.stdout
    if "fprintf" in body:
        assert "foreign (not C++) exception" in r.stdout, r.stdout
        # The cleanup (the text's code) ran inside the call, before it returned.
        assert r.stderr.index("[cleanup]") < r.stderr.index("[after the call]"), r.stderr
    else:
        assert "integer division or modulo by zero" in r.stdout, r.stdout


def test_an_exception_whose_what_divides_is_never_left_caught_for_another_kernel():
    r = _in_child(
        r"""
        import numpy as np, dlbridge
        pre = '''
        #include <exception>
        namespace ka { struct E : std::exception {
          const char* what() const noexcept override { volatile int z = 0; return (100 / z) ? "A" : "B"; } }; }
        '''
        a = dlbridge.ElementwiseKernel("float32 x", "float32 y", "throw ka::E()", "what_divides", preamble=pre)
        b = dlbridge.ElementwiseKernel("float32 x", "float32 y", "y = std::current_exception() ? 1.f : 0.f", "sees_caught",
                                       preamble="#include <exception>")
        x = np.ones(2, np.float32)
        try:
            a(x)
        except RuntimeError as e:
            print("raised:", e)
        print("b sees a caught exception:", b(x).tolist())
        """
    )
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "raised: what_divides:" in r.stdout and "integer division or modulo by zero" in r.stdout, r.stdout
    assert "b sees a caught exception: [0.0, 0.0]" in r.stdout, r.stdout
