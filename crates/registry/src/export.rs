//! The plugin side of the C ABI, for plugins written in Rust.
//!
//! ```text
//! use dlbridge_registry::export::PluginCall;
//!
//! fn scale(call: &mut PluginCall<'_>) -> dlbridge_core::Result<()> {
//!     let alpha = call.f64(0)?;
//!     let (ins, mut outs) = call.tensors(1)?;
//!     for (o, x) in outs[0].iter_mut::<f32>()?.zip(ins[0].iter::<f32>()?) {
//!         *o = alpha as f32 * x;
//!     }
//!     Ok(())
//! }
//!
//! dlbridge_registry::export_plugin! {
//!     name: "example", version: "0.1.0",
//!     kernels: [
//!         { signature: "scale(alpha: f64, x: f32[...S]) -> (y: f32[...S])", func: scale, doc: "y = alpha * x" },
//!     ]
//! }
//! ```
//!
//! Every entry point the macro generates runs the Rust function inside
//! `catch_unwind`: a panic becomes an error message in the caller's buffer and
//! return code 5 (runtime), never an unwind into C or an abort.
//!
//! Invariants: [`run`] is only called by the host with `num_tensors` valid
//! `DLTensor` pointers and `num_scalars` scalars, for a call the host checked
//! against the kernel's signature — so the tensors after the inputs (`mut`
//! parameters and outputs) are writable and exclusively the kernel's for the
//! duration of the call. Every DLTensor is still validated (as untrusted
//! foreign input) before a view is made of it. The error message is written
//! with at most `err_len - 1` bytes and a terminating NUL.

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The DLPack tensor struct entry points receive (re-exported for the macro).
pub use dlbridge_core::ffi::DLTensor;
use dlbridge_core::raw::view_from_dltensor;
use dlbridge_core::{Error, Flags, Result, TensorView, TensorViewMut};
use smallvec::SmallVec;

use crate::plugin::RawScalar;

/// What a Rust plugin kernel receives: the tensors (inputs, then `mut`
/// parameters and outputs, in signature order), the scalars and the stream.
#[derive(Debug)]
pub struct PluginCall<'c> {
    tensors: &'c [*mut DLTensor],
    scalars: &'c [RawScalar],
    stream: *mut c_void,
}

impl std::fmt::Debug for RawScalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: every member is 8 bytes of plain data; reading the bits is always defined.
        write!(f, "RawScalar({:#x})", unsafe { self.i64 })
    }
}

impl<'c> PluginCall<'c> {
    /// Number of tensors passed.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// The stream the host wants the kernel on (NULL on CPU).
    pub fn stream(&self) -> *mut c_void {
        self.stream
    }

    fn scalar(&self, i: usize) -> Result<RawScalar> {
        self.scalars
            .get(i)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("scalar {i} requested but {} were passed", self.scalars.len())))
    }

    /// Scalar `i` (counting scalars only) as f64.
    pub fn f64(&self, i: usize) -> Result<f64> {
        // SAFETY: 8 bytes of plain data; the signature says which member is meant.
        Ok(unsafe { self.scalar(i)?.f64 })
    }
    /// Scalar `i` as i64.
    pub fn i64(&self, i: usize) -> Result<i64> {
        // SAFETY: as above.
        Ok(unsafe { self.scalar(i)?.i64 })
    }
    /// Scalar `i` as bool.
    pub fn bool(&self, i: usize) -> Result<bool> {
        // SAFETY: as above.
        Ok(unsafe { self.scalar(i)?.boolean } != 0)
    }

    /// The first `inputs` tensors as read-only views and the rest (`mut`
    /// parameters, outputs) as writable views. Each DLTensor is validated.
    #[allow(clippy::type_complexity)]
    pub fn tensors(&mut self, inputs: usize) -> Result<(SmallVec<[TensorView<'_>; 4]>, SmallVec<[TensorViewMut<'_>; 2]>)> {
        if inputs > self.tensors.len() {
            return Err(Error::InvalidArgument(format!("{inputs} inputs requested but {} tensors were passed", self.tensors.len())));
        }
        let mut ins = SmallVec::new();
        let mut outs = SmallVec::new();
        for (i, &t) in self.tensors.iter().enumerate() {
            // SAFETY: the host passes valid DLTensors that live for the call
            // (module invariants); view_from_dltensor validates every field.
            let v = unsafe { view_from_dltensor(t, Flags::empty()) }.map_err(|e| e.context(format!("tensor {i}")))?;
            if i < inputs {
                ins.push(v);
            } else {
                // SAFETY: tensors after the inputs are writable and exclusive for the
                // call (the host checked writability and aliasing); the views are
                // handed out together, each over its own tensor.
                outs.push(unsafe { TensorViewMut::from_view(v) }.map_err(|e| e.context(format!("tensor {i}")))?);
            }
        }
        Ok((ins, outs))
    }
}

/// The arguments of one call of a `DLBridgeKernelFn` entry point, as the
/// host passed them.
#[derive(Debug, Clone, Copy)]
pub struct RawArgs {
    /// `num_tensors` DLTensor pointers (NULL when there are none).
    pub tensors: *const *mut DLTensor,
    /// How many.
    pub num_tensors: i32,
    /// `num_scalars` scalars (NULL when there are none).
    pub scalars: *const RawScalar,
    /// How many.
    pub num_scalars: i32,
    /// The call's stream (NULL on the CPU).
    pub stream: *mut c_void,
    /// `err_len` writable bytes for an error message (or NULL).
    pub err: *mut c_char,
    /// The size of `err`.
    pub err_len: usize,
}

/// Runs a Rust kernel behind a C entry point: catches panics, maps errors to
/// codes and writes the message into the caller's buffer. Used by
/// [`export_plugin!`](crate::export_plugin).
///
/// # Safety
/// `tensors` must point to `num_tensors` DLTensor pointers and `scalars` to
/// `num_scalars` scalars, valid for the call (NULL is allowed when the count is
/// 0), and `err` to `err_len` writable bytes (or be NULL).
pub unsafe fn run(args: RawArgs, func: fn(&mut PluginCall<'_>) -> Result<()>) -> i32 {
    let RawArgs { tensors, num_tensors, scalars, num_scalars, stream, err, err_len } = args;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let tensors: &[*mut DLTensor] = if num_tensors <= 0 || tensors.is_null() {
            &[]
        } else {
            // SAFETY: `num_tensors` valid pointers (caller contract).
            unsafe { std::slice::from_raw_parts(tensors, num_tensors as usize) }
        };
        let scalars: &[RawScalar] = if num_scalars <= 0 || scalars.is_null() {
            &[]
        } else {
            // SAFETY: `num_scalars` valid scalars (caller contract).
            unsafe { std::slice::from_raw_parts(scalars, num_scalars as usize) }
        };
        func(&mut PluginCall { tensors, scalars, stream })
    }));
    let (code, message) = match result {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => (e.kind().code(), e.to_string()),
        Err(panic) => {
            (dlbridge_core::ErrorKind::Runtime.code(), format!("kernel panicked: {}", crate::kernel::panic_message(panic.as_ref())))
        }
    };
    if !err.is_null() && err_len > 0 {
        let bytes = message.as_bytes();
        let n = bytes.len().min(err_len - 1);
        // SAFETY: `err` has err_len writable bytes; we write n < err_len bytes and a NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), err.cast::<u8>(), n);
            err.add(n).write(0);
        }
    }
    code
}

/// Exports a plugin table from a Rust `cdylib`. See the [module docs](self).
///
/// Each kernel: `{ signature: "...", func: path, doc: "..." (optional),
/// flags: u32 (optional), device: i32 (optional, default 1 = CPU) }`.
#[macro_export]
macro_rules! export_plugin {
    (
        name: $name:literal, version: $version:literal,
        kernels: [ $( { signature: $sig:literal, func: $func:path $(, doc: $doc:literal)? $(, flags: $flags:expr)? $(, device: $device:expr)? $(,)? } ),* $(,)? ] $(,)?
    ) => {
        const __DLBRIDGE_KERNELS: &[$crate::plugin::RawKernel] = &[ $(
            $crate::plugin::RawKernel {
                signature: concat!($sig, "\0").as_ptr().cast(),
                device_type: { let _d = 1i32; $( let _d = $device; )? _d },
                flags: { let _f = 0u32; $( let _f = $flags; )? _f },
                entry: {
                    unsafe extern "C" fn __entry(
                        tensors: *const *mut $crate::export::DLTensor,
                        num_tensors: i32,
                        scalars: *const $crate::plugin::RawScalar,
                        num_scalars: i32,
                        stream: *mut ::std::ffi::c_void,
                        err: *mut ::std::ffi::c_char,
                        err_len: usize,
                    ) -> i32 {
                        // SAFETY: the host calls entry points per the ABI (see plugin.h).
                        unsafe { $crate::export::run($crate::export::RawArgs { tensors, num_tensors, scalars, num_scalars, stream, err, err_len }, $func) }
                    }
                    Some(__entry)
                },
                doc: { let _doc: &str = "\0"; $( let _doc: &str = concat!($doc, "\0"); )? _doc.as_ptr().cast() },
            }
        ),* ];
        static __DLBRIDGE_PLUGIN: $crate::plugin::StaticPlugin = $crate::plugin::StaticPlugin($crate::plugin::RawPlugin {
            abi_version: $crate::plugin::ABI_VERSION,
            struct_size: ::std::mem::size_of::<$crate::plugin::RawPlugin>() as u32,
            name: concat!($name, "\0").as_ptr().cast(),
            version: concat!($version, "\0").as_ptr().cast(),
            kernel_size: ::std::mem::size_of::<$crate::plugin::RawKernel>() as u32,
            num_kernels: __DLBRIDGE_KERNELS.len() as u32,
            kernels: __DLBRIDGE_KERNELS.as_ptr(),
        });
        /// The plugin table (dlbridge plugin ABI v1).
        #[unsafe(no_mangle)]
        pub extern "C" fn dlbridge_plugin() -> *const $crate::plugin::RawPlugin {
            &__DLBRIDGE_PLUGIN.0
        }
    };
}
