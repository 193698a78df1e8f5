//! Host memory for copies that overlap device work ([`Staging`]): the host queues a copy and
//! goes on (preparing the next decode step) while the device is still busy with earlier work;
//! it touches the memory again only once the copy is done.
//!
//! On a GPU the memory is page-locked: a copy from pageable memory may make the driver stage
//! it and wait for the stream, and a copy into pageable memory returns only once it is done,
//! which would serialise the host with the device. Where page-locked memory is refused it is
//! pageable all the same, and copies through it wait (correct, only slower). On the emulator
//! it is plain memory, and copies run as they are queued.

use super::profile::{Cost, EventHandle};
use super::{DevPtr, Gpu, Imp};
use crate::error::{CudaError, Result};
use std::sync::Arc;

/// Host memory that device copies read or write in stream order. Reading or writing it
/// first waits for the last copy queued on it.
pub struct Staging {
    gpu: Arc<Gpu>,
    mem: Mem,
    len: usize,
}

enum Mem {
    /// Page-locked memory, and the marker recorded after the last copy queued on it.
    Pinned { ptr: *mut u8, done: EventHandle, pending: Pending },
    Plain(Vec<u8>),
}

/// What the host must wait for before it touches page-locked memory.
#[derive(Clone, Copy, PartialEq)]
enum Pending {
    /// Nothing: no copy in flight.
    Nothing,
    /// The marker recorded after the last copy.
    Marker,
    /// The whole stream: a copy was queued (or may have been) without its marker, after an
    /// error.
    Stream,
}

// SAFETY: the page-locked memory is owned by this value alone, and the event is only used
// through its device (see `EventHandle`).
unsafe impl Send for Staging {}

impl Staging {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes, once the last copy queued on it is done.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.settle()?;
        Ok(match &mut self.mem {
            // SAFETY: `len` bytes we allocated, no copy in flight on them (settled above).
            Mem::Pinned { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, self.len) },
            Mem::Plain(v) => v,
        })
    }

    /// Whether it is page-locked (else copies through it wait for the device).
    fn pinned(&self) -> bool {
        matches!(self.mem, Mem::Pinned { .. })
    }

    /// Waits for the last copy queued on it.
    fn settle(&mut self) -> Result<()> {
        if let (Imp::Cuda(c), Mem::Pinned { done, pending, .. }) = (&self.gpu.imp, &mut self.mem) {
            if *pending != Pending::Nothing {
                let _op = self.gpu.enter(Some("waiting for a copy"))?;
                match pending {
                    Pending::Marker => c.wait_for(done)?,
                    _ => c.sync()?,
                }
                *pending = Pending::Nothing;
            }
        }
        Ok(())
    }

    /// The host address of its first byte, for a copy of `len` bytes about to be queued (in
    /// stream order after any copy already queued on it, so no wait). From here until
    /// [`Staging::mark`] succeeds, an access waits for the whole stream.
    fn queued(&mut self, len: usize) -> Result<*mut u8> {
        if len > self.len {
            return Err(CudaError::Request(format!("a copy of {len} bytes through {} bytes of staging memory", self.len)));
        }
        Ok(match &mut self.mem {
            Mem::Pinned { ptr, pending, .. } => {
                *pending = Pending::Stream;
                *ptr
            }
            Mem::Plain(v) => v.as_mut_ptr(),
        })
    }

    /// Records, after the copy just queued, the point the host must wait for.
    fn mark(&mut self) -> Result<()> {
        if let (Imp::Cuda(c), Mem::Pinned { done, pending, .. }) = (&self.gpu.imp, &mut self.mem) {
            c.mark(done)?;
            *pending = Pending::Marker;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // On the thread recording a graph, waiting for its copies would end the capture: the
        // memory moves into the recording and is freed (by this code) once it ends.
        let gpu = Arc::clone(&self.gpu);
        if gpu.defer_while_recording(|| Staging { gpu: Arc::clone(&self.gpu), mem: std::mem::replace(&mut self.mem, Mem::Plain(Vec::new())), len: self.len }) {
            return;
        }
        if let (Imp::Cuda(c), Mem::Pinned { ptr, done, pending }) = (&self.gpu.imp, &mut self.mem) {
            // Not while another thread records a graph: waiting for the stream would end its
            // capture (a poisoned gate still lets the memory go).
            let _op = self.gpu.enter(None);
            // Freeing memory a copy still uses would let the device read or write freed
            // memory: wait first (a failed stream lets the memory go: its copies are dead).
            let waited = match pending {
                Pending::Nothing => Ok(()),
                Pending::Marker => c.wait_for(done),
                Pending::Stream => c.sync(),
            };
            if let Err(e) = waited {
                tracing::warn!("waiting for a copy before freeing its host memory: {e}");
            }
            c.destroy_event(EventHandle(done.0));
            c.host_free(*ptr);
        }
    }
}

impl Gpu {
    /// `len` bytes of zeroed staging memory for [`Gpu::upload_staged`] and
    /// [`Gpu::download_staged`].
    pub fn staging(self: &Arc<Self>, len: usize) -> Result<Staging> {
        let _op = self.enter(Some("allocating host memory"))?;
        let mem = match &self.imp {
            Imp::Cuda(c) => {
                let done = c.marker()?;
                match c.host_alloc(len.max(1)) {
                    Ok(ptr) => {
                        // SAFETY: just allocated, `len` bytes (at least one), no copy on them yet.
                        unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
                        Mem::Pinned { ptr, done, pending: Pending::Nothing }
                    }
                    // Where page-locked memory is refused (a sandbox, a locked-memory limit),
                    // pageable memory still works: a copy into it returns once done and one
                    // from it once staged, so the host waits for each copy instead of
                    // overlapping it.
                    Err(e) => {
                        c.destroy_event(done);
                        static WARNED: std::sync::Once = std::sync::Once::new();
                        WARNED.call_once(|| tracing::warn!("page-locked host memory refused ({e}): copies use pageable memory and wait for the device"));
                        Mem::Plain(vec![0; len])
                    }
                }
            }
            Imp::Emu(_) => Mem::Plain(vec![0; len]),
        };
        Ok(Staging { gpu: Arc::clone(self), mem, len })
    }

    /// Queues a copy of `src`'s first `len` bytes to `dst` and returns without waiting; `src`
    /// is next readable or writable once the copy is done.
    pub fn upload_staged(&self, dst: DevPtr, src: &mut Staging, len: usize) -> Result<()> {
        let _op = self.enter(Some("copying host data to the device"))?;
        let (host, pinned) = (src.queued(len)?, src.pinned());
        self.profiled(|| "copy host → device".into(), Cost { flops: 0.0, bytes: len as f64 }, || match &self.imp {
            Imp::Cuda(c) if pinned => c.upload_pinned(dst, host, len),
            // SAFETY: as in the emulator's case below; pageable memory is staged before the call returns.
            Imp::Cuda(c) => c.upload(dst, unsafe { std::slice::from_raw_parts(host, len) }),
            // SAFETY: `len` bytes of the staging memory (checked in `queued`).
            Imp::Emu(e) => e.upload(dst, unsafe { std::slice::from_raw_parts(host, len) }),
        })?;
        src.mark()
    }

    /// Queues a copy of `len` bytes at `src` into `dst`'s first bytes and returns without
    /// waiting: [`Staging::bytes_mut`] then waits for it.
    pub fn download_staged(&self, src: DevPtr, dst: &mut Staging, len: usize) -> Result<()> {
        let _op = self.enter(Some("copying device data to the host"))?;
        let (host, pinned) = (dst.queued(len)?, dst.pinned());
        self.profiled(|| "copy device → host".into(), Cost { flops: 0.0, bytes: len as f64 }, || match &self.imp {
            Imp::Cuda(c) if pinned => c.download_pinned(host, src, len),
            // SAFETY: as in the emulator's case below; the copy is waited for.
            Imp::Cuda(c) => c.download(src, unsafe { std::slice::from_raw_parts_mut(host, len) }),
            // SAFETY: as in `upload_staged`.
            Imp::Emu(e) => e.download(src, unsafe { std::slice::from_raw_parts_mut(host, len) }),
        })?;
        dst.mark()
    }
}
