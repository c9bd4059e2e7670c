//! agentbox on a pseudo-terminal the test opens: keys typed in, the screen read back.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{agentbox, text};

/// Generous: the first sandbox of a loaded machine can take a while.
pub const WAIT: Duration = Duration::from_secs(120);

pub fn termios_of(fd: i32) -> libc::termios {
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::tcgetattr(fd, &mut t) }, 0);
    t
}

/// agentbox on the slave side of a pty (its controlling terminal), the test on the master.
pub struct Pty {
    master: std::fs::File,
    pub slave: OwnedFd,
    pub child: Child,
    screen: Arc<Mutex<Vec<u8>>>,
}

impl Pty {
    pub fn spawn(args: &[&str]) -> Pty {
        Pty::spawn_with(args, &[])
    }

    pub fn spawn_with(args: &[&str], env: &[(&str, &str)]) -> Pty {
        let (mut master, mut slave) = (0, 0);
        let ws = libc::winsize {
            ws_row: 24,
            ws_col: 80,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &ws,
            )
        };
        assert_eq!(r, 0, "openpty");
        let master_file = unsafe { std::fs::File::from_raw_fd(master) };
        let slave_fd = unsafe { OwnedFd::from_raw_fd(slave) };
        let mut cmd = agentbox();
        cmd.args(args);
        cmd.env("TERM", "xterm-256color");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let dup = |fd: i32| unsafe { Stdio::from_raw_fd(libc::dup(fd)) };
        cmd.stdin(dup(slave)).stdout(dup(slave)).stderr(dup(slave));
        unsafe {
            cmd.pre_exec(|| {
                // A session of its own with the pty as its controlling terminal, as a login
                // shell gives a program: SIGWINCH comes from the terminal.
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn agentbox");
        let screen = Arc::new(Mutex::new(Vec::new()));
        let reader_screen = screen.clone();
        let mut reader = master_file.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once every slave descriptor is closed (agentbox gone, and ours dropped).
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                reader_screen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty {
            master: master_file,
            slave: slave_fd,
            child,
            screen,
        }
    }

    pub fn screen(&self) -> String {
        text(&self.screen.lock().unwrap())
    }

    /// Wait until `needle` shows after byte `from` of the screen; returns where it ends.
    pub fn wait_for(&mut self, needle: &str, from: usize) -> usize {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if let Some(i) = screen.get(from..).and_then(|s| s.find(needle)) {
                return from + i + needle.len();
            }
            if start.elapsed() > WAIT {
                let _ = self.child.kill();
                panic!("{needle:?} never showed; the screen:\n{screen}");
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(300));
                panic!(
                    "agentbox exited ({status}) before {needle:?} showed; the screen:\n{}",
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn type_keys(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).unwrap();
    }

    pub fn resize(&self, rows: u16, cols: u16) {
        let ws = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        assert_eq!(
            unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) },
            0
        );
    }

    pub fn wait_exit(&mut self) -> i32 {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            if start.elapsed() > WAIT {
                let _ = self.child.kill();
                panic!("agentbox did not exit; the screen:\n{}", self.screen());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
