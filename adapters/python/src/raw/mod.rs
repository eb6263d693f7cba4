//! The raw CPython and DLPack-exchange code the binding reads foreign objects
//! with: the DLPack C exchange API of other frameworks, the buffer protocol,
//! NumPy's array struct, capsules. Nothing here knows the binding's own
//! classes (their raw entry points, `vectorcall` and `array_exchange`, sit
//! beside them). Each module opens with the invariants it keeps.

pub(crate) mod buffer;
pub(crate) mod capsule;
pub(crate) mod exchange;
pub(crate) mod inspect;
pub(crate) mod ndarray;
