//! Listening sockets handed to a real `strand` process (systemd's
//! LISTEN_FDS protocol, src/listen_fds.rs): the broker serves on the socket
//! it inherits and binds nothing itself, so whoever started it keeps the
//! port across restarts; a socket that does not match its listener is
//! refused at start-up by name.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use common::child::ChildBroker;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_serves_on_its_inherited_socket_and_the_port_stays_held_while_it_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(dir.path());
    broker.start();
    let addr: SocketAddr = broker.bootstrap().parse().unwrap();
    let (_, offset) = produce_one(&broker.bootstrap(), "inherited", 0, b"before the restart").await;
    assert_eq!(offset, 0);

    broker.kill();
    // Down: connections are refused at once (nothing listens) and no other
    // process can take the port.
    let refused = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused, "{refused}");
    let taken = TcpListener::bind(addr).unwrap_err();
    assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse, "{taken}");

    broker.start();
    assert_eq!(broker.bootstrap(), addr.to_string(), "the same port after the restart");
    let read = consume(&broker.bootstrap(), "inherited", 0, 0, 1, Duration::from_secs(20)).await;
    assert_eq!(read, vec![(0, b"before the restart".to_vec())]);
    broker.stop();
}

#[test]
fn an_inherited_socket_on_another_address_than_its_listener_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // The socket handed over is on the reserved port; the listener names port 9.
    let mut broker = ChildBroker::new(dir.path()).with_properties(&["listeners=PLAINTEXT://127.0.0.1:9"]);
    broker.spawn();
    let status = broker.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "{status}");
    let stderr = broker.stderr();
    assert!(
        stderr.contains("inherited socket PLAINTEXT is bound to 127.0.0.1:")
            && stderr.contains("listeners names PLAINTEXT://127.0.0.1:9"),
        "{stderr}"
    );
    assert!(!broker.log_dir().exists(), "start-up wrote {}", broker.log_dir().display());
}

#[test]
fn an_inherited_socket_named_for_no_listener_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = ChildBroker::new(dir.path()).with_listener("EXTERNAL", common::ports::ReservedPort::new());
    broker.spawn();
    let status = broker.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "{status}");
    let stderr = broker.stderr();
    assert!(stderr.contains("LISTEN_FDNAMES names \"EXTERNAL\", which is not a listener"), "{stderr}");
}
