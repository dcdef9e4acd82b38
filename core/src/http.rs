//! The HTTP server loop of ingest-api and the gateway: hyper's HTTP/1 connection with
//! the limits a public listener needs, which `axum::serve` does not set.
//!
//! * **Header-read timeout.** A connection gets `header_read_timeout_ms` to deliver a
//!   request's headers, counted from when the server starts waiting for them: from the
//!   accept on a new connection, from the end of the previous response on a keep-alive
//!   one. So it also closes keep-alive connections idle that long, and a socket that
//!   never finishes its headers (slowloris) holds nothing past it.
//! * **Connection caps.** At most `max_connections` HTTP connections are served at once,
//!   and at most `max_connections_per_ip` from one client address, so one client holding
//!   idle keep-alive connections cannot lock everyone else out. One more is answered
//!   `503` with `Retry-After: 1` and closed, once its request's head is in (or after a
//!   second), without routing it. A connection upgraded to a WebSocket leaves hyper, and
//!   these counts, at the upgrade: the gateway caps its sessions itself.
//! * **Refusals are bounded too.** At most `refusing_at_once` connections are being
//!   answered 503 at a time; past that a refused connection is closed at once, unanswered.
//!
//! Metrics: `http_connections_open`, `http_connections_refused_total{reason}` (`total`,
//! `per_ip`), `http_connections_dropped_total` (closed unanswered),
//! `http_connection_timeouts_total` (closed by the header-read timeout).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// The connection limits in a service's `[http]`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct ConnectionLimits {
    pub header_read_timeout_ms: u64,
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    pub refusing_at_once: usize,
}

impl ConnectionLimits {
    /// An operators' listener (admin, the processors' metrics): loopback by default, a
    /// few scrapers.
    pub const ADMIN: ConnectionLimits = ConnectionLimits {
        header_read_timeout_ms: 10_000,
        max_connections: 64,
        max_connections_per_ip: 64,
        refusing_at_once: 16,
    };
}

/// Connections open per client address.
#[derive(Clone, Default)]
struct PerIp(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection's place in its address's count; given back on drop.
struct IpSlot {
    counts: PerIp,
    ip: IpAddr,
}

impl PerIp {
    fn take(&self, ip: IpAddr, max: usize) -> Option<IpSlot> {
        let mut counts = self.0.lock().expect("per-ip lock");
        let open = counts.entry(ip).or_insert(0);
        if *open >= max {
            return None;
        }
        *open += 1;
        Some(IpSlot {
            counts: self.clone(),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().expect("per-ip lock");
        if let Some(open) = counts.get_mut(&self.ip) {
            *open -= 1;
            if *open == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// What a connection over the cap is told before it is closed.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\nretry-after: 1\r\nconnection: close\r\n\
content-length: 131\r\n\r\n\
{\"type\":\"/problems/unavailable\",\"title\":\"Service unavailable\",\"status\":503,\
\"detail\":\"the server is at its connection limit; retry\"}";

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets
/// each connection finish the request it is in, and returns once all have closed (the
/// caller bounds how long it waits). Upgraded connections (WebSockets) are the
/// router's to close.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_ip = PerIp::default();
    let refusing = Arc::new(Semaphore::new(limits.refusing_at_once.max(1)));
    let header_timeout = Duration::from_millis(limits.header_read_timeout_ms.max(1));
    // Connections hold a receiver; the sender's drop tells them to finish, and
    // `closed()` on it resolves when the last one is gone.
    let (stop_tx, stop_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(ip_slot) = per_ip.take(peer.ip(), limits.max_connections_per_ip.max(1)) else {
            refuse_bounded(stream, "per_ip", &refusing);
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse_bounded(stream, "total", &refusing);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            metrics::gauge!("http_connections_open").increment(1.0);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(conn);
            let result = tokio::select! {
                result = conn.as_mut() => result,
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(err) = result {
                if err.is_timeout() {
                    metrics::counter!("http_connection_timeouts_total").increment(1);
                } else {
                    tracing::debug!(%err, "connection ended with an error");
                }
            }
            metrics::gauge!("http_connections_open").decrement(1.0);
            drop(slot);
            drop(ip_slot);
            drop(stop);
        });
    }
    drop(listener);
    drop(stop_rx);
    let _ = stop_tx.send(());
    stop_tx.closed().await;
    Ok(())
}

/// Refuses a connection over a cap: answered 503 while fewer than `refusing_at_once` are
/// being answered, closed unanswered past that.
fn refuse_bounded(stream: TcpStream, reason: &'static str, refusing: &Arc<Semaphore>) {
    metrics::counter!("http_connections_refused_total", "reason" => reason).increment(1);
    match refusing.clone().try_acquire_owned() {
        Ok(permit) => {
            tokio::spawn(async move {
                refuse(stream).await;
                drop(permit);
            });
        }
        Err(_) => {
            metrics::counter!("http_connections_dropped_total").increment(1);
            drop(stream);
        }
    }
}

/// Answers 503 to a connection over the cap and closes it, within a second. The
/// request's head is read first (up to 8 KiB): HTTP clients take an answer that comes
/// before their request for a broken connection.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let mut head = Vec::with_capacity(1024);
        let mut buf = [0u8; 1024];
        while head.len() < 8192 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await? {
                0 => break,
                n => head.extend_from_slice(&buf[..n]),
            }
        }
        stream.write_all(OVER_CAPACITY).await?;
        stream.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_over_capacity_answer_is_a_complete_response() {
        let text = std::str::from_utf8(OVER_CAPACITY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        let problem: serde_json::Value = serde_json::from_str(body.trim_end()).unwrap();
        assert_eq!(problem["status"], 503);
    }
}
