//! A spinner on stderr while the CLI waits on long work, so a slow query
//! over days of data does not look like a hang. Silent when stderr is not
//! a terminal (scripts, CI logs).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const FRAMES: [char; 8] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧'];

/// Shows `message` with a spinner and elapsed time until dropped.
#[derive(Debug)]
pub struct Progress {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts the spinner (a no-op when stderr is not a terminal).
    pub fn start(message: impl Into<String>) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        if !std::io::stderr().is_terminal() {
            return Self { done, thread: None };
        }
        let message = message.into();
        let flag = Arc::clone(&done);
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            // Stay quiet for fast answers; show up only when waiting is noticeable.
            std::thread::sleep(Duration::from_millis(300));
            let mut frame = 0;
            while !flag.load(Ordering::Relaxed) {
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\r{} {message} {:.1}s ",
                    FRAMES[frame % FRAMES.len()],
                    started.elapsed().as_secs_f64()
                );
                let _ = err.flush();
                drop(err);
                frame += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            if frame > 0 {
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            }
        });
        Self {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
