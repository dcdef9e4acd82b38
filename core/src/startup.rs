//! Waiting at start for what a service needs. Started beside the registry, the broker
//! and the database (a compose file, a Kubernetes pod, a reboot), a service may come up
//! first: it retries instead of exiting, logging each failure, for a bounded time. And
//! the signal that stops every service: [`shutdown_signal`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// The longest wait between two attempts.
const MOST: Duration = Duration::from_secs(5);

/// Runs `attempt` until it succeeds, waiting 250 ms, then twice as long each time (up to
/// 5 s) between failures. Gives up with the last error once `patience` is spent, or at
/// once on an error `permanent` says no retry can mend (an incompatible schema).
pub async fn wait_for<T, E, Fut>(
    what: &str,
    patience: Duration,
    mut attempt: impl FnMut() -> Fut,
    permanent: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    E: std::fmt::Display,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut wait = Duration::from_millis(250);
    let mut failures = 0u32;
    loop {
        match attempt().await {
            Ok(value) => {
                if failures > 0 {
                    tracing::info!(
                        failures,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "{what}: ready"
                    );
                }
                return Ok(value);
            }
            Err(err) if permanent(&err) || started.elapsed() + wait > patience => return Err(err),
            Err(err) => {
                failures += 1;
                tracing::warn!(
                    failures,
                    retry_in_ms = wait.as_millis() as u64,
                    "{what}: {err}; waiting"
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MOST);
            }
        }
    }
}

/// Resolves when the process is asked to stop: SIGINT (Ctrl-C) or SIGTERM (what a
/// process manager, Kubernetes or `scripts/demo stop` sends). Every service drains and
/// stops on it.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn retries_until_success_and_stops_at_a_permanent_error_or_the_patience() {
        let calls = AtomicU32::new(0);
        let ok = wait_for(
            "thing",
            Duration::from_secs(60),
            || async {
                let n = calls.fetch_add(1, Ordering::Relaxed);
                if n < 3 {
                    Err("down")
                } else {
                    Ok(n)
                }
            },
            |_| false,
        )
        .await;
        assert_eq!(ok, Ok(3));

        let calls = AtomicU32::new(0);
        let permanent: Result<(), &str> = wait_for(
            "thing",
            Duration::from_secs(60),
            || async {
                calls.fetch_add(1, Ordering::Relaxed);
                Err("incompatible")
            },
            |e| *e == "incompatible",
        )
        .await;
        assert_eq!(permanent, Err("incompatible"));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            1,
            "a permanent error is not retried"
        );

        let started = tokio::time::Instant::now();
        let gave_up: Result<(), &str> = wait_for(
            "thing",
            Duration::from_secs(20),
            || async { Err("down") },
            |_| false,
        )
        .await;
        assert_eq!(gave_up, Err("down"));
        let waited = started.elapsed();
        assert!(
            waited <= Duration::from_secs(20) && waited >= Duration::from_secs(14),
            "{waited:?}"
        );
    }
}
