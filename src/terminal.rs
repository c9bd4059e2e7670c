//! The host's terminal, for `agentbox shell` and `exec -it`: is there one, its size, raw mode
//! (restored when the guard drops: on return, error, panic and cancellation alike), and a
//! stdin pump that stops when asked instead of leaving a thread blocked in `read`.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub const STDIN: RawFd = 0;
pub const STDOUT: RawFd = 1;
pub const STDERR: RawFd = 2;

pub fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only reads the descriptor's state.
    unsafe { libc::isatty(fd) == 1 }
}

/// (rows, columns) of the terminal on `fd`, if it is one and knows its size.
pub fn window_size(fd: RawFd) -> Option<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own.
    let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// The terminal in raw mode while this lives: every key (Ctrl-C, Ctrl-D, Ctrl-Z) goes to the
/// process in the sandbox as a byte, not to agentbox as a signal.
pub struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    pub fn enter(fd: RawFd) -> std::io::Result<RawMode> {
        // SAFETY: termios is plain data; tcgetattr fills it.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `saved` is a valid termios to fill.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: a termios derived from the terminal's own.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: the settings read from this terminal in `enter`.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// Reads stdin on a thread of its own and hands the bytes over; stops within 100 ms of being
/// dropped (it polls instead of blocking in `read`, so no thread outlives the session). The
/// channel closes at end of input.
pub struct StdinPump {
    stop: Arc<AtomicBool>,
}

impl StdinPump {
    pub fn start(fd: RawFd) -> (StdinPump, tokio::sync::mpsc::Receiver<Vec<u8>>) {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
        let flag = stop.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            while !flag.load(Ordering::Acquire) {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd we own.
                let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
                if ready < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                if ready == 0 {
                    continue;
                }
                // SAFETY: reads into a buffer of `buf.len()` bytes we own.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0 {
                    if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                if n == 0 || tx.blocking_send(buf[..n as usize].to_vec()).is_err() {
                    return;
                }
            }
        });
        (StdinPump { stop }, rx)
    }
}

impl Drop for StdinPump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}
