//! The real `strand` binary as a child process, for crash and restart tests.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::ports::{spawn_with_listeners, ReservedPort};

/// A `strand` child process and its data directory.
pub struct ChildBroker {
    dir: PathBuf,
    child: Option<Child>,
    /// The port every start listens on (handed over as a socket, never
    /// bound by the child), and the listener it serves.
    port: ReservedPort,
    listener_name: String,
    starts: usize,
    /// Extra `server.properties` lines.
    extra: String,
    /// RLIMIT_NOFILE (soft and hard) the child runs with, if set.
    nofile: Option<u64>,
}

impl ChildBroker {
    pub fn new(dir: &Path) -> ChildBroker {
        ChildBroker {
            dir: dir.to_path_buf(),
            child: None,
            port: ReservedPort::new(),
            listener_name: "PLAINTEXT".into(),
            starts: 0,
            extra: String::new(),
            nofile: None,
        }
    }

    /// Adds `key=value` lines to the properties of every later start.
    pub fn with_properties(mut self, lines: &[&str]) -> ChildBroker {
        for l in lines {
            self.extra.push_str(l);
            self.extra.push('\n');
        }
        self
    }

    /// Serves listener `name` on `port` (the default: PLAINTEXT on a port
    /// reserved by [`ChildBroker::new`]), for properties that must name the
    /// port before it starts.
    pub fn with_listener(mut self, name: &str, port: ReservedPort) -> ChildBroker {
        self.listener_name = name.into();
        self.port = port;
        self
    }

    /// Runs later starts with this RLIMIT_NOFILE (soft and hard).
    pub fn with_nofile_limit(mut self, limit: u64) -> ChildBroker {
        self.nofile = Some(limit);
        self
    }

    /// The running child's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Descriptors the running child has open (entries of /proc/<pid>/fd).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).expect("read the child's /proc/<pid>/fd").count()
    }

    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn partition_dir(&self, topic: &str, partition: i32) -> PathBuf {
        self.log_dir().join(format!("{topic}-{partition}"))
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port.port())
    }

    pub fn stderr_path(&self) -> PathBuf {
        self.dir.join(format!("stderr-{}.log", self.starts))
    }

    /// The stderr of the latest start.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    /// Spawns the binary on its port (no waiting); the same port across
    /// restarts, as clients expect of a restarted broker.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.starts += 1;
        let config = self.dir.join("server.properties");
        std::fs::write(&config, super::properties(&self.log_dir(), self.port.port()) + &self.extra).unwrap();
        let stderr = std::fs::File::create(self.stderr_path()).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_strand"));
        command
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(limit) = self.nofile {
            use std::os::unix::process::CommandExt;
            let rlim = libc::rlimit { rlim_cur: limit as libc::rlim_t, rlim_max: limit as libc::rlim_t };
            // SAFETY: setrlimit is async-signal-safe and touches only the child.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rlim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let listener = vec![(self.listener_name.as_str(), self.port.listener())];
        let child = spawn_with_listeners(&mut command, listener).expect("spawn strand");
        self.child = Some(child);
    }

    /// Starts the broker and waits (bounded) until it accepts connections.
    pub fn start(&mut self) {
        self.spawn();
        let addr: SocketAddr = self.bootstrap().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // The port is bound before the logs are recovered; the broker is ready
            // once it logs that it started (and then it also accepts).
            if self.stderr().contains("strand started")
                && std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
            {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().expect("try_wait") {
                self.child = None;
                panic!("strand exited with {status} before accepting; stderr:\n{}", self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "strand did not accept on {addr} within 60 s; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (bounded) for the child to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("strand did not exit within {timeout:?}; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// SIGSTOP: frozen, sockets open, nothing answered, until [`Self::resume`].
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP, "SIGSTOP");
    }

    /// SIGCONT to a paused broker.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT, "SIGCONT");
    }

    fn signal(&self, signal: libc::c_int, name: &str) {
        let pid = self.child.as_ref().expect("running").id() as libc::pid_t;
        // SAFETY: plain kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "{name}");
    }

    /// SIGTERM: a clean shutdown; the broker must exit 0.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM, "SIGTERM");
        let status = self.wait_exit(Duration::from_secs(60));
        assert!(status.success(), "clean shutdown exit status {status}; stderr:\n{}", self.stderr());
        assert!(self.stderr().contains("strand stopped"), "stderr:\n{}", self.stderr());
    }
}

impl Drop for ChildBroker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
