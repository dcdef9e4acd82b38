//! A test that hangs ends its test binary with its name and where every thread stood,
//! instead of running into CI's overall timeout with no clue which test it was.
//!
//! [`arm`] is called by the fixtures every integration test starts with (a fresh
//! database, a pipeline namespace). It watches the calling test's thread: libtest runs
//! each test on a thread named after it, and the thread ends with the test, pass or
//! fail. A test still running after `CHATPIPE_TEST_DEADLINE_SECS` (default 480; 0 turns
//! the watchdog off) gets its threads' stacks printed by gdb, when gdb is installed, and
//! the binary exits with 101. Benchmarks and the drill binary run on `main` or on tokio
//! workers, which are never armed: they may run for as long as they are asked to.

use std::cell::RefCell;
use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

const DEFAULT_DEADLINE_SECS: u64 = 480;

thread_local! {
    /// Dropped when the test's thread ends, which tells the watchdog to stand down.
    static ARMED: RefCell<Option<mpsc::Sender<()>>> = const { RefCell::new(None) };
}

/// Watches the calling test (once per test; later calls do nothing).
pub fn arm() {
    let Some(test) = std::thread::current().name().map(str::to_owned) else {
        return;
    };
    if test == "main" || test.starts_with("tokio-") {
        return;
    }
    let limit = match std::env::var("CHATPIPE_TEST_DEADLINE_SECS") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("CHATPIPE_TEST_DEADLINE_SECS={s:?}: not a number")),
        Err(_) => DEFAULT_DEADLINE_SECS,
    };
    if limit == 0 {
        return;
    }
    ARMED.with(|armed| {
        let mut armed = armed.borrow_mut();
        if armed.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel::<()>();
        *armed = Some(tx);
        let limit = Duration::from_secs(limit);
        std::thread::Builder::new()
            .name(format!("watchdog {test}"))
            .spawn(move || {
                if let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                    hung(&test, limit);
                }
            })
            .expect("starting the test watchdog");
    });
}

fn hung(test: &str, limit: Duration) -> ! {
    // Straight to the process's stderr: libtest captures `eprintln!` in the threads a
    // test spawns, and that capture is lost when the process exits.
    let mut err = std::io::stderr().lock();
    let secs = limit.as_secs();
    let _ = writeln!(err, "\n=== watchdog: `{test}` is still running after {secs}s; the threads of this test binary that are in our code or librdkafka:");
    let _ = match stacks(test) {
        Ok(text) => writeln!(err, "{text}"),
        Err(why) => writeln!(err, "(no thread stacks: {why})"),
    };
    let _ = writeln!(
        err,
        "=== watchdog: `{test}` hung (still running after {secs}s, see the stacks above); \
         exiting this test binary"
    );
    std::process::exit(101);
}

/// Every thread's stack from gdb, keeping only the threads with a frame in our crates or
/// in librdkafka (the runtime's idle workers say nothing), and from those only such frames.
fn stacks(test: &str) -> Result<String, String> {
    let test_fn = test.rsplit("::").next().unwrap_or(test);
    let out = std::process::Command::new("gdb")
        .args(["-p", &std::process::id().to_string(), "-batch", "-nx"])
        .args(["-ex", "set print frame-arguments none"])
        .args(["-ex", "thread apply all bt"])
        .output()
        .map_err(|e| format!("running gdb: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ours = |line: &str| {
        ([
            "chatpipe",
            "pipeline::",
            "gateway::",
            "ingest_api::",
            "rd_kafka",
            "rdkafka::",
            "tests::",
        ]
        .iter()
        .any(|m| line.contains(m))
            || line.contains(test_fn))
            && !line.contains("chatpipe_tests::watchdog")
    };
    let mut kept = String::new();
    for thread in text.split("\nThread ").skip(1) {
        let mut lines = thread.lines();
        let header = lines.next().unwrap_or_default();
        let frames: Vec<&str> = lines.filter(|l| ours(l)).take(25).collect();
        if !frames.is_empty() {
            kept.push_str(&format!("Thread {header}\n"));
            for f in frames {
                // The source path after " at " is long; the function names say enough.
                kept.push_str(&format!("  {}\n", f.split(" at /").next().unwrap_or(f)));
            }
        }
    }
    if kept.is_empty() {
        return Err(format!(
            "gdb found no thread in our code (exit {}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(kept)
}
