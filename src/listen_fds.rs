//! Listening sockets handed over by the parent process, systemd's socket
//! activation protocol (`sd_listen_fds(3)`): `LISTEN_FDS=n` sockets start at
//! file descriptor 3, `LISTEN_FDNAMES` names them (colon-separated) and
//! `LISTEN_PID`, when set, is the process they are for. A name is a listener
//! name of `listeners` (`PLAINTEXT`, `CONTROLLER`, ...): that listener serves
//! on the inherited socket instead of binding its own.
//!
//! Why: whoever starts Strand can hold the ports from before the process
//! exists (systemd socket units; test harnesses that must write every
//! node's ports into `controller.quorum.voters` before any node starts), so
//! no port is ever released and re-bound, and no other process can take it
//! in between.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::{FromRawFd, RawFd};

use crate::config::Listener;

/// The first inherited descriptor (after stdin, stdout and stderr).
const FIRST_FD: RawFd = 3;

/// Takes the sockets named in the environment (and removes the variables, so
/// no child process of ours sees them). Each must be a listening TCP socket,
/// named after one of `listeners` (the client listeners and the
/// CONTROLLER listener) and bound to its address (any port when
/// the listener's port is 0). Nothing set: no sockets. Call before starting
/// threads (the environment is changed).
pub fn take(listeners: &[Listener]) -> Result<Vec<(String, TcpListener)>, String> {
    let count = std::env::var("LISTEN_FDS").ok();
    let names = std::env::var("LISTEN_FDNAMES").ok();
    let pid = std::env::var("LISTEN_PID").ok();
    for key in ["LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"] {
        std::env::remove_var(key);
    }
    let Some(count) = count else { return Ok(Vec::new()) };
    if let Some(pid) = pid {
        // Meant for another process (an ancestor's, passed down by mistake).
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return Ok(Vec::new());
        }
    }
    let count: usize =
        count.trim().parse().map_err(|_| format!("LISTEN_FDS={count:?}: expected the number of inherited sockets"))?;
    let names: Vec<String> = match names {
        Some(names) if !names.is_empty() => names.split(':').map(str::to_string).collect(),
        _ => return Err("LISTEN_FDS is set without LISTEN_FDNAMES naming the listener of each socket".into()),
    };
    if names.len() != count {
        return Err(format!("LISTEN_FDS={count} but LISTEN_FDNAMES names {} sockets", names.len()));
    }
    let mut taken = Vec::with_capacity(count);
    for (i, name) in names.into_iter().enumerate() {
        let fd = FIRST_FD + i as RawFd;
        let listener = listeners
            .iter()
            .find(|l| l.name == name)
            .ok_or_else(|| format!("LISTEN_FDNAMES names {name:?}, which is not a listener in listeners"))?;
        check_listening_tcp(fd).map_err(|e| format!("inherited socket {name} (fd {fd}): {e}"))?;
        // SAFETY: fd is an open listening TCP socket (checked above) that this
        // process owns from here on: the protocol hands it over, and the
        // variables naming it are gone, so nothing else takes it.
        let socket = unsafe { TcpListener::from_raw_fd(fd) };
        set_cloexec(fd).map_err(|e| format!("inherited socket {name} (fd {fd}): {e}"))?;
        socket.set_nonblocking(true).map_err(|e| format!("inherited socket {name} (fd {fd}): {e}"))?;
        let local = socket.local_addr().map_err(|e| format!("inherited socket {name} (fd {fd}): {e}"))?;
        check_address(listener, local)?;
        taken.push((name, socket));
    }
    Ok(taken)
}

/// The listener's configured address must be the socket's (its port, unless
/// the configured one is 0).
fn check_address(listener: &Listener, local: SocketAddr) -> Result<(), String> {
    let want = listener.bind_addr()?;
    let same_ip = match (want.ip(), local.ip()) {
        (a, b) if a == b => true,
        (IpAddr::V4(a), IpAddr::V6(b)) | (IpAddr::V6(b), IpAddr::V4(a)) => b.to_ipv4_mapped() == Some(a),
        _ => false,
    };
    if same_ip && (want.port() == 0 || want.port() == local.port()) {
        Ok(())
    } else {
        Err(format!(
            "inherited socket {} is bound to {local}, but listeners names {}://{}:{}",
            listener.name, listener.name, listener.host, listener.port
        ))
    }
}

fn check_listening_tcp(fd: RawFd) -> Result<(), String> {
    let int_option = |level, option| -> Result<libc::c_int, String> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len are valid for writes of a c_int.
        let rc = unsafe { libc::getsockopt(fd, level, option, (&mut value as *mut libc::c_int).cast(), &mut len) };
        if rc == 0 {
            Ok(value)
        } else {
            Err(format!("not a socket ({})", std::io::Error::last_os_error()))
        }
    };
    if int_option(libc::SOL_SOCKET, libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err("not a stream socket".into());
    }
    let domain = int_option(libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return Err("not a TCP socket".into());
    }
    if int_option(libc::SOL_SOCKET, libc::SO_ACCEPTCONN)? == 0 {
        return Err("not listening (listen() was not called)".into());
    }
    Ok(())
}

/// Inherited descriptors arrive without close-on-exec; ours keep it.
fn set_cloexec(fd: RawFd) -> Result<(), String> {
    // SAFETY: fcntl on a descriptor this process owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(format!("cannot set close-on-exec ({})", std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(text: &str) -> Listener {
        let (name, rest) = text.split_once("://").unwrap();
        let (host, port) = rest.rsplit_once(':').unwrap();
        Listener { name: name.into(), host: host.into(), port: port.parse().unwrap() }
    }

    #[test]
    fn an_inherited_socket_must_be_bound_where_its_listener_says() {
        let local: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        assert!(check_address(&listener("PLAINTEXT://127.0.0.1:4000"), local).is_ok());
        assert!(check_address(&listener("PLAINTEXT://localhost:0"), local).is_ok());
        let wrong_port = check_address(&listener("PLAINTEXT://127.0.0.1:4001"), local).unwrap_err();
        assert!(
            wrong_port.contains("bound to 127.0.0.1:4000") && wrong_port.contains("127.0.0.1:4001"),
            "{wrong_port}"
        );
        assert!(check_address(&listener("PLAINTEXT://10.0.0.1:4000"), local).is_err());
        assert!(check_address(&listener("PLAINTEXT://:4000"), "0.0.0.0:4000".parse().unwrap()).is_ok());
    }

    #[test]
    fn only_listening_tcp_sockets_are_taken() {
        use std::os::fd::AsRawFd;
        let listening = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(check_listening_tcp(listening.as_raw_fd()).is_ok());
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(check_listening_tcp(file.as_raw_fd()).unwrap_err().contains("not a socket"));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(check_listening_tcp(udp.as_raw_fd()).is_err());
    }
}
