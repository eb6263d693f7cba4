//! [`Call`]: the context a kernel implementation runs in, and its [`Inputs`]
//! and [`Outputs`] by parameter name.

use std::ffi::c_void;
use std::fmt;

use dlbridge_core::{DType, Error, Result, TensorViewMut};

use crate::arg::Arg;
use crate::signature::{MAX_PARAMS, Scalar, Signature};
use crate::solution::Solution;

/// The context a kernel implementation runs in: its checked arguments,
/// outputs, bound dtypes and stream.
pub struct Call<'c, 'a> {
    pub(crate) args: &'c mut [Arg<'a>],
    pub(crate) outs: &'c mut [TensorViewMut<'a>],
    pub(crate) solution: &'c Solution,
    pub(crate) stream: *mut c_void,
    pub(crate) kernel: &'c str,
    pub(crate) sig: &'c Signature,
}

impl fmt::Debug for Call<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call").field("kernel", &self.kernel).field("args", &self.args.len()).field("outs", &self.outs.len()).finish()
    }
}

impl<'c, 'a> Call<'c, 'a> {
    /// The arguments and outputs by parameter name: `ins` reads tensors and
    /// scalars, `outs` hands out each written tensor (an output or a `mut`
    /// parameter) once, for as long as the call:
    /// ```text
    /// let (ins, mut outs) = call.io();
    /// let (x, alpha) = (ins.tensor("x")?, ins.f64("alpha")?);
    /// let y = outs.take("y")?;
    /// ```
    /// A name the signature does not have is a registration bug (an error, never a panic).
    #[inline]
    pub fn io(&mut self) -> (Inputs<'_, 'a>, Outputs<'_, 'a>) {
        // Flat arrays indexed like the signature (parameters, then outputs):
        // the parser allows at most MAX_PARAMS of them together.
        let mut reads: [Option<&Arg<'a>>; MAX_PARAMS] = [None; MAX_PARAMS];
        let mut writes: [Option<&mut TensorViewMut<'a>>; MAX_PARAMS] = Default::default();
        let n = self.sig.params.len();
        for ((p, a), (r, w)) in self.sig.params.iter().zip(self.args.iter_mut()).zip(reads.iter_mut().zip(writes.iter_mut())) {
            let written = p.tensor().is_some_and(|t| t.mutable) && matches!(a, Arg::TensorMut(_));
            if !written {
                *r = Some(&*a);
            } else if let Arg::TensorMut(v) = a {
                *w = Some(v);
            }
        }
        for (w, o) in writes.iter_mut().skip(n).zip(self.outs.iter_mut()) {
            *w = Some(o);
        }
        (Inputs { sig: self.sig, reads }, Outputs { sig: self.sig, writes })
    }

    /// Arguments (signature order) and outputs, for destructuring by position
    /// (prefer [`Call::io`], which reaches parameters by name).
    pub fn split(&mut self) -> (&mut [Arg<'a>], &mut [TensorViewMut<'a>]) {
        (self.args, self.outs)
    }
    /// The arguments.
    pub fn args(&self) -> &[Arg<'a>] {
        self.args
    }
    /// The dtype type variable `i` was bound to.
    pub fn dtype(&self, i: usize) -> Option<DType> {
        self.solution.dtype(i)
    }
    /// The stream handle the caller wants the kernel on (NULL on CPU).
    pub fn stream(&self) -> *mut c_void {
        self.stream
    }
    /// Runs `f` with [`Call::stream`] replaced by `stream`, restored after:
    /// an implementation that wraps another hands it a context of its own
    /// (a kernel compiled at run time gets its CPU thread budget so).
    pub fn with_stream<R>(&mut self, stream: *mut c_void, f: impl FnOnce(&mut Self) -> R) -> R {
        let previous = std::mem::replace(&mut self.stream, stream);
        let r = f(self);
        self.stream = previous;
        r
    }
    /// The kernel's name (borrowed from the kernel, not from the call, so it
    /// can be taken before [`Call::split`]).
    pub fn kernel_name(&self) -> &'c str {
        self.kernel
    }
    /// The error a kernel returns when its arguments do not have the shape its
    /// signature promised (a registration bug, never the caller's fault).
    pub fn layout_bug(&self) -> Error {
        layout_bug(self.kernel)
    }
}

/// The read side of [`Call::io`]: tensors and scalars by parameter name.
#[derive(Debug)]
pub struct Inputs<'c, 'a> {
    sig: &'c Signature,
    reads: [Option<&'c Arg<'a>>; MAX_PARAMS],
}

/// `a == b` for parameter names, inline (names are a few bytes: a `memcmp`
/// call costs more than the loop).
#[inline(always)]
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

impl<'c, 'a> Inputs<'c, 'a> {
    #[inline]
    fn get(&self, name: &str) -> Result<&'c Arg<'a>> {
        let Some(i) = self.sig.params.iter().position(|p| same_name(&p.name, name)) else {
            return Err(misuse(self.sig, name, Misuse::NoParam));
        };
        match self.reads.get(i).copied().flatten() {
            Some(a) => Ok(a),
            None => Err(misuse(self.sig, name, Misuse::Written)),
        }
    }
    /// The tensor parameter `name`, read-only.
    #[inline]
    pub fn tensor(&self, name: &str) -> Result<&'c dlbridge_core::TensorView<'c>> {
        match self.get(name)? {
            Arg::Tensor(v) => Ok(v),
            Arg::TensorMut(v) => Ok(v.as_view()),
            _ => Err(layout_bug(&self.sig.name)),
        }
    }
    /// The scalar parameter `name`.
    #[inline]
    pub fn scalar(&self, name: &str) -> Result<Scalar> {
        match self.get(name)? {
            Arg::Scalar(s) => Ok(*s),
            _ => Err(layout_bug(&self.sig.name)),
        }
    }
    /// The `f64` scalar parameter `name`.
    #[inline]
    pub fn f64(&self, name: &str) -> Result<f64> {
        if let Scalar::F64(x) = self.scalar(name)? { Ok(x) } else { Err(layout_bug(&self.sig.name)) }
    }
    /// The `i64` scalar parameter `name`.
    #[inline]
    pub fn i64(&self, name: &str) -> Result<i64> {
        if let Scalar::I64(x) = self.scalar(name)? { Ok(x) } else { Err(layout_bug(&self.sig.name)) }
    }
    /// The `bool` scalar parameter `name`.
    #[inline]
    pub fn bool(&self, name: &str) -> Result<bool> {
        if let Scalar::Bool(x) = self.scalar(name)? { Ok(x) } else { Err(layout_bug(&self.sig.name)) }
    }
}

/// The write side of [`Call::io`]: outputs and `mut` parameters by name, each taken once.
#[derive(Debug)]
pub struct Outputs<'c, 'a> {
    sig: &'c Signature,
    writes: [Option<&'c mut TensorViewMut<'a>>; MAX_PARAMS],
}

impl<'c, 'a> Outputs<'c, 'a> {
    /// The output or `mut` parameter `name`, writable for the rest of the call.
    #[inline]
    pub fn take(&mut self, name: &str) -> Result<&'c mut TensorViewMut<'a>> {
        let n = self.sig.params.len();
        let i = match self.sig.params.iter().position(|p| same_name(&p.name, name)) {
            Some(i) => i,
            None => match self.sig.outputs.iter().position(|p| same_name(&p.name, name)) {
                Some(j) => n + j,
                None => return Err(misuse(self.sig, name, Misuse::NoParam)),
            },
        };
        match self.writes.get_mut(i).and_then(Option::take) {
            Some(v) => Ok(v),
            None => Err(misuse(self.sig, name, Misuse::TakenTwice)),
        }
    }
}

/// A kernel implementation asking [`Inputs`] or [`Outputs`] for what its
/// signature does not give it that way.
#[derive(Clone, Copy)]
enum Misuse {
    Written,
    TakenTwice,
    NoParam,
}

#[cold]
#[inline(never)]
fn misuse(sig: &Signature, name: &str, m: Misuse) -> Error {
    let what = match m {
        Misuse::Written => format!("parameter `{name}` is written (`mut`): take it from the outputs side of io()"),
        Misuse::TakenTwice => format!("`{name}` is not a written tensor, or was taken twice (a bug in the kernel)"),
        Misuse::NoParam => format!("the signature has no parameter `{name}` (a bug in the kernel registration)"),
    };
    Error::Runtime(format!("{}: {what}", sig.name))
}

/// [`Call::layout_bug`] for a kernel name taken before `split` (builds the
/// error only when needed: the hot path must not allocate).
#[cold]
#[inline(never)]
pub fn layout_bug(kernel: &str) -> Error {
    Error::Runtime(format!("{kernel}: implementation does not match its signature (a bug in the kernel registration)"))
}
