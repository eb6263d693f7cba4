//! DLPack's stream argument, as the array API standard defines it for
//! `__dlpack__(stream=...)`, and what a producer does about it.
//!
//! For a CUDA array: `None` means the legacy default stream, `1` the legacy
//! default stream, `2` the per-thread default stream, `-1` "do not
//! synchronise", any other positive integer a `cudaStream_t`; `0` is refused
//! (it could mean `None`, `1` or `2`). For a CPU array only `None` (or `-1`)
//! makes sense. The legacy and per-thread default streams' handles are the
//! same numbers, 1 and 2 (`CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`).
//!
//! The producer orders its pending work on the array before the consumer's
//! stream with an event (record on its own stream, `cuStreamWaitEvent` on the
//! consumer's), never a device-wide synchronisation; nothing is needed when
//! both are the same stream or the consumer asked for none.

use dlbridge_core::{DeviceType, Error, Result};

/// `CU_STREAM_LEGACY`.
pub const LEGACY: u64 = 1;
/// `CU_STREAM_PER_THREAD`.
pub const PER_THREAD: u64 = 2;

/// What the consumer asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerStream {
    /// Do not synchronise (`stream=-1`).
    NoSync,
    /// Make the array's pending work complete before work queued on this stream.
    Stream(u64),
}

/// Reads a `__dlpack__(stream=...)` argument for an array on `device`.
pub fn consumer_stream(device: DeviceType, stream: Option<i64>) -> Result<ConsumerStream> {
    match device {
        DeviceType::CUDA | DeviceType::CUDA_MANAGED => match stream {
            None => Ok(ConsumerStream::Stream(LEGACY)),
            Some(-1) => Ok(ConsumerStream::NoSync),
            Some(0) => Err(Error::InvalidArgument(
                "stream=0 is not allowed for a CUDA array: it could mean None, 1 or 2; pass 1 (legacy default stream), 2 (per-thread default stream) or the stream's handle".into(),
            )),
            Some(s) if s > 0 => Ok(ConsumerStream::Stream(s as u64)),
            Some(s) => Err(Error::InvalidArgument(format!("stream={s}: a CUDA stream is None, -1, 1, 2 or a stream handle (a positive integer)"))),
        },
        DeviceType::CPU | DeviceType::CUDA_HOST => match stream {
            None | Some(-1) => Ok(ConsumerStream::NoSync),
            Some(s) => Err(Error::Buffer(format!("stream={s}: an array in {device} memory takes stream=None"))),
        },
        other => Err(Error::Buffer(format!("stream: dlbridge does not order work on {other} devices"))),
    }
}

/// What the producer does before handing out the capsule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPlan {
    /// Nothing: same stream, or no synchronisation asked for.
    Nothing,
    /// Record an event on `producer`, make `consumer` wait for it.
    WaitEvent {
        /// The stream the array's pending work is on.
        producer: u64,
        /// The stream that must wait for it.
        consumer: u64,
    },
}

/// The synchronisation for an array whose work is on `producer`.
pub fn plan(producer: u64, consumer: ConsumerStream) -> SyncPlan {
    match consumer {
        ConsumerStream::NoSync => SyncPlan::Nothing,
        ConsumerStream::Stream(c) if c == producer => SyncPlan::Nothing,
        ConsumerStream::Stream(c) => SyncPlan::WaitEvent { producer, consumer: c },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_stream_arguments_mean_what_the_standard_says() {
        let cuda = DeviceType::CUDA;
        assert_eq!(consumer_stream(cuda, None).unwrap(), ConsumerStream::Stream(LEGACY));
        assert_eq!(consumer_stream(cuda, Some(1)).unwrap(), ConsumerStream::Stream(LEGACY));
        assert_eq!(consumer_stream(cuda, Some(2)).unwrap(), ConsumerStream::Stream(PER_THREAD));
        assert_eq!(consumer_stream(cuda, Some(-1)).unwrap(), ConsumerStream::NoSync);
        assert_eq!(consumer_stream(cuda, Some(0x7f00_dead_0000)).unwrap(), ConsumerStream::Stream(0x7f00_dead_0000));
        let zero = consumer_stream(cuda, Some(0)).unwrap_err().to_string();
        assert!(zero.contains("stream=0") && zero.contains("could mean"), "{zero}");
        assert!(consumer_stream(cuda, Some(-2)).unwrap_err().to_string().contains("stream=-2"));
    }

    #[test]
    fn cpu_arrays_take_no_stream() {
        assert_eq!(consumer_stream(DeviceType::CPU, None).unwrap(), ConsumerStream::NoSync);
        assert_eq!(consumer_stream(DeviceType::CPU, Some(-1)).unwrap(), ConsumerStream::NoSync);
        let e = consumer_stream(DeviceType::CPU, Some(1)).unwrap_err();
        assert_eq!(e.kind(), dlbridge_core::ErrorKind::Buffer);
        assert!(e.to_string().contains("stream=1"), "{e}");
        assert!(consumer_stream(DeviceType::ROCM, None).is_err());
    }

    #[test]
    fn producers_wait_with_an_event_only_across_streams() {
        assert_eq!(plan(5, ConsumerStream::Stream(5)), SyncPlan::Nothing);
        assert_eq!(plan(5, ConsumerStream::NoSync), SyncPlan::Nothing);
        assert_eq!(plan(5, ConsumerStream::Stream(LEGACY)), SyncPlan::WaitEvent { producer: 5, consumer: LEGACY });
        assert_eq!(plan(LEGACY, ConsumerStream::Stream(PER_THREAD)), SyncPlan::WaitEvent { producer: LEGACY, consumer: PER_THREAD });
    }
}
