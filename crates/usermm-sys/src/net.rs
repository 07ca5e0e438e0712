//! Unix-socket helpers the fork link needs beyond std (swap/inherit.rs, mm/fork.rs): passing a
//! descriptor with SCM_RIGHTS (std's ancillary-data API is not stable), polling two
//! descriptors, and punching a hole in a file. Mirrors nothing in Linux's mm; the calls are
//! `sendmsg(2)`/`recvmsg(2)` with `cmsg(3)`, `poll(2)` and `fallocate(2)`.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Space for one descriptor's control message.
const CMSG_SPACE: usize = 64;

/// Sends `data` with descriptor `fd` attached (SCM_RIGHTS), all of it.
pub fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<()> {
    let mut cbuf = [0u8; CMSG_SPACE];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: a zeroed msghdr is valid; every pointer set below points at a live local buffer
    // of the length given, and the control message is built inside `cbuf` with the CMSG
    // macros, which stay within `msg_controllen`.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let sent = sent as usize;
    if sent < data.len() {
        // The descriptor went with the first byte; the rest is plain data.
        send_all(sock, &data[sent..])?;
    }
    Ok(())
}

fn send_all(sock: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: send from a live slice of the length given.
        let r = unsafe {
            libc::send(
                sock,
                data.as_ptr() as *const libc::c_void,
                data.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        data = &data[r as usize..];
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes, and the descriptor the sender attached to them if any
/// (SCM_RIGHTS; close-on-exec). EOF before the end is `UnexpectedEof`.
pub fn recv_exact_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    let mut got = 0;
    let mut fd = None;
    while got < buf.len() {
        let mut cbuf = [0u8; CMSG_SPACE];
        let mut iov = libc::iovec {
            iov_base: buf[got..].as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len() - got,
        };
        // SAFETY: as in `send_with_fd`: the msghdr points at live local buffers of the lengths
        // given; a received descriptor is read from inside `cbuf` with the CMSG macros and
        // owned from then on.
        let r = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = cbuf.len();
            let r = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if r >= 0 {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const RawFd);
                        fd = Some(OwnedFd::from_raw_fd(raw));
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            r
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got += r as usize;
    }
    Ok(fd)
}

/// Waits up to `timeout_ms` (-1: no limit) for `a` or `b` to be readable (or hung up);
/// returns which.
pub fn poll2(a: RawFd, b: RawFd, timeout_ms: i32) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: poll on two pollfd structs of ours.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let ready =
            |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
        return Ok((ready(&fds[0]), ready(&fds[1])));
    }
}

/// Frees the blocks of `[off, off+len)` of the file `fd` (FALLOC_FL_PUNCH_HOLE), keeping its
/// size; best effort (a filesystem without holes keeps the blocks).
pub fn punch_hole(fd: RawFd, off: u64, len: u64) {
    // SAFETY: fallocate on a descriptor the caller owns; no memory is passed.
    unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as libc::off_t,
            len as libc::off_t,
        );
    }
}
