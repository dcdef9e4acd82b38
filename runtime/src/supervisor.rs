//! Every long-running task of a process runs under one supervisor. A task that ends
//! before the process was told to stop (an error, a panic, or a plain return) is a
//! fault: the supervisor logs which task and why, tells the others to stop, and the
//! process exits non-zero so that its service manager restarts it. A process never runs
//! half-alive, with one reader dead and its `/healthz` still green.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long the other tasks get to finish after one failed or the stop was given.
const GRACE: Duration = Duration::from_secs(30);

pub struct Supervisor {
    stop: CancellationToken,
    done_tx: mpsc::UnboundedSender<(String, anyhow::Result<()>)>,
    done_rx: mpsc::UnboundedReceiver<(String, anyhow::Result<()>)>,
    running: usize,
}

impl Supervisor {
    /// Tasks are told to stop through `stop` (cancelled on SIGTERM, or when a task fails).
    pub fn new(stop: CancellationToken) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            stop,
            done_tx,
            done_rx,
            running: 0,
        }
    }

    pub fn stop(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `task` on a thread of its own (readers block in librdkafka's poll).
    pub fn spawn_thread(
        &mut self,
        name: impl Into<String>,
        task: impl FnOnce(CancellationToken) -> anyhow::Result<()> + Send + 'static,
    ) {
        let name = name.into();
        let (stop, done) = (self.stop.clone(), self.done_tx.clone());
        self.running += 1;
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| task(stop)))
                    .unwrap_or_else(|panic| {
                        Err(anyhow::anyhow!("panicked: {}", panic_text(&*panic)))
                    });
                let _ = done.send((name, result));
            })
            .expect("spawning a task thread");
    }

    /// Runs `task` on the tokio runtime of the caller.
    pub fn spawn_async(
        &mut self,
        name: impl Into<String>,
        task: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) {
        let name = name.into();
        let done = self.done_tx.clone();
        self.running += 1;
        let handle = tokio::spawn(task);
        tokio::spawn(async move {
            let result = match handle.await {
                Ok(result) => result,
                Err(e) if e.is_panic() => Err(anyhow::anyhow!(
                    "panicked: {}",
                    panic_text(&*e.into_panic())
                )),
                Err(e) => Err(anyhow::anyhow!("cancelled: {e}")),
            };
            let _ = done.send((name, result));
        });
    }

    /// Waits for every task. Returns `Ok` only if every task ended after the stop was
    /// given, without an error. The first task to end early gives it itself.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut first_fault: Option<anyhow::Error> = None;
        let mut deadline: Option<tokio::time::Instant> = None;
        while self.running > 0 {
            let next = match deadline {
                Some(d) => match tokio::time::timeout_at(d, self.done_rx.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        tracing::error!(
                            tasks = self.running,
                            "tasks still running {GRACE:?} after the stop; leaving them"
                        );
                        break;
                    }
                },
                None => {
                    // A stop given from outside starts the grace period.
                    tokio::select! {
                        next = self.done_rx.recv() => next,
                        () = self.stop.cancelled() => {
                            deadline = Some(tokio::time::Instant::now() + GRACE);
                            continue;
                        }
                    }
                }
            };
            let Some((name, result)) = next else { break };
            self.running -= 1;
            let stopping = self.stop.is_cancelled();
            match result {
                Ok(()) if stopping => tracing::debug!(task = %name, "task stopped"),
                Ok(()) => {
                    tracing::error!(task = %name, "task ended on its own; stopping the process");
                    first_fault
                        .get_or_insert_with(|| anyhow::anyhow!("task {name} ended on its own"));
                }
                Err(err) => {
                    tracing::error!(task = %name, "task failed: {err:#}; stopping the process");
                    first_fault.get_or_insert_with(|| err.context(format!("task {name} failed")));
                }
            }
            if !stopping || first_fault.is_some() {
                self.stop.cancel();
                deadline.get_or_insert_with(|| tokio::time::Instant::now() + GRACE);
            }
        }
        first_fault.map_or(Ok(()), Err)
    }

    /// [`Supervisor::wait`] for a caller without a runtime of its own (a plain thread).
    pub fn wait_blocking(self) -> anyhow::Result<()> {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
            .block_on(self.wait())
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_fails_stops_the_others_and_the_process_fails() {
        let stop = CancellationToken::new();
        let mut s = Supervisor::new(stop.clone());
        // A well-behaved task: runs until told to stop.
        s.spawn_thread("steady", |stop| {
            while !stop.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        });
        s.spawn_thread("second", |_| anyhow::bail!("the database is gone"));
        let err = s.wait().await.expect_err("a failed task fails the process");
        assert!(format!("{err:#}").contains("task second failed: the database is gone"));
        assert!(stop.is_cancelled(), "the others were told to stop");
    }

    #[tokio::test]
    async fn a_panic_or_an_early_return_is_a_fault_too() {
        let mut s = Supervisor::new(CancellationToken::new());
        s.spawn_thread("panics", |_| panic!("boom"));
        let err = s.wait().await.unwrap_err();
        assert!(format!("{err:#}").contains("panicked: boom"), "{err:#}");

        let mut s = Supervisor::new(CancellationToken::new());
        s.spawn_async("returns", async { Ok(()) });
        let err = s.wait().await.unwrap_err();
        assert!(format!("{err:#}").contains("ended on its own"));
    }

    #[tokio::test]
    async fn tasks_that_stop_when_told_end_the_process_cleanly() {
        let stop = CancellationToken::new();
        let mut s = Supervisor::new(stop.clone());
        for i in 0..3 {
            s.spawn_thread(format!("t{i}"), |stop| {
                while !stop.is_cancelled() {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(())
            });
        }
        stop.cancel();
        s.wait().await.expect("a clean stop");
    }
}
