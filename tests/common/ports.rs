//! Ports for child processes without a bind-and-release race. A
//! [`ReservedPort`] is a socket bound (not listening) to a port the kernel
//! picked, with SO_REUSEPORT, held by the test for as long as it lives: no
//! other process can bind that port meanwhile (binding it needs
//! SO_REUSEPORT from the same user, which a stray process does not set), yet
//! nothing is accepted on it, so a client connecting while no child is
//! listening is refused at once, as with a stopped broker. Each start of a
//! child gets a fresh listening socket on the same port
//! ([`ReservedPort::listener`]), handed over by file descriptor with the
//! systemd protocol the broker reads (`LISTEN_FDS`, `LISTEN_FDNAMES`; see
//! src/listen_fds.rs), so the port is the child's before it runs and it
//! never binds anything itself.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use socket2::{Domain, Protocol, Socket, Type};

pub struct ReservedPort {
    _holder: Socket,
    addr: SocketAddr,
}

impl ReservedPort {
    /// A port on 127.0.0.1, reserved until this is dropped.
    pub fn new() -> ReservedPort {
        // SO_REUSEPORT only: with SO_REUSEADDR as well, Linux would let any
        // SO_REUSEADDR socket (every std or tokio listener) bind the port
        // while no one listens on it.
        let holder = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
        holder.set_reuse_port(true).expect("SO_REUSEPORT");
        holder.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).expect("bind 127.0.0.1:0");
        let addr = holder.local_addr().expect("local addr").as_socket().expect("an inet address");
        ReservedPort { _holder: holder, addr }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A listening socket on the reserved port, for one start of a child.
    pub fn listener(&self) -> TcpListener {
        let socket = reusable_socket();
        socket.bind(&self.addr.into()).unwrap_or_else(|e| panic!("bind the reserved {}: {e}", self.addr));
        socket.listen(1024).unwrap_or_else(|e| panic!("listen on the reserved {}: {e}", self.addr));
        socket.into()
    }
}

/// SO_REUSEADDR as well, so connections of an earlier start still in
/// TIME_WAIT do not stop a restart from listening.
fn reusable_socket() -> Socket {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
    socket.set_reuse_address(true).expect("SO_REUSEADDR");
    socket.set_reuse_port(true).expect("SO_REUSEPORT");
    socket
}

const MAX_LISTENERS: usize = 8;

/// Spawns `command` with `listeners` as its inherited sockets, named (in
/// order) for the listeners they serve; the parent's copies are closed once
/// the child has them.
pub fn spawn_with_listeners(command: &mut Command, listeners: Vec<(&str, TcpListener)>) -> std::io::Result<Child> {
    assert!(listeners.len() <= MAX_LISTENERS, "at most {MAX_LISTENERS} inherited sockets");
    let names: Vec<&str> = listeners.iter().map(|(name, _)| *name).collect();
    let fds: Vec<RawFd> = listeners.iter().map(|(_, l)| l.as_raw_fd()).collect();
    command.env("LISTEN_FDS", fds.len().to_string()).env("LISTEN_FDNAMES", names.join(":")).env_remove("LISTEN_PID");
    // SAFETY: only fcntl and dup2 (async-signal-safe) run between fork and
    // exec, on descriptors the parent keeps open until spawn returns.
    unsafe {
        command.pre_exec(move || {
            // First out of the way of 3.., so placing one cannot clobber
            // another (a fixed array: no allocation after fork).
            let mut moved = [0 as RawFd; MAX_LISTENERS];
            for (i, &fd) in fds.iter().enumerate() {
                moved[i] = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 64);
                if moved[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, &fd) in moved[..fds.len()].iter().enumerate() {
                // dup2 clears close-on-exec on the copy: the child inherits it.
                if libc::dup2(fd, 3 + i as RawFd) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = command.spawn();
    drop(listeners);
    child
}
