//! An inline library's CUDA side: its CUDA C compiled by NVRTC (one
//! program per dtype combination, kept) and each function's launch on the
//! call's stream.

use std::sync::Arc;

use dlbridge_core::{DType, Device, Error, Result};
use dlbridge_cuda::CudaDevice;
use dlbridge_cuda::generated::{LaunchArg, Program};
use dlbridge_cuda::raw_kernel::{RawLaunch, c_type};
use dlbridge_registry::{Arg, Call, Scalar};

use super::{CUDA_SOURCE, InlineLibrary, value_error};

impl InlineLibrary {
    /// The CUDA C for the dtypes `lib`: typedefs, declarations, the user's source.
    pub fn cuda_source(&self, lib: &[DType]) -> Result<String> {
        let s = &*self.inner;
        let (mut src, cuda) = self.begin(lib, s.cuda_source.as_deref(), CUDA_SOURCE, crate::codegen::cuda::GENERATED_FILE, " (CUDA)")?;
        crate::codegen::cuda::stdint_typedefs(&mut src);
        src.line("#define restrict __restrict__");
        for ((n, _), d) in s.vars.iter().zip(lib) {
            src.line(&format!("typedef {} {n};", c_type(*d).unwrap_or("void")));
        }
        for f in s.functions.iter().filter(|f| f.cuda) {
            src.line(&format!("{};", f.prototype("extern \"C\" __global__ ", false)));
        }
        src.user(CUDA_SOURCE, cuda, "");
        Ok(src.text)
    }

    /// The NVRTC program for the dtypes `lib` (made once per combination).
    fn program(&self, lib: &[DType]) -> Result<Arc<Program>> {
        let mut map = self.inner.programs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(lib) {
            return Ok(p.clone());
        }
        let mut options: Vec<String> = crate::codegen::cuda::OPTIONS.iter().map(|s| s.to_string()).collect();
        options.extend(self.inner.opts.cuda_options.iter().cloned());
        let p = Arc::new(Program::new(self.cuda_source(lib)?, format!("{}.cu", CUDA_SOURCE), &options));
        map.insert(lib.to_vec(), p.clone());
        Ok(p)
    }

    /// NVRTC's rejection pointing into `cuda_source`, with the prototypes; other errors unchanged.
    fn explain_cuda(&self, lib: &[DType], e: Error) -> Error {
        let text = e.to_string();
        if !text.contains("NVRTC could not compile") {
            return e;
        }
        let version =
            dlbridge_cuda::nvrtc::nvrtc().map(|n| format!("NVRTC {}.{}", n.version.0, n.version.1)).unwrap_or_else(|_| "NVRTC".into());
        let user = [(CUDA_SOURCE, self.inner.cuda_source.as_deref().unwrap_or(""))];
        let mut msg = crate::codegen::cuda::explain(&self.what(lib), &version, &text, &user);
        msg.push_str(&self.prototypes_note(|f| f.cuda, "extern \"C\" __global__ "));
        value_error(msg)
    }

    /// The PTX of `cuda_source` for the dtypes `lib` and `arch`
    /// (`--gpu-architecture=compute_75`); no GPU needed. A compile error
    /// points into `cuda_source`.
    pub fn cuda_ptx(&self, lib: &[DType], arch: &str) -> Result<Arc<str>> {
        self.program(lib)?.ptx(arch).map_err(|e| self.explain_cuda(lib, e))
    }

    pub(super) fn run_cuda(&self, k: usize, call: &mut Call<'_, '_>) -> Result<()> {
        let f = &self.inner.functions[k];
        let lib = self.call_lib(k, call)?;
        let stream = call.stream();
        let bug = call.layout_bug();
        let (args, outs) = call.split();
        let mut tensors: Vec<(u64, Vec<i64>, Device)> = Vec::with_capacity(f.tensors.len());
        let mut scalars = Vec::with_capacity(f.scalars.len());
        for a in args.iter_mut() {
            match a {
                Arg::Tensor(v) => tensors.push((v.data_ptr() as usize as u64, v.shape().to_vec(), v.device())),
                Arg::TensorMut(v) => {
                    let ptr = v.data_ptr_mut() as usize as u64;
                    tensors.push((ptr, v.shape().to_vec(), v.device()));
                }
                Arg::Scalar(Scalar::F64(x)) => scalars.push(LaunchArg::F64(*x)),
                Arg::Scalar(Scalar::I64(x)) => scalars.push(LaunchArg::I64(*x)),
                Arg::Scalar(Scalar::Bool(b)) => scalars.push(LaunchArg::I32(i32::from(*b))),
            }
        }
        let n_in = tensors.len();
        for o in outs.iter_mut() {
            let ptr = o.data_ptr_mut() as usize as u64;
            tensors.push((ptr, o.shape().to_vec(), o.device()));
        }
        if tensors.len() != f.tensors.len() || scalars.len() != f.scalars.len() {
            return Err(bug);
        }
        let name = f.name();
        let device = tensors.first().map(|t| t.2).ok_or_else(|| Error::InvalidArgument(format!("{name}: no tensor argument")))?;
        dlbridge_cuda::probe::driver().map_err(|u| Error::UnsupportedDevice {
            got: device,
            what: format!("{name} ({}) on {device}: CUDA is not available here: {u}", self.origin()),
        })?;
        for (t, slot) in tensors.iter().zip(&f.tensors) {
            if t.2 != device {
                return Err(Error::UnsupportedDevice {
                    got: t.2,
                    what: format!("{name}: `{}` is on {}, `{}` on {device}", slot.name, t.2, f.tensors[0].name),
                });
            }
        }
        let n = if tensors.len() > n_in { tensors[n_in].1.iter().product::<i64>() } else { tensors[0].1.iter().product::<i64>() };
        let Some(cfg) = RawLaunch::default().for_elements(n.max(0) as u64) else { return Ok(()) };
        let ordinal = usize::try_from(device.id).map_err(|_| Error::InvalidArgument(format!("{name}: device {device}")))?;
        let dev = CudaDevice::get(ordinal)?;
        let function = self.program(&lib)?.function(&dev, name).map_err(|e| self.explain_cuda(&lib, e))?;
        let mut launch: Vec<LaunchArg> = Vec::with_capacity(tensors.len() + scalars.len() + f.sizes.len());
        launch.extend(tensors[..n_in].iter().map(|t| LaunchArg::Ptr(t.0)));
        launch.extend(scalars);
        launch.extend(tensors[n_in..].iter().map(|t| LaunchArg::Ptr(t.0)));
        launch.extend(f.sizes.iter().map(|s| LaunchArg::I64(s.value(&tensors[s.slot].1))));
        function.launch(cfg, stream, &launch)
    }
}
