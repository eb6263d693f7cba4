#!/usr/bin/env python3
"""Compile every dlbridge CUDA kernel source with NVRTC (via ctypes) and list
the PTX entry points. No GPU needed.

Usage:
  python kernels/cuda/cu/check_nvrtc.py [--nvrtc PATH] [--arch compute_75 ...]
                                     [--include-path DIR] [--out-dir DIR]

Exits non-zero (printing NVRTC's log) if any source fails to compile, or if
an expected entry point is missing from the PTX.

libnvrtc is looked up in this order: --nvrtc, $DLBRIDGE_NVRTC, the repo's
.venv (nvidia/cu13/lib/libnvrtc.so.13, then cu12), then the system loader
(libnvrtc.so.13 / .so.12 / .so).
"""
import argparse
import ctypes
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
HEADER = "dlbridge_common.cuh"
DTYPES = ("f32", "f64", "f16", "bf16")
EXPECTED = {
    "elementwise.cu": [f"dlbridge_{op}_{dt}" for op in ("add", "mul", "relu", "gelu") for dt in DTYPES],
    "softmax.cu": [f"dlbridge_softmax_{dt}" for dt in DTYPES],
    "sum.cu": [f"dlbridge_sum_{dt}" for dt in DTYPES],
}
BASE_OPTIONS = ["-default-device", "--std=c++17"]


def find_nvrtc(explicit):
    cands = []
    if explicit:
        cands.append(explicit)
    if os.environ.get("DLBRIDGE_NVRTC"):
        cands.append(os.environ["DLBRIDGE_NVRTC"])
    for cu in ("cu13", "cu12"):
        cands += sorted(glob.glob(os.path.join(
            REPO, ".venv", "lib", "python3*", "site-packages", "nvidia", cu, "lib", "libnvrtc.so*")))
        cands += sorted(glob.glob(os.path.join(
            REPO, ".venv", "lib", "python3*", "site-packages", "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
    cands += ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
    for c in cands:
        if "builtins" in os.path.basename(c) or ".alt." in os.path.basename(c):
            continue
        # libnvrtc dlopen()s libnvrtc-builtins.so.<maj>.<min> by bare name at
        # compile time; when it is not on the loader path, preload the copy that
        # sits next to libnvrtc (RTLD_GLOBAL) so that dlopen finds it by soname.
        if os.path.sep in c:
            for b in sorted(glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so*"))):
                if ".alt." not in os.path.basename(b):
                    try:
                        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                    except OSError:
                        pass
        try:
            return ctypes.CDLL(c), c
        except OSError:
            continue
    sys.exit("error: libnvrtc not found (use --nvrtc PATH or DLBRIDGE_NVRTC)")


class Nvrtc:
    def __init__(self, lib):
        self.lib = lib
        P = ctypes.c_void_p
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcVersion.argtypes = [ctypes.POINTER(ctypes.c_int)] * 2
        lib.nvrtcCreateProgram.argtypes = [
            ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
            ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcCompileProgram.argtypes = [P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.nvrtcGetProgramLogSize.argtypes = [P, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetProgramLog.argtypes = [P, ctypes.c_char_p]
        lib.nvrtcGetPTXSize.argtypes = [P, ctypes.POINTER(ctypes.c_size_t)]
        lib.nvrtcGetPTX.argtypes = [P, ctypes.c_char_p]
        lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(P)]
        for fn in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
                   "nvrtcGetProgramLog", "nvrtcGetPTXSize", "nvrtcGetPTX",
                   "nvrtcDestroyProgram", "nvrtcVersion"):
            getattr(lib, fn).restype = ctypes.c_int

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def version(self):
        a, b = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)), "nvrtcVersion")
        return a.value, b.value

    def compile(self, src, name, headers, options):
        """Returns (ok, log, ptx)."""
        prog = ctypes.c_void_p()
        hn = list(headers.items())
        hsrc = (ctypes.c_char_p * len(hn))(*[v.encode() for _, v in hn])
        hname = (ctypes.c_char_p * len(hn))(*[k.encode() for k, _ in hn])
        self.check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(),
                                               len(hn), hsrc, hname), "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            n = ctypes.c_size_t()
            self.check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n)), "nvrtcGetProgramLogSize")
            buf = ctypes.create_string_buffer(n.value)
            self.check(self.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            log = buf.value.decode(errors="replace")
            if rc != 0:
                return False, f"{self.lib.nvrtcGetErrorString(rc).decode()}\n{log}", ""
            self.check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(n)), "nvrtcGetPTXSize")
            buf = ctypes.create_string_buffer(n.value)
            self.check(self.lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            return True, log, buf.value.decode()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvrtc", help="path to libnvrtc.so")
    ap.add_argument("--arch", action="append", help="virtual arch(es), default compute_75 and compute_90")
    ap.add_argument("--include-path", action="append", default=[], help="extra --include-path for NVRTC")
    ap.add_argument("--out-dir", help="write <stem>.<arch>.ptx files here")
    ap.add_argument("--quiet", action="store_true", help="do not list entry points")
    args = ap.parse_args()
    archs = args.arch or ["compute_75", "compute_90"]

    lib, path = find_nvrtc(args.nvrtc)
    nv = Nvrtc(lib)
    print(f"nvrtc: {path} (version {'.'.join(map(str, nv.version()))})")
    with open(os.path.join(HERE, HEADER)) as f:
        headers = {HEADER: f.read()}
    sources = sorted(glob.glob(os.path.join(HERE, "*.cu")))
    if not sources:
        sys.exit("error: no .cu files found")

    failed = False
    total = 0
    for arch in archs:
        options = [f"--gpu-architecture={arch}"] + BASE_OPTIONS + [f"--include-path={d}" for d in args.include_path]
        print(f"== options: {' '.join(options)}")
        for src_path in sources:
            name = os.path.basename(src_path)
            with open(src_path) as f:
                src = f.read()
            ok, log, ptx = nv.compile(src, name, headers, options)
            if not ok:
                failed = True
                print(f"FAIL {name} [{arch}]\n{log}", file=sys.stderr)
                continue
            if log.strip():
                print(f"  note: NVRTC log for {name}:\n{log}")
            entries = re.findall(r"^\s*(?:\.visible\s+)?\.entry\s+([A-Za-z_][A-Za-z0-9_$]*)", ptx, re.M)
            total += len(entries)
            missing = [e for e in EXPECTED.get(name, []) if e not in entries]
            print(f"ok   {name} [{arch}]: {len(entries)} entry points, {len(ptx)} bytes of PTX")
            if not args.quiet:
                for e in entries:
                    print(f"       {e}")
            if missing:
                failed = True
                print(f"FAIL {name} [{arch}]: missing entry points: {', '.join(missing)}", file=sys.stderr)
            if args.out_dir:
                os.makedirs(args.out_dir, exist_ok=True)
                stem = os.path.splitext(name)[0]
                with open(os.path.join(args.out_dir, f"{stem}.{arch}.ptx"), "w") as f:
                    f.write(ptx)
    print(f"{'FAILED' if failed else 'all ok'}: {len(sources)} sources x {len(archs)} archs, {total} entry points")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
