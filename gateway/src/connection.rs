//! One WebSocket connection: frames from its session queue go out, pings keep it honest.
//! Generic over `Sink`/`Stream` so tests drive it without a socket.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message};
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::time::Instant;

use crate::sessions::{Outbound, Session};

/// Close code 1008 (policy violation): the client did not keep up.
pub const CLOSE_OVERFLOW: u16 = 1008;
/// Close code 1008 too, with another reason: the client sent more frames than
/// `signals.frames` allows.
pub const CLOSE_FLOODED: u16 = 1008;
/// Close code 1001 (going away): no pong for two heartbeats, or the gateway stops.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code 1013 (try again later): the gateway holds `sessions.max_sessions`.
pub const CLOSE_TRY_AGAIN_LATER: u16 = 1013;
/// Close code 4001: the token was refused at connect; the reason says why. A browser
/// cannot see a 401 before the upgrade, so the gateway upgrades and closes with this.
pub const CLOSE_UNAUTHORIZED: u16 = 4001;
/// Close code 4002: the token expired while connected; reconnect with a new one.
pub const CLOSE_TOKEN_EXPIRED: u16 = 4002;
/// Close code 4008: a newer session of the same user replaced this one
/// (`sessions.max_sessions_per_user`).
pub const CLOSE_REPLACED: u16 = 4008;

/// Why a connection ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    ClientClosed,
    Overflowed,
    HeartbeatTimeout,
    /// A frame could not be written for two heartbeats: the client stopped reading and
    /// the socket buffers are full; no close frame could get through either.
    WriteTimeout,
    SendFailed,
    Shutdown,
    TokenExpired,
    Replaced,
    /// The client sent text frames faster than its connection's bucket allows.
    Flooded,
}

/// What a connection does with what its client says (the gateway's: `signals.rs`).
pub trait ClientFrames {
    /// One text frame. `false`: the client is flooding; the connection closes.
    fn text(&mut self, text: &str) -> bool;
    /// When [`ClientFrames::flush`] has something due, if ever.
    fn next_flush(&self) -> Option<Instant>;
    /// Passes on what was held back until now.
    fn flush(&mut self);
    /// The connection ended: passes on everything still held back.
    fn end(&mut self) {}
}

/// A connection that ignores what its client says.
impl ClientFrames for () {
    fn text(&mut self, _: &str) -> bool {
        true
    }
    fn next_flush(&self) -> Option<Instant> {
        None
    }
    fn flush(&mut self) {}
}

/// Sleeps until `at`, or for ever.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub async fn serve<S, R, E>(
    sink: S,
    stream: R,
    session: Session,
    heartbeat: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) -> Ended
where
    S: Sink<Message> + Unpin,
    R: Stream<Item = Result<Message, E>> + Unpin,
{
    serve_with(sink, stream, session, heartbeat, shutdown, ()).await
}

/// [`serve`], handing each text frame the client sends to `frames`, and ending them
/// when the connection ends, however it does.
pub async fn serve_with<S, R, E>(
    sink: S,
    stream: R,
    session: Session,
    heartbeat: Duration,
    shutdown: impl std::future::Future<Output = ()>,
    mut frames: impl ClientFrames,
) -> Ended
where
    S: Sink<Message> + Unpin,
    R: Stream<Item = Result<Message, E>> + Unpin,
{
    let ended = serve_frames(sink, stream, session, heartbeat, shutdown, &mut frames).await;
    frames.end();
    ended
}

async fn serve_frames<S, R, E>(
    mut sink: S,
    mut stream: R,
    mut session: Session,
    heartbeat: Duration,
    shutdown: impl std::future::Future<Output = ()>,
    frames: &mut impl ClientFrames,
) -> Ended
where
    S: Sink<Message> + Unpin,
    R: Stream<Item = Result<Message, E>> + Unpin,
{
    // Every write gives up after two heartbeats: a client whose socket takes nothing for
    // that long is as dead as one that answers nothing.
    let patience = heartbeat * 2;
    let mut ticker = tokio::time::interval_at(Instant::now() + heartbeat, heartbeat);
    let mut last_heard = Instant::now();
    tokio::pin!(shutdown);
    let token_expires = session.token_expires;
    let expiry = async move {
        match token_expires {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiry);
    loop {
        tokio::select! {
            outbound = session.outbound.recv() => match outbound {
                Some(Outbound::Frame(frame)) => {
                    if let Err(ended) = write(&mut sink, &frame.text, frame.committed_at, patience).await {
                        return ended;
                    }
                }
                Some(Outbound::Overflowed) => {
                    close(&mut sink, CLOSE_OVERFLOW, "send queue overflow", patience).await;
                    return Ended::Overflowed;
                }
                Some(Outbound::Replaced) => {
                    close(&mut sink, CLOSE_REPLACED, "replaced by a newer session of this user", patience).await;
                    return Ended::Replaced;
                }
                None => return Ended::Shutdown,
            },
            inbound = stream.next() => match inbound {
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return Ended::ClientClosed,
                // Acks (see `acks.rs`); anything the client says proves it is alive.
                Some(Ok(Message::Text(text))) => {
                    last_heard = Instant::now();
                    if !frames.text(text.as_str()) {
                        metrics::counter!("gateway_frame_floods_total").increment(1);
                        close(&mut sink, CLOSE_FLOODED, "too many frames", patience).await;
                        return Ended::Flooded;
                    }
                }
                // Pongs, pings and binary frames: alive, nothing more.
                Some(Ok(_)) => last_heard = Instant::now(),
            },
            _ = ticker.tick() => {
                if last_heard.elapsed() >= heartbeat * 2 {
                    close(&mut sink, CLOSE_GOING_AWAY, "heartbeat timeout", patience).await;
                    return Ended::HeartbeatTimeout;
                }
                if let Err(ended) = send_within(&mut sink, Message::Ping(Vec::new().into()), patience).await {
                    return ended;
                }
            }
            () = until(frames.next_flush()) => frames.flush(),
            () = &mut expiry => {
                metrics::counter!("gateway_tokens_expired_total").increment(1);
                close(&mut sink, CLOSE_TOKEN_EXPIRED, "token expired; reconnect with a new token", patience).await;
                return Ended::TokenExpired;
            }
            () = &mut shutdown => {
                // Drain: what was queued before the stop still goes out.
                while let Ok(Outbound::Frame(frame)) = session.outbound.try_recv() {
                    if write(&mut sink, &frame.text, frame.committed_at, heartbeat).await.is_err() {
                        return Ended::Shutdown;
                    }
                }
                close(&mut sink, CLOSE_GOING_AWAY, "gateway shutting down", heartbeat).await;
                return Ended::Shutdown;
            }
        }
    }
}

/// Writes one frame, giving up after `timeout`; records the push latency (commit to
/// frame written) if the frame carries its commit time.
async fn write<S: Sink<Message> + Unpin>(
    sink: &mut S,
    text: &str,
    committed_at: Option<i64>,
    timeout: Duration,
) -> Result<(), Ended> {
    send_within(sink, Message::Text(text.into()), timeout).await?;
    if let Some(at) = committed_at {
        let micros = chrono::Utc::now().timestamp_micros() - at;
        metrics::histogram!("gateway_push_latency_seconds").record(micros.max(0) as f64 / 1e6);
    }
    Ok(())
}

/// Sends one message (and flushes), giving up after `timeout`.
async fn send_within<S: Sink<Message> + Unpin>(
    sink: &mut S,
    message: Message,
    timeout: Duration,
) -> Result<(), Ended> {
    match tokio::time::timeout(timeout, sink.send(message)).await {
        Err(_) => {
            metrics::counter!("gateway_write_timeouts_total").increment(1);
            Err(Ended::WriteTimeout)
        }
        Ok(Err(_)) => Err(Ended::SendFailed),
        Ok(Ok(())) => Ok(()),
    }
}

/// Sends a close frame if the socket takes it within `timeout`.
async fn close<S: Sink<Message> + Unpin>(
    sink: &mut S,
    code: u16,
    reason: &'static str,
    timeout: Duration,
) {
    let frame = Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    let _ = send_within(sink, frame, timeout).await;
}

#[cfg(test)]
mod tests {
    use chatpipe_core::UserId;
    use futures::channel::mpsc;

    use super::*;
    use crate::sessions::Sessions;

    type Inbound = Result<Message, std::convert::Infallible>;

    fn wire() -> (
        mpsc::UnboundedSender<Message>,
        mpsc::UnboundedReceiver<Message>,
    ) {
        mpsc::unbounded()
    }

    #[tokio::test]
    async fn queued_frames_go_out_as_text_in_order() {
        let sessions = Sessions::new(8);
        let session = sessions.join(UserId::of(10)).unwrap();
        let (out_tx, mut out_rx) = wire();
        let (in_tx, in_rx) = mpsc::unbounded::<Inbound>();
        sessions.push(&[UserId::of(10)], "one");
        sessions.push(&[UserId::of(10)], "two");
        let conn = tokio::spawn(serve(
            out_tx,
            in_rx,
            session,
            Duration::from_secs(30),
            std::future::pending(),
        ));
        assert_eq!(out_rx.next().await, Some(Message::Text("one".into())));
        assert_eq!(out_rx.next().await, Some(Message::Text("two".into())));
        in_tx.unbounded_send(Ok(Message::Close(None))).unwrap();
        assert_eq!(conn.await.unwrap(), Ended::ClientClosed);
    }

    #[tokio::test]
    async fn an_overflowing_client_is_closed_with_a_reason() {
        let sessions = Sessions::new(2);
        let session = sessions.join(UserId::of(10)).unwrap();
        for i in 0..10 {
            sessions.push(&[UserId::of(10)], &i.to_string());
        }
        let (out_tx, out_rx) = wire();
        let (_in_tx, in_rx) = mpsc::unbounded::<Inbound>();
        let ended = serve(
            out_tx,
            in_rx,
            session,
            Duration::from_secs(30),
            std::future::pending(),
        )
        .await;
        assert_eq!(ended, Ended::Overflowed);
        let frames: Vec<Message> = out_rx.collect().await;
        assert_eq!(frames.len(), 3, "two frames, then the close: {frames:?}");
        match frames.last() {
            Some(Message::Close(Some(f))) => assert_eq!(
                (f.code, f.reason.as_str()),
                (CLOSE_OVERFLOW, "send queue overflow")
            ),
            other => panic!("expected a close frame, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_client_is_pinged_then_closed_after_two_heartbeats() {
        let sessions = Sessions::new(2);
        let session = sessions.join(UserId::of(10)).unwrap();
        let (out_tx, mut out_rx) = wire();
        let (_in_tx, in_rx) = mpsc::unbounded::<Inbound>();
        let conn = tokio::spawn(serve(
            out_tx,
            in_rx,
            session,
            Duration::from_secs(15),
            std::future::pending(),
        ));
        assert!(
            matches!(out_rx.next().await, Some(Message::Ping(_))),
            "a ping after one heartbeat"
        );
        assert!(
            matches!(out_rx.next().await, Some(Message::Close(Some(f))) if f.code == CLOSE_GOING_AWAY)
        );
        assert_eq!(conn.await.unwrap(), Ended::HeartbeatTimeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_answers_stays_connected() {
        let sessions = Sessions::new(2);
        let session = sessions.join(UserId::of(10)).unwrap();
        let (out_tx, mut out_rx) = wire();
        let (in_tx, in_rx) = mpsc::unbounded::<Inbound>();
        let conn = tokio::spawn(serve(
            out_tx,
            in_rx,
            session,
            Duration::from_secs(15),
            std::future::pending(),
        ));
        for _ in 0..5 {
            assert!(matches!(out_rx.next().await, Some(Message::Ping(_))));
            in_tx
                .unbounded_send(Ok(Message::Pong(Vec::new().into())))
                .unwrap();
        }
        assert!(!conn.is_finished());
        in_tx.unbounded_send(Ok(Message::Close(None))).unwrap();
        assert_eq!(conn.await.unwrap(), Ended::ClientClosed);
    }

    #[tokio::test]
    async fn on_shutdown_queued_frames_go_out_before_the_close() {
        let sessions = Sessions::new(8);
        let session = sessions.join(UserId::of(10)).unwrap();
        for frame in ["one", "two", "three"] {
            sessions.push(&[UserId::of(10)], frame);
        }
        let (out_tx, out_rx) = wire();
        let (_in_tx, in_rx) = mpsc::unbounded::<Inbound>();
        let ended = serve(
            out_tx,
            in_rx,
            session,
            Duration::from_secs(30),
            std::future::ready(()),
        )
        .await;
        assert_eq!(ended, Ended::Shutdown);
        let frames: Vec<Message> = out_rx.collect().await;
        assert_eq!(
            &frames[..3],
            &[
                Message::Text("one".into()),
                Message::Text("two".into()),
                Message::Text("three".into()),
            ]
        );
        assert!(
            matches!(&frames[3], Message::Close(Some(f)) if f.code == CLOSE_GOING_AWAY && f.reason.as_str() == "gateway shutting down"),
            "{frames:?}"
        );
    }

    /// A socket that never takes anything: a client that stopped reading, buffers full.
    struct Stuck;

    impl Sink<Message> for Stuck {
        type Error = ();
        fn poll_ready(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), ()>> {
            std::task::Poll::Pending
        }
        fn start_send(self: std::pin::Pin<&mut Self>, _: Message) -> Result<(), ()> {
            Ok(())
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), ()>> {
            std::task::Poll::Pending
        }
        fn poll_close(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), ()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_that_takes_nothing_is_dropped_after_two_heartbeats() {
        let sessions = Sessions::new(8);
        let session = sessions.join(UserId::of(10)).unwrap();
        sessions.push(&[UserId::of(10)], "stuck behind a full socket");
        let (_in_tx, in_rx) = mpsc::unbounded::<Inbound>();
        let started = Instant::now();
        let ended = serve(
            Stuck,
            in_rx,
            session,
            Duration::from_secs(15),
            std::future::pending(),
        )
        .await;
        assert_eq!(ended, Ended::WriteTimeout);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }
}
