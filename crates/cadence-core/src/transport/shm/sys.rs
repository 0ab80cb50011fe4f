//! The edge of the shared-memory transport: the mapped inbox file, which
//! other processes write at the same time, and the system calls (reserving
//! the file's pages, futex sleep and wake, reading and writing another
//! process's memory, Yama's ptrace exception, whether a process lives).
//! Every `unsafe` of the transport is here, each with its `// SAFETY:`
//! note; the rest of the module works through these safe wrappers.

use crate::copy::copy_bytes;
use memmap2::MmapRaw;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// A mapped inbox file.
pub struct Region {
    map: MmapRaw,
    path: PathBuf,
    owner: bool,
    unlinked: AtomicU32,
}

impl Region {
    /// Maps `file` (at `path`). No page is touched: a ring's pages come
    /// when it is first used ([`Region::populate`]), so a host's shared
    /// memory grows with the pairs that talk, not with every pair. The
    /// `owner` (the rank that created the file) unlinks it.
    pub(super) fn map(file: &File, path: &Path, owner: bool) -> std::io::Result<Region> {
        let map = memmap2::MmapOptions::new().map_raw(file)?;
        Ok(Region {
            map,
            path: path.to_owned(),
            owner,
            unlinked: AtomicU32::new(u32::from(!owner)),
        })
    }

    /// The mapping's length in bytes.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Where this process mapped the file.
    pub(super) fn address(&self) -> u64 {
        self.map.as_ptr() as u64
    }

    fn ptr(&self, off: usize) -> *mut u8 {
        assert!(off < self.map.len());
        // SAFETY: `off` is within the mapping (checked above).
        unsafe { self.map.as_mut_ptr().add(off) }
    }

    pub(super) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.map.len());
        // SAFETY: the mapping is page-aligned and lives as long as `self`; the
        // offset is 8-aligned and in bounds (checked). Every process touches
        // this word only through atomics.
        unsafe { &*(self.ptr(off) as *const AtomicU64) }
    }

    pub(super) fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.map.len());
        // SAFETY: as in `atomic_u64`, for a 4-aligned word.
        unsafe { &*(self.ptr(off) as *const AtomicU32) }
    }

    /// Copies `src` into the mapping at `off`.
    pub(super) fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.map.len());
        // SAFETY: in bounds (checked); the ring protocol gives the writer
        // exclusive use of these bytes until it publishes them, so no other
        // reference to them exists while this one lives.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr(off), src.len()) };
        copy_bytes(dst, src);
    }

    /// Views `len` bytes at `off`.
    pub(super) fn read(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.map.len());
        // SAFETY: in bounds (checked); the ring protocol guarantees the writer
        // does not touch these bytes until the reader releases them, which it
        // does only after this borrow ends (callers drop it before `tail` moves).
        unsafe { std::slice::from_raw_parts(self.ptr(off), len) }
    }

    /// Allocates the file's pages under `[off, off + len)` and fills in
    /// this mapping's page tables for them (`MADV_POPULATE_WRITE`), so that
    /// no message takes a page fault on this side, and a full shared-memory
    /// file system shows here as an error, not as SIGBUS in the middle of a
    /// collective. Where the kernel lacks it (before 5.14) the inbox was
    /// reserved whole at creation ([`populate_supported`]) and touching the
    /// pages maps them.
    pub(super) fn populate(&self, off: usize, len: usize) -> std::io::Result<()> {
        let page = page_size();
        let start = off - off % page;
        let end = (off + len).next_multiple_of(page).min(self.map.len());
        if end <= start {
            return Ok(());
        }
        // SAFETY: `[start, end)` is page-aligned and inside the mapping;
        // MADV_POPULATE_WRITE only faults pages in (as a write would,
        // without changing a byte), so it cannot disturb what peers write.
        let rc = unsafe {
            libc::madvise(
                self.map.as_mut_ptr().add(start).cast(),
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINVAL) {
            return Err(e);
        }
        for at in (start..end).step_by(page) {
            // Adding nothing writes nothing a peer could see changed.
            self.atomic_u32(at).fetch_add(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Removes the file name (the mapping stays valid).
    pub fn unlink(&self) {
        if self.owner && self.unlinked.swap(1, Ordering::AcqRel) == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unlink();
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(4096)
}

/// Whether this kernel fills in page tables on request
/// (`MADV_POPULATE_WRITE`, Linux 5.14), so that rings can get their pages
/// on first use; without it an inbox is reserved whole when created.
pub(super) fn populate_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        let Ok(probe) = memmap2::MmapMut::map_anon(page_size()) else {
            return false;
        };
        // SAFETY: the anonymous mapping is ours, page-aligned, one page long,
        // and lives until the end of this closure.
        let rc = unsafe {
            libc::madvise(
                probe.as_ptr() as *mut libc::c_void,
                probe.len(),
                libc::MADV_POPULATE_WRITE,
            )
        };
        rc == 0
    })
}

/// Allocates the inbox's pages now. Left to the first write, each page of a
/// ring costs a page fault on its first pass, for the sender that writes it
/// and for the receiver that reads it: with small messages a fault every
/// few calls, several times a message's cost (and a full shared-memory file
/// system shows here, as an error, not as SIGBUS in the middle of a
/// collective).
pub(super) fn reserve(file: &File, size: usize) -> std::io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on an open descriptor; no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
    match rc {
        0 => Ok(()),
        // File systems without fallocate: the pages come on first touch.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// True when the wait ended by its timeout (not by a wake-up, a changed
/// value or a signal).
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 in a shared mapping that outlives
    // the call; FUTEX_WAIT (shared, not PRIVATE, since other processes wake
    // it) only reads it and sleeps while it equals `expected`, up to `ts`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE wakes at most one sleeper on the
    // word (only its owner ever sleeps there) and touches no memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// Copies `dst.len()` bytes from address `addr` of process `pid` into `dst`
/// (`process_vm_readv(2)`, looping over partial reads).
pub(super) fn cma_read(pid: u32, addr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let len = dst.len();
    cma_loop(len, "the peer's buffer ended early", |done| {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` describes `dst[done..]`, memory we own and may
        // write, for exactly its length; the kernel writes nothing else in
        // this process. `remote` is only read, in the other process, and the
        // kernel checks it there (EFAULT when it is not mapped).
        unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) }
    })
}

/// Writes `src` into process `pid`'s memory at `addr`
/// (`process_vm_writev(2)`, looping over partial writes): a sender helping
/// its receiver's single-copy read. The receiver offered that range of its
/// destination for this message and does not give it back to its caller
/// until every chunk it let us claim is written (`CTL_HELP_DONE`).
pub(super) fn cma_write(pid: u32, addr: u64, src: &[u8]) -> std::io::Result<()> {
    let len = src.len();
    cma_loop(len, "the receiver's range ended early", |done| {
        let local = libc::iovec {
            iov_base: src[done..].as_ptr().cast_mut().cast(),
            iov_len: len - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: `local` describes `src[done..]`, memory we own, which the
        // kernel only reads. `remote` is written in the other process only,
        // within the range it offered us (see above); the kernel checks it
        // there (EFAULT when it is not mapped).
        unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) }
    })
}

/// Calls `one(done)` (one `process_vm_readv`/`writev` of the bytes from
/// `done` on, returning its result) until `len` bytes have moved: the
/// kernel may move fewer than asked.
fn cma_loop(
    len: usize,
    short: &str,
    mut one: impl FnMut(usize) -> libc::ssize_t,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let n = one(done);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                short,
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Lets same-user peers read this process's memory (single copy) where the
/// Yama security module restricts it to ancestors (`ptrace_scope` 1, the
/// default on Ubuntu), as Open MPI does; scopes 2 and 3 stay closed and the
/// rings carry everything. Nothing to do without Yama.
pub(super) fn allow_peer_reads() {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope");
    if scope.is_ok_and(|s| s.trim() == "1") {
        // SAFETY: prctl with PR_SET_PTRACER only changes this process's
        // Yama exception list; it touches no memory of ours.
        unsafe {
            libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0);
        }
    }
}

/// `kill(pid, 0)` says whether a process exists; a zombie (exited, not yet
/// reaped by its parent) still exists, so /proc tells those apart.
/// A peer in this very process (ranks as threads) is alive while we ask.
pub fn pid_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // Format: "pid (comm) S ..."; comm may contain spaces or ')'.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X'))
        }
        Err(_) => rc == 0,
    }
}
