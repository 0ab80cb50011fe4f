//! The few things the TCP transport asks of the kernel beyond read and
//! write: socket options, the send queue's length (`TIOCOUTQ`), the
//! acknowledgement state (`TCP_INFO`), and `poll(2)`. Every `unsafe` block
//! of the transport is here.

use super::multipath::PeerAcks;
use crate::error::ErrorKind;
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Unsent bytes a socket may hold before it stops taking more
/// (`TCP_NOTSENT_LOWAT`): what a stream keeps ready beyond what its
/// congestion window has in flight. Bounds how long a slow path holds the
/// last chunks of a message, and keeps the queue lengths the scheduler
/// reads close to what the kernel really still has to send.
pub(super) const NOTSENT_LOWAT: usize = 128 * 1024;
/// Longest wait between retransmissions on a stream of a link with several
/// paths (`TCP_RTO_MAX_MS`, Linux 6.15+; the kernel's default is 120 s).
pub(super) const RTO_MAX: Duration = Duration::from_secs(1);
/// `TCP_RTO_MAX_MS` from `linux/tcp.h` (not in the libc crate yet).
const TCP_RTO_MAX_MS: libc::c_int = 44;
/// How long a stream of a link with several paths may go without an
/// acknowledgement before the kernel drops the connection
/// (`TCP_USER_TIMEOUT`): a cut path stays a connection that can come back.
pub(super) const OUTAGE_MAX: Duration = Duration::from_secs(600);

/// Sets `TCP_NOTSENT_LOWAT` on a socket (see [`NOTSENT_LOWAT`]).
pub(super) fn set_notsent_lowat(s: &TcpStream, bytes: usize) -> io::Result<()> {
    set_tcp_option(s, libc::TCP_NOTSENT_LOWAT, bytes as libc::c_int)
}

/// Tunes a stream of a link with several paths (best effort: older kernels
/// lack the options): the kernel retries at least every [`RTO_MAX`], so a
/// path that comes back is found within about that long, and keeps a
/// connection whose path is cut for up to [`OUTAGE_MAX`] instead of the 15
/// retries (~15 min by default, but ~13 s with the shorter retry interval)
/// after which it would give up.
pub(super) fn keep_through_outages(s: &TcpStream) {
    let _ = set_tcp_option(s, TCP_RTO_MAX_MS, RTO_MAX.as_millis() as libc::c_int);
    let _ = set_tcp_option(
        s,
        libc::TCP_USER_TIMEOUT,
        OUTAGE_MAX.as_millis() as libc::c_int,
    );
}

/// Sets an `IPPROTO_TCP` option whose value is an int.
fn set_tcp_option(s: &TcpStream, option: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open; the
    // option value is a valid c_int whose size is passed with it.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            option,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes the kernel still holds for a socket: not yet sent, or sent and not
/// yet acknowledged by the peer (`TIOCOUTQ`); 0 when it cannot say.
pub(super) fn queued_bytes(s: &TcpStream) -> u64 {
    let mut v: libc::c_int = 0;
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open;
    // TIOCOUTQ writes one c_int to the valid, exclusively borrowed `v`.
    let rc = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut v as *mut libc::c_int) };
    if rc == 0 {
        v.max(0) as u64
    } else {
        0
    }
}

/// What the kernel knows of the peer's acknowledgements on this socket
/// (from `TCP_INFO`); `None` when it cannot say.
pub(super) fn peer_acks(s: &TcpStream) -> Option<PeerAcks> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: FFI call on a socket descriptor `s` owns and keeps open;
    // `info` and `len` are valid and exclusively borrowed, and `len` says
    // how many bytes the kernel may write into `info`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(PeerAcks {
        unacked: info.tcpi_unacked,
        probes: info.tcpi_probes,
        last_ack_recv_ms: info.tcpi_last_ack_recv,
    })
}

/// The error an I/O failure on a link to `peer` means.
pub(super) fn io_error(peer: usize, e: io::Error) -> ErrorKind {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionAborted => ErrorKind::PeerClosed {
            peer,
            detail: e.to_string(),
        },
        _ => ErrorKind::Io {
            peer,
            detail: e.to_string(),
        },
    }
}

/// Writes `bytes` whole if the socket takes them without blocking; `false`
/// when it took only part (or failed).
pub(super) fn write_all_now(sock: &mut TcpStream, bytes: &[u8]) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        match sock.write(&bytes[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Waits until one of `fds` is ready for `events` or `timeout` passes.
pub fn poll_fds(fds: &mut [libc::pollfd], timeout: Duration) {
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return;
    }
    let ms = timeout.as_millis().clamp(0, i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid, exclusively borrowed slice of pollfd structs and
    // its length is passed alongside; poll only writes their `revents` fields.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}
