//! XLA's FFI C ABI (`xla/ffi/api/c_api.h`, as jaxlib installs it) and the
//! handler that runs registry kernels on XLA's buffers.
//!
//! Invariants (the unsafe here):
//! - XLA calls the handler with a call frame whose pointers are valid for the
//!   call, laid out as `c_api.h` defines them. Every struct is read only after
//!   its `struct_size` says it holds the fields read (older runtimes pass
//!   smaller structs; fields are only ever appended). `XLA_FFI_STRUCT_SIZE`
//!   is the offset of a struct's last field plus that field's size (no tail
//!   padding), which is what [`size_to`] computes.
//! - Operand and result buffers are dense row-major arrays of `dims` with
//!   XLA's dtype, alive and unaliased (but for `input_output_aliases`, which
//!   the handler writes through the result only) until the handler returns.
//!   Operands are viewed read-only: the registry refuses to write them.
//! - Nothing unwinds out of the handler: a panic becomes an XLA error.

use std::ffi::{CString, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};

use dlbridge_core::{DType, Device, Flags, TensorView, TensorViewMut};
use dlbridge_registry::signature::ParamKind;
use dlbridge_registry::{Arg, Registry, Scalar};

/// The API version the handler implements (the metadata XLA asks for).
const API_MAJOR: c_int = 0;
const API_MINOR: c_int = 1;

/// The attribute that names the registry kernel to run.
const KERNEL_ATTR: &str = "dlbridge_kernel";
/// The attribute that gives the kernel by identity (`dlbridge_registry::handles`):
/// the kernel the program was built for, whatever its name holds now.
const HANDLE_ATTR: &str = "dlbridge_kernel_handle";
/// The attribute that says what the kernel is (`Kernel::digest`): a program
/// runs the kernel it was built for, or fails saying so.
const DIGEST_ATTR: &str = "dlbridge_kernel_digest";

const EXTENSION_METADATA: c_int = 1;
const STAGE_EXECUTE: c_int = 3;
const ARG_BUFFER: c_int = 1;
const RET_BUFFER: c_int = 1;
const ATTR_SCALAR: c_int = 3;
const ATTR_STRING: c_int = 4;

const ERR_INVALID_ARGUMENT: c_int = 3;
const ERR_NOT_FOUND: c_int = 5;
const ERR_UNIMPLEMENTED: c_int = 12;
const ERR_INTERNAL: c_int = 13;

#[repr(C)]
struct ExtensionBase {
    struct_size: usize,
    kind: c_int,
    next: *mut ExtensionBase,
}

#[repr(C)]
struct ApiVersion {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    major: c_int,
    minor: c_int,
}

#[repr(C)]
struct Metadata {
    struct_size: usize,
    api_version: ApiVersion,
    traits: u32,
    state_type_id: i64,
}

#[repr(C)]
struct MetadataExtension {
    base: ExtensionBase,
    metadata: *mut Metadata,
}

#[repr(C)]
struct Buffer {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    dtype: c_int,
    data: *mut c_void,
    rank: i64,
    dims: *const i64,
}

#[repr(C)]
struct List {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *const c_int,
    items: *const *mut c_void,
}

#[repr(C)]
struct Attrs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *const c_int,
    names: *const *const ByteSpan,
    attrs: *const *const c_void,
}

#[repr(C)]
struct ByteSpan {
    ptr: *const c_char,
    len: usize,
}

#[repr(C)]
struct XlaScalar {
    dtype: c_int,
    value: *const c_void,
}

/// `XLA_FFI_CallFrame`.
#[repr(C)]
pub struct CallFrame {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api: *const Api,
    ctx: *mut c_void,
    stage: c_int,
    args: List,
    rets: List,
    attrs: Attrs,
}

type ApiFn<A> = Option<unsafe extern "C" fn(*mut A) -> *mut c_void>;

#[repr(C)]
struct Api {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api_version: ApiVersion,
    internal_api: *const c_void,
    error_create: ApiFn<ErrorCreateArgs>,
    error_get_message: *const c_void,
    error_destroy: *const c_void,
    handler_register: *const c_void,
    stream_get: ApiFn<ContextQuery<*mut c_void>>,
    type_register: *const c_void,
    execution_context_get: *const c_void,
    state_set: *const c_void,
    state_get: *const c_void,
    device_memory_allocate: *const c_void,
    device_memory_free: *const c_void,
    thread_pool_schedule: *const c_void,
    thread_pool_num_threads: *const c_void,
    future_create: *const c_void,
    future_set_available: *const c_void,
    future_set_error: *const c_void,
    run_id_get: *const c_void,
    device_ordinal_get: ApiFn<ContextQuery<i32>>,
}

#[repr(C)]
struct ErrorCreateArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    message: *const c_char,
    errc: c_int,
}

/// `XLA_FFI_Stream_Get_Args` (`T` = `void*`) and
/// `XLA_FFI_DeviceOrdinal_Get_Args` (`T` = `int32_t`).
#[repr(C)]
struct ContextQuery<T> {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    ctx: *mut c_void,
    out: T,
}

/// `XLA_FFI_STRUCT_SIZE`: the bytes up to the end of a field.
const fn size_to(offset: usize, field: usize) -> usize {
    offset + field
}

const CALL_FRAME_SIZE: usize = size_to(offset_of!(CallFrame, attrs), size_of::<Attrs>());
const BUFFER_SIZE: usize = size_to(offset_of!(Buffer, dims), size_of::<*const i64>());
const LIST_SIZE: usize = size_to(offset_of!(List, items), size_of::<*const c_void>());
const ATTRS_SIZE: usize = size_to(offset_of!(Attrs, attrs), size_of::<*const c_void>());
const METADATA_EXTENSION_SIZE: usize = size_to(offset_of!(MetadataExtension, metadata), size_of::<*mut Metadata>());
const METADATA_SIZE: usize = size_to(offset_of!(Metadata, traits), size_of::<u32>());
const METADATA_WITH_STATE_SIZE: usize = size_to(offset_of!(Metadata, state_type_id), size_of::<i64>());
const API_VERSION_SIZE: usize = size_to(offset_of!(ApiVersion, minor), size_of::<c_int>());
const ERROR_CREATE_ARGS_SIZE: usize = size_to(offset_of!(ErrorCreateArgs, errc), size_of::<c_int>());
const STREAM_QUERY_SIZE: usize = size_to(offset_of!(ContextQuery<*mut c_void>, out), size_of::<*mut c_void>());
const ORDINAL_QUERY_SIZE: usize = size_to(offset_of!(ContextQuery<i32>, out), size_of::<i32>());

/// The platform a handler is registered for (`jax.ffi.register_ffi_target(...,
/// platform=...)`): where its buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// Host memory (`platform="cpu"`).
    Cpu,
    /// CUDA device memory, run on XLA's stream (`platform="CUDA"`).
    Cuda,
}

/// The `XLA_FFI_Handler*` for `platform`: a function pointer to wrap in a
/// PyCapsule for `jax.ffi.register_ffi_target`.
pub fn handler(platform: Platform) -> *const c_void {
    match platform {
        Platform::Cpu => execute_cpu as *const c_void,
        Platform::Cuda => execute_cuda as *const c_void,
    }
}

/// A failed call: an error to make (XLA's code and the message), or one XLA
/// made and the handler passes on.
enum Failure {
    New(c_int, String),
    Xla(*mut c_void),
}

fn invalid(message: impl Into<String>) -> Failure {
    Failure::New(ERR_INVALID_ARGUMENT, message.into())
}

extern "C" fn execute_cpu(frame: *mut CallFrame) -> *mut c_void {
    execute(frame, Platform::Cpu)
}

extern "C" fn execute_cuda(frame: *mut CallFrame) -> *mut c_void {
    execute(frame, Platform::Cuda)
}

fn execute(frame: *mut CallFrame, platform: Platform) -> *mut c_void {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: XLA passes a call frame valid for the call, whose first field
        // is its size (module invariants); nothing else is read before the
        // size says the frame holds it.
        let size = unsafe { (&raw const (*frame).struct_size).read() };
        if size < CALL_FRAME_SIZE {
            return Err(invalid(format!(
                "dlbridge: XLA's call frame has {size} bytes, fewer than the {CALL_FRAME_SIZE} of XLA FFI API {API_MAJOR}.{API_MINOR}"
            )));
        }
        // SAFETY: the frame holds every field `CallFrame` declares (checked above).
        run(unsafe { &*frame }, platform)
    }));
    let failure = match outcome {
        Ok(Ok(())) => return std::ptr::null_mut(),
        Ok(Err(Failure::Xla(e))) => return e,
        Ok(Err(f)) => f,
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            Failure::New(ERR_INTERNAL, format!("dlbridge XLA handler panicked: {}", what.unwrap_or_else(|| "(no message)".into())))
        }
    };
    let Failure::New(code, message) = failure else { return std::ptr::null_mut() };
    // SAFETY: XLA's call frame for this call (module invariants).
    unsafe { error(frame, code, &message) }
}

/// An `XLA_FFI_Error` saying `message`, made by XLA's own API.
///
/// # Safety
/// `frame` is XLA's call frame for this call.
unsafe fn error(frame: *mut CallFrame, code: c_int, message: &str) -> *mut c_void {
    let unreportable = || {
        // An XLA too broken to take an error: say it where a person sees it
        // (a failed write to stderr is ignored, never a panic).
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "dlbridge XLA handler: cannot report an error to this XLA: {message}");
        std::ptr::null_mut()
    };
    // SAFETY: the caller's contract: the size is the frame's first field, and
    // `api` is read only when the size says the frame holds it.
    let api = unsafe {
        let size = (&raw const (*frame).struct_size).read();
        if size < size_to(offset_of!(CallFrame, api), size_of::<*const Api>()) {
            return unreportable();
        }
        (&raw const (*frame).api).read()
    };
    // SAFETY: a non-NULL `api` is XLA's API table, alive for the process;
    // `error_create` is read only when its size says the table holds it.
    let create = unsafe { api_fn(api, offset_of!(Api, error_create), |a| (&raw const (*a).error_create).read()) };
    let Some(create) = create else {
        return unreportable();
    };
    let message = CString::new(message.replace('\0', "?")).unwrap_or_default();
    let mut args = ErrorCreateArgs {
        struct_size: ERROR_CREATE_ARGS_SIZE,
        extension_start: std::ptr::null_mut(),
        message: message.as_ptr(),
        errc: code,
    };
    // SAFETY: XLA's error constructor with its argument struct, filled; it
    // copies the message (alive until it returns).
    unsafe { create(&mut args) }
}

/// A function of XLA's API table at `offset`, if the table is there and
/// holds it (`read` reads the field).
///
/// # Safety
/// `api` is NULL or XLA's API table, whose first field is its size.
unsafe fn api_fn<F>(api: *const Api, offset: usize, read: impl FnOnce(*const Api) -> Option<F>) -> Option<F> {
    if api.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; the field is read only if the table reaches it.
    let size = unsafe { (&raw const (*api).struct_size).read() };
    if size < offset + size_of::<*const c_void>() { None } else { read(api) }
}

fn run(frame: &CallFrame, platform: Platform) -> Result<(), Failure> {
    if !frame.extension_start.is_null() {
        // SAFETY: a non-NULL extension is an `XLA_FFI_Extension_Base` (module invariants).
        let ext = unsafe { &*frame.extension_start };
        if ext.kind == EXTENSION_METADATA {
            return metadata(frame.extension_start.cast());
        }
    }
    if frame.stage != STAGE_EXECUTE {
        return Err(invalid(format!("dlbridge: called for execution stage {}; it registers an execute handler only", frame.stage)));
    }
    let attrs = attributes(&frame.attrs)?;
    let name = attrs
        .kernel
        .ok_or_else(|| invalid(format!("dlbridge: the custom call has no `{KERNEL_ATTR}` attribute (call it through dlbridge.jax)")))?;
    let digest = attrs.digest.ok_or_else(|| {
        invalid(format!(
            "{name}: the custom call has no `{DIGEST_ATTR}` attribute saying which kernel it was built for (call it through dlbridge.jax)"
        ))
    })?;
    let kernel = resolve(name, digest, attrs.handle)?;
    let sig = kernel.signature();
    let (device, stream) = match platform {
        Platform::Cpu => (Device::CPU, std::ptr::null_mut()),
        Platform::Cuda => cuda_context(frame)?,
    };
    let operands = buffers(&frame.args, ARG_BUFFER, "operand")?;
    let results = buffers(&frame.rets, RET_BUFFER, "result")?;
    let tensors = sig.params.iter().filter(|p| matches!(p.kind, ParamKind::Tensor(_))).count();
    let muts = sig.params.iter().filter(|p| matches!(&p.kind, ParamKind::Tensor(t) if t.mutable)).count();
    let n_out = sig.outputs.len();
    if operands.len() != tensors || results.len() != n_out + muts {
        return Err(invalid(format!(
            "{}: the custom call has {} operands and {} results; the signature takes {tensors} tensors and gives {n_out} outputs plus {muts} `mut` parameters",
            sig.name,
            operands.len(),
            results.len()
        )));
    }
    let mut args = Vec::with_capacity(sig.params.len());
    let (mut operand, mut aliased) = (operands.iter(), results[n_out..].iter());
    for p in &sig.params {
        let what = |e: dlbridge_core::Error| invalid(format!("{}: argument {}: {e}", sig.name, p.name));
        args.push(match &p.kind {
            ParamKind::Tensor(t) if t.mutable => {
                // Written through its aliased result, which must be the
                // operand's own buffer (XLA aliases them when the call says
                // so); the operand is never touched otherwise. A call without
                // the alias would have the kernel read an uninitialised result.
                let o = operand.next().ok_or_else(|| invalid(format!("{}: no operand for {}", sig.name, p.name)))?;
                let b = aliased.next().ok_or_else(|| invalid(format!("{}: no result for `mut` {}", sig.name, p.name)))?;
                let v = view_mut(b, device).map_err(what)?;
                if v.as_view().numel() > 0 && o.data != b.data {
                    return Err(invalid(format!(
                        "{}: `mut` parameter {}: the custom call does not alias its result with the operand \
                         (input_output_aliases; dlbridge.jax.as_op passes it), so the kernel would read an uninitialised buffer",
                        sig.name, p.name
                    )));
                }
                Arg::TensorMut(v)
            }
            ParamKind::Tensor(_) => {
                let b = operand.next().ok_or_else(|| invalid(format!("{}: no operand for {}", sig.name, p.name)))?;
                Arg::Tensor(view(b, device, Flags::READ_ONLY).map_err(what)?)
            }
            ParamKind::Scalar(kind) => {
                let s = attrs.scalars.iter().find(|(n, _)| *n == p.name).map(|(_, s)| *s).ok_or_else(|| {
                    invalid(format!("{}: the custom call has no attribute for the {kind} parameter {}", sig.name, p.name))
                })?;
                Arg::Scalar(s)
            }
        });
    }
    let mut outs = results[..n_out]
        .iter()
        .zip(&sig.outputs)
        .map(|(b, o)| view_mut(b, device).map_err(|e| invalid(format!("{}: output {}: {e}", sig.name, o.name))))
        .collect::<Result<Vec<_>, _>>()?;
    kernel.call_on_stream(&mut args, &mut outs, stream).map_err(|e| invalid(e.to_string()))
}

/// The kernel a call was built for: the one its handle names in this
/// process, else the registered kernel of its name, whichever has the digest
/// the call carries. A kernel of that name that is something else (a program
/// serialised in another process, where handle numbers mean other kernels,
/// or a name defined again since) is an error naming both.
fn resolve(name: &str, digest: &str, handle: Option<i64>) -> Result<std::sync::Arc<dlbridge_registry::Kernel>, Failure> {
    let by_handle = handle.and_then(|h| u64::try_from(h).ok()).and_then(dlbridge_registry::handles::resolve);
    if let Some(k) = &by_handle
        && k.name() == name
        && k.digest() == digest
    {
        return Ok(k.clone());
    }
    let by_name = Registry::global().get(name).ok();
    if let Some(k) = &by_name
        && k.digest() == digest
    {
        return Ok(k.clone());
    }
    let mismatch = match (&by_name, &by_handle) {
        (Some(k), _) => Some(format!("`{name}` here is `{}` (digest {})", k.signature_text(), k.digest())),
        (None, Some(k)) if k.name() == name => Some(format!("the kernel it named is now `{}` (digest {})", k.signature_text(), k.digest())),
        _ => None,
    };
    Err(Failure::New(
        ERR_NOT_FOUND,
        match mismatch {
            Some(here) => format!(
                "dlbridge kernel `{name}`: this program was built for the kernel with digest {digest}, but {here}; \
                 define the same kernel (signature and source) in this process before running the program"
            ),
            None => format!(
                "dlbridge kernel `{name}` (digest {digest}): this program calls a kernel this process has not defined; \
                 define it (the same ElementwiseKernel, ReductionKernel, dlbridge.define or load_inline, or load its plugin) \
                 before running the program"
            ),
        },
    ))
}

/// Answers XLA's metadata query: the API version implemented, no traits.
fn metadata(ext: *mut MetadataExtension) -> Result<(), Failure> {
    // SAFETY: a metadata extension (its kind says so), valid for the call,
    // whose first field is its size; `metadata` is read only when the size
    // says the extension holds it, and each field of the metadata is read or
    // written only when its size says the metadata holds it.
    unsafe {
        let size = (&raw const (*ext).base.struct_size).read();
        if size < METADATA_EXTENSION_SIZE {
            return Err(invalid(format!("dlbridge: XLA's metadata extension has {size} bytes")));
        }
        let m = (&raw const (*ext).metadata).read();
        if m.is_null() {
            return Err(invalid("dlbridge: XLA's metadata extension has no metadata"));
        }
        let size = (&raw const (*m).struct_size).read();
        if size < METADATA_SIZE {
            return Err(invalid(format!("dlbridge: XLA's metadata has {size} bytes, fewer than {METADATA_SIZE}")));
        }
        let version =
            ApiVersion { struct_size: API_VERSION_SIZE, extension_start: std::ptr::null_mut(), major: API_MAJOR, minor: API_MINOR };
        (&raw mut (*m).api_version).write(version);
        (&raw mut (*m).traits).write(0);
        if size >= METADATA_WITH_STATE_SIZE {
            (&raw mut (*m).state_type_id).write(0); // XLA_FFI_UNKNOWN_TYPE_ID: no state
        }
    }
    Ok(())
}

/// XLA's stream and the device it runs on (CUDA).
fn cuda_context(frame: &CallFrame) -> Result<(Device, *mut c_void), Failure> {
    let unavailable = |what: &str| Failure::New(ERR_UNIMPLEMENTED, format!("dlbridge: this XLA's FFI API has no {what}"));
    // SAFETY: `api` is XLA's API table (module invariants); each function is
    // read only when the table holds it.
    let (stream_get, ordinal_get) = unsafe {
        (
            api_fn(frame.api, offset_of!(Api, stream_get), |a| (&raw const (*a).stream_get).read()),
            api_fn(frame.api, offset_of!(Api, device_ordinal_get), |a| (&raw const (*a).device_ordinal_get).read()),
        )
    };
    let stream_get = stream_get.ok_or_else(|| unavailable("Stream_Get"))?;
    let ordinal_get = ordinal_get.ok_or_else(|| unavailable("DeviceOrdinal_Get"))?;
    let mut stream =
        ContextQuery { struct_size: STREAM_QUERY_SIZE, extension_start: std::ptr::null_mut(), ctx: frame.ctx, out: std::ptr::null_mut() };
    // SAFETY: XLA's own query with its argument struct, filled, for this call's context.
    let e = unsafe { stream_get(&mut stream) };
    if !e.is_null() {
        return Err(Failure::Xla(e));
    }
    let mut ordinal = ContextQuery { struct_size: ORDINAL_QUERY_SIZE, extension_start: std::ptr::null_mut(), ctx: frame.ctx, out: 0i32 };
    // SAFETY: as above.
    let e = unsafe { ordinal_get(&mut ordinal) };
    if !e.is_null() {
        return Err(Failure::Xla(e));
    }
    Ok((Device::cuda(ordinal.out), stream.out))
}

/// The `kernel` attribute and the scalar attributes, by name.
struct Attributes<'f> {
    kernel: Option<&'f str>,
    digest: Option<&'f str>,
    handle: Option<i64>,
    scalars: Vec<(&'f str, Scalar)>,
}

fn attributes(attrs: &Attrs) -> Result<Attributes<'_>, Failure> {
    if attrs.struct_size < ATTRS_SIZE || attrs.size < 0 {
        return Err(invalid(format!("dlbridge: XLA's attributes struct has {} bytes and {} entries", attrs.struct_size, attrs.size)));
    }
    let mut out = Attributes { kernel: None, digest: None, handle: None, scalars: Vec::new() };
    for i in 0..attrs.size as usize {
        // SAFETY: `size` entries in each of the three arrays (module invariants).
        let (kind, name, value) = unsafe { (*attrs.types.add(i), *attrs.names.add(i), *attrs.attrs.add(i)) };
        // SAFETY: a name is a byte span valid for the call.
        let name = unsafe { bytes(&*name) }?;
        match kind {
            ATTR_STRING if name == KERNEL_ATTR => {
                // SAFETY: a string attribute is a byte span valid for the call.
                out.kernel = Some(unsafe { bytes(&*value.cast::<ByteSpan>()) }?);
            }
            ATTR_STRING if name == DIGEST_ATTR => {
                // SAFETY: a string attribute is a byte span valid for the call.
                out.digest = Some(unsafe { bytes(&*value.cast::<ByteSpan>()) }?);
            }
            ATTR_SCALAR => {
                // SAFETY: a scalar attribute is an `XLA_FFI_Scalar` valid for the call.
                let s = unsafe { &*value.cast::<XlaScalar>() };
                match (name == HANDLE_ATTR, scalar(name, s)?) {
                    (true, Scalar::I64(h)) => out.handle = Some(h),
                    (true, _) => return Err(invalid(format!("dlbridge: `{HANDLE_ATTR}` is not a 64-bit integer"))),
                    (false, v) => out.scalars.push((name, v)),
                }
            }
            _ => return Err(invalid(format!("dlbridge: unexpected attribute `{name}` of XLA attribute type {kind}"))),
        }
    }
    Ok(out)
}

/// A byte span's text.
///
/// # Safety
/// `span` points to `len` readable bytes for the call.
unsafe fn bytes(span: &ByteSpan) -> Result<&str, Failure> {
    if span.len == 0 {
        return Ok("");
    }
    // SAFETY: the caller's contract.
    let raw = unsafe { std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len) };
    std::str::from_utf8(raw).map_err(|_| invalid("dlbridge: an attribute name or value is not UTF-8"))
}

/// A scalar attribute as the registry's scalar: 64-bit floats, 32/64-bit
/// integers and booleans (the types `dlbridge.jax` passes).
fn scalar(name: &str, s: &XlaScalar) -> Result<Scalar, Failure> {
    /// The scalar's value as a `T`.
    ///
    /// # Safety
    /// The value is one `T` (its dtype says so).
    unsafe fn read<T>(s: &XlaScalar) -> T {
        // SAFETY: the caller's contract; XLA keeps the value alive for the call.
        unsafe { s.value.cast::<T>().read_unaligned() }
    }
    Ok(match s.dtype {
        // SAFETY: the value is one scalar of the dtype matched (so below).
        12 => Scalar::F64(unsafe { read::<f64>(s) }),
        // SAFETY: as above.
        11 => Scalar::F64(f64::from(unsafe { read::<f32>(s) })),
        // SAFETY: as above.
        5 => Scalar::I64(unsafe { read::<i64>(s) }),
        // SAFETY: as above.
        4 => Scalar::I64(i64::from(unsafe { read::<i32>(s) })),
        // SAFETY: as above.
        1 => Scalar::Bool(unsafe { read::<u8>(s) } != 0),
        other => return Err(invalid(format!("dlbridge: attribute `{name}` has XLA dtype {other}; f64, i64 or bool expected"))),
    })
}

/// The buffers of an operand or result list (every entry must be a buffer).
fn buffers<'f>(list: &'f List, expected: c_int, what: &str) -> Result<Vec<&'f Buffer>, Failure> {
    if list.struct_size < LIST_SIZE || list.size < 0 {
        return Err(invalid(format!("dlbridge: XLA's {what} list has {} bytes and {} entries", list.struct_size, list.size)));
    }
    (0..list.size as usize)
        .map(|i| {
            // SAFETY: `size` entries in both arrays (module invariants).
            let (kind, item) = unsafe { (*list.types.add(i), *list.items.add(i)) };
            if kind != expected || item.is_null() {
                return Err(invalid(format!("dlbridge: {what} {i} is not a buffer (XLA type {kind})")));
            }
            // SAFETY: a buffer entry is an `XLA_FFI_Buffer` valid for the call.
            let b = unsafe { &*item.cast::<Buffer>() };
            if b.struct_size < BUFFER_SIZE || b.rank < 0 || (b.rank > 0 && b.dims.is_null()) {
                return Err(invalid(format!("dlbridge: {what} {i}: a malformed XLA buffer (size {}, rank {})", b.struct_size, b.rank)));
            }
            Ok(b)
        })
        .collect()
}

/// The dtype of an XLA element type, for those dlbridge kernels take.
fn dtype(code: c_int) -> dlbridge_core::Result<DType> {
    Ok(match code {
        1 => DType::BOOL,
        2 => DType::I8,
        3 => DType::I16,
        4 => DType::I32,
        5 => DType::I64,
        6 => DType::U8,
        7 => DType::U16,
        8 => DType::U32,
        9 => DType::U64,
        10 => DType::F16,
        11 => DType::F32,
        12 => DType::F64,
        15 => DType::C64,
        16 => DType::BF16,
        18 => DType::C128,
        other => return Err(dlbridge_core::Error::InvalidArgument(format!("XLA element type {other} has no dlbridge dtype"))),
    })
}

/// A view of a buffer (read-only with `Flags::READ_ONLY`), validated like
/// any foreign tensor.
fn view(b: &Buffer, device: Device, flags: Flags) -> dlbridge_core::Result<TensorView<'_>> {
    let shape: &[i64] = if b.rank == 0 {
        &[]
    } else {
        // SAFETY: `rank` dims (checked non-NULL in `buffers`), alive for the call.
        unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) }
    };
    // SAFETY: a dense row-major buffer of `shape` and the dtype at `data`,
    // alive for the call (module invariants); the layout is validated here.
    unsafe { TensorView::from_raw_parts(b.data.cast::<u8>(), 0, shape, None, dtype(b.dtype)?, device, flags) }
}

/// A writable view of a result buffer.
fn view_mut(b: &Buffer, device: Device) -> dlbridge_core::Result<TensorViewMut<'_>> {
    // SAFETY: a result buffer is the handler's to write for the call, and no
    // other view of it is live (an aliased operand is read through it only).
    unsafe { TensorViewMut::from_view(view(b, device, Flags::empty())?) }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    thread_local! {
        /// The errors the fake XLA API made on this thread, in order: the
        /// handler runs on its caller's thread, and tests run in parallel.
        static ERRORS: RefCell<Vec<(c_int, String)>> = const { RefCell::new(Vec::new()) };
    }

    extern "C" fn record_error(args: *mut ErrorCreateArgs) -> *mut c_void {
        // SAFETY: the handler passes its filled argument struct and a NUL-terminated message.
        let (code, message) = unsafe { ((*args).errc, std::ffi::CStr::from_ptr((*args).message).to_string_lossy().into_owned()) };
        ERRORS.with_borrow_mut(|errors| errors.push((code, message)));
        std::ptr::dangling_mut::<c_void>()
    }

    fn api() -> Api {
        let none = std::ptr::null::<c_void>();
        Api {
            struct_size: size_of::<Api>(),
            extension_start: std::ptr::null_mut(),
            api_version: ApiVersion { struct_size: API_VERSION_SIZE, extension_start: std::ptr::null_mut(), major: 0, minor: 1 },
            internal_api: none,
            error_create: Some(record_error),
            error_get_message: none,
            error_destroy: none,
            handler_register: none,
            stream_get: None,
            type_register: none,
            execution_context_get: none,
            state_set: none,
            state_get: none,
            device_memory_allocate: none,
            device_memory_free: none,
            thread_pool_schedule: none,
            thread_pool_num_threads: none,
            future_create: none,
            future_set_available: none,
            future_set_error: none,
            run_id_get: none,
            device_ordinal_get: None,
        }
    }

    fn buffer(dtype: c_int, data: &mut [f32], dims: &[i64]) -> Buffer {
        Buffer {
            struct_size: BUFFER_SIZE,
            extension_start: std::ptr::null_mut(),
            dtype,
            data: data.as_mut_ptr().cast(),
            rank: dims.len() as i64,
            dims: dims.as_ptr(),
        }
    }

    fn list(types: &[c_int], items: &[*mut c_void]) -> List {
        List {
            struct_size: LIST_SIZE,
            extension_start: std::ptr::null_mut(),
            size: items.len() as i64,
            types: types.as_ptr(),
            items: items.as_ptr(),
        }
    }

    /// Calls the CPU handler on a frame of `operands`, `results` and a
    /// `dlbridge_kernel` attribute naming `kernel` (none for ""); the error
    /// XLA got, if any.
    fn call(kernel: &str, operands: &mut [Buffer], results: &mut [Buffer], tweak: impl FnOnce(&mut CallFrame)) -> Option<(c_int, String)> {
        // The kernel's digest as dlbridge.jax passes it (a made-up one for a kernel that does not exist).
        let digest = Registry::global().get(kernel).map_or_else(|_| "0".repeat(32), |k| k.digest());
        call_as(kernel, &digest, operands, results, tweak)
    }

    /// [`call`] with the digest attribute `digest`.
    fn call_as(
        kernel: &str,
        digest: &str,
        operands: &mut [Buffer],
        results: &mut [Buffer],
        tweak: impl FnOnce(&mut CallFrame),
    ) -> Option<(c_int, String)> {
        dlbridge_cpu::link();
        let api = api();
        let arg_types = vec![ARG_BUFFER; operands.len()];
        let arg_items: Vec<*mut c_void> = operands.iter_mut().map(|b| (b as *mut Buffer).cast()).collect();
        let ret_types = vec![RET_BUFFER; results.len()];
        let ret_items: Vec<*mut c_void> = results.iter_mut().map(|b| (b as *mut Buffer).cast()).collect();
        let name = ByteSpan { ptr: KERNEL_ATTR.as_ptr().cast(), len: KERNEL_ATTR.len() };
        let value = ByteSpan { ptr: kernel.as_ptr().cast(), len: kernel.len() };
        let digest_name = ByteSpan { ptr: DIGEST_ATTR.as_ptr().cast(), len: DIGEST_ATTR.len() };
        let digest_value = ByteSpan { ptr: digest.as_ptr().cast(), len: digest.len() };
        let types = [ATTR_STRING, ATTR_STRING];
        let names = [&raw const digest_name, &raw const name];
        let values = [(&raw const digest_value).cast::<c_void>(), (&raw const value).cast::<c_void>()];
        let n_attrs = 1 + i64::from(!kernel.is_empty());
        let mut frame = CallFrame {
            struct_size: CALL_FRAME_SIZE,
            extension_start: std::ptr::null_mut(),
            api: &raw const api,
            ctx: std::ptr::null_mut(),
            stage: STAGE_EXECUTE,
            args: list(&arg_types, &arg_items),
            rets: list(&ret_types, &ret_items),
            attrs: Attrs {
                struct_size: ATTRS_SIZE,
                extension_start: std::ptr::null_mut(),
                size: n_attrs,
                types: types.as_ptr(),
                names: names.as_ptr(),
                attrs: values.as_ptr(),
            },
        };
        tweak(&mut frame);
        ERRORS.with_borrow_mut(Vec::clear);
        let e = execute(&raw mut frame, Platform::Cpu);
        let recorded = ERRORS.with_borrow_mut(Vec::pop);
        assert_eq!(e.is_null(), recorded.is_none(), "an error is returned exactly when one was made");
        recorded
    }

    #[test]
    fn the_struct_sizes_are_the_headers() {
        // As `XLA_FFI_STRUCT_SIZE` computes them on a 64-bit target.
        assert_eq!(CALL_FRAME_SIZE, 8 + 8 + 8 + 8 + 8 + 40 + 40 + 48);
        assert_eq!(BUFFER_SIZE, 48);
        assert_eq!(LIST_SIZE, 40);
        assert_eq!(ATTRS_SIZE, 48);
        assert_eq!(API_VERSION_SIZE, 24);
        assert_eq!(METADATA_SIZE, 8 + 24 + 4);
        assert_eq!(ERROR_CREATE_ARGS_SIZE, 28);
        assert_eq!(offset_of!(Api, error_create), 48);
        assert_eq!(offset_of!(Api, stream_get), 48 + 4 * 8);
        assert_eq!(offset_of!(Api, device_ordinal_get), 48 + 17 * 8);
    }

    #[test]
    fn a_call_runs_the_kernel_on_xlas_buffers_in_place() {
        let (mut x, mut y, mut z) = ([1.0f32, 2.0, 3.0], [10.0f32, 20.0, 30.0], [0.0f32; 3]);
        let dims = [3i64];
        let out_ptr = z.as_ptr();
        let mut operands = [buffer(11, &mut x, &dims), buffer(11, &mut y, &dims)];
        let mut results = [buffer(11, &mut z, &dims)];
        assert_eq!(call("add", &mut operands, &mut results, |_| {}), None);
        assert_eq!(z, [11.0, 22.0, 33.0]);
        assert_eq!(results[0].data.cast_const(), out_ptr.cast(), "written where XLA said");
    }

    #[test]
    fn a_mut_parameter_is_written_through_its_aliased_result_and_later_operands_stay_in_place() {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        REGISTERED.call_once(|| {
            let def = dlbridge_registry::KernelDef::cpu("xla_test_accumulate(acc: mut f32[N], y: f32[N])", |call| {
                let (ins, mut outs) = call.io();
                let y = ins.tensor("y")?.to_vec::<f32>()?;
                outs.take("acc")?.iter_mut::<f32>()?.zip(y).for_each(|(a, y)| *a += y);
                Ok(())
            });
            Registry::global().register(def).unwrap();
        });
        // XLA gives the `mut` parameter's result the operand's own buffer (`input_output_aliases`).
        let (mut acc, mut y) = ([1.0f32, 2.0], [10.0f32, 20.0]);
        let dims = [2i64];
        let mut operands = [buffer(11, &mut acc, &dims), buffer(11, &mut y, &dims)];
        let mut results = [Buffer { ..operands[0] }];
        assert_eq!(call("xla_test_accumulate", &mut operands, &mut results, |_| {}), None);
        assert_eq!(acc, [11.0, 22.0], "acc + y, with y the second operand");
        assert_eq!(y, [10.0, 20.0], "the other operand is never written");
        // A hand-built call without the alias: the result is another buffer the kernel would read uninitialised.
        let mut fresh = [f32::NAN; 2];
        let mut operands = [buffer(11, &mut acc, &dims), buffer(11, &mut y, &dims)];
        let mut results = [buffer(11, &mut fresh, &dims)];
        let (_, message) = call("xla_test_accumulate", &mut operands, &mut results, |_| {}).expect("refused");
        assert!(message.contains("`mut` parameter acc: the custom call does not alias its result with the operand"), "{message}");
        assert!(fresh[0].is_nan() && acc == [11.0, 22.0], "nothing written");
    }

    #[test]
    fn a_program_runs_the_kernel_it_was_built_for_or_says_which_it_found() {
        let (mut x, mut y, mut z) = ([1.0f32; 2], [2.0f32; 2], [0.0f32; 2]);
        let dims = [2i64];
        let mut operands = [buffer(11, &mut x, &dims), buffer(11, &mut y, &dims)];
        let mut results = [buffer(11, &mut z, &dims)];
        let add = Registry::global().get("add").unwrap().digest();
        let other = "f".repeat(32);
        let (code, message) = call_as("add", &other, &mut operands, &mut results, |_| {}).expect("a digest mismatch is refused");
        assert_eq!(code, ERR_NOT_FOUND);
        assert!(message.contains(&format!("built for the kernel with digest {other}")) && message.contains(&add), "{message}");
        let (_, message) = call_as("never_defined_here", &other, &mut operands, &mut results, |_| {}).expect("unknown");
        assert!(message.contains("this program calls a kernel this process has not defined; define it"), "{message}");
        // Only the kernel's name (the digest is the first attribute).
        let skip_digest = |f: &mut CallFrame| {
            f.attrs.size = 1;
            f.attrs.types = f.attrs.types.wrapping_add(1);
            f.attrs.names = f.attrs.names.wrapping_add(1);
            f.attrs.attrs = f.attrs.attrs.wrapping_add(1);
        };
        let (_, message) = call_as("add", "", &mut operands, &mut results, skip_digest).expect("no digest");
        assert!(message.contains("has no `dlbridge_kernel_digest` attribute"), "{message}");
        assert_eq!(z, [0.0; 2], "nothing was written by a refused call");
        assert_eq!(call_as("add", &add, &mut operands, &mut results, |_| {}), None);
        assert_eq!(z, [3.0; 2]);
    }

    #[test]
    fn malformed_calls_are_xla_errors_that_say_what_was_wrong() {
        type OnBuffers = fn(&mut [Buffer]);
        type OnFrame = fn(&mut CallFrame);
        let cases: [(&str, &str, OnBuffers, OnFrame); 8] = [
            ("", "no `dlbridge_kernel` attribute", |_| {}, |_| {}),
            ("no_such_kernel", "this process has not defined", |_| {}, |_| {}),
            ("add", "add: argument b: dtype mismatch", |ops| ops[1].dtype = 2, |_| {}), // i8 where T = f32
            ("add", "XLA element type 29 has no dlbridge dtype", |ops| ops[0].dtype = 29, |_| {}),
            ("add", "a malformed XLA buffer", |ops| ops[0].rank = -1, |_| {}),
            ("add", "2 operands and 0 results", |_| {}, |f| f.rets.size = 0),
            ("add", "execution stage 1", |_| {}, |f| f.stage = 1),
            ("add", "call frame has 32 bytes", |_| {}, |f| f.struct_size = 32),
        ];
        let (mut x, mut y, mut z) = ([1.0f32; 4], [2.0f32; 4], [0.0f32; 4]);
        let dims = [4i64];
        for (kernel, want, on_buffers, on_frame) in cases {
            let mut operands = [buffer(11, &mut x, &dims), buffer(11, &mut y, &dims)];
            let mut results = [buffer(11, &mut z, &dims), buffer(11, &mut [0.0f32; 4], &dims)];
            on_buffers(&mut operands);
            let got = call(kernel, &mut operands, &mut results[..1], on_frame);
            let (code, message) = got.unwrap_or_else(|| panic!("{kernel}: expected an error saying {want:?}"));
            assert!(message.contains(want), "{kernel}: {message:?} does not say {want:?}");
            assert_ne!(code, 0);
        }
        assert_eq!(z, [0.0; 4], "nothing was written by a refused call");
    }

    #[test]
    fn the_metadata_query_gets_the_api_version_implemented() {
        let mut metadata = Metadata {
            struct_size: size_of::<Metadata>(),
            api_version: ApiVersion { struct_size: 0, extension_start: std::ptr::null_mut(), major: -1, minor: -1 },
            traits: 7,
            state_type_id: 9,
        };
        let mut ext = MetadataExtension {
            base: ExtensionBase { struct_size: METADATA_EXTENSION_SIZE, kind: EXTENSION_METADATA, next: std::ptr::null_mut() },
            metadata: &raw mut metadata,
        };
        let mut none: [Buffer; 0] = [];
        let got = call("add", &mut none, &mut [], |f| f.extension_start = (&raw mut ext).cast());
        assert_eq!(got, None);
        assert_eq!((metadata.api_version.major, metadata.api_version.minor, metadata.traits, metadata.state_type_id), (0, 1, 0, 0));
        assert_eq!(metadata.api_version.struct_size, API_VERSION_SIZE);
    }
}
