//! A client of `/ws`: what `gateway watch`, the tests and the benchmarks connect with.

use std::net::{IpAddr, SocketAddr};

use anyhow::Context;
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The upgrade request for `url`, authenticated with `Authorization: Bearer <token>`.
pub fn request(url: &str, token: &str) -> anyhow::Result<Request> {
    let mut request = url.into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    Ok(request)
}

/// Connects to `url` as the holder of `token`.
pub async fn connect(url: &str, token: &str) -> anyhow::Result<Socket> {
    let (ws, _) = tokio_tungstenite::connect_async(request(url, token)?).await?;
    Ok(ws)
}

/// Connects to `url` (plain `ws://`) from the local address `source`: a load generator
/// spreads its connections over loopback addresses, as real clients come from many
/// addresses (the gateway bounds connections per address, `http.max_connections_per_ip`).
pub async fn connect_from(url: &str, token: &str, source: IpAddr) -> anyhow::Result<Socket> {
    let socket = match source {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(source, 0))?;
    connect_over(url, token, socket).await
}

/// Connects to `url` (plain `ws://`) over `socket`, set up as the caller needs (a local
/// address, a buffer size).
pub async fn connect_over(url: &str, token: &str, socket: TcpSocket) -> anyhow::Result<Socket> {
    let request = request(url, token)?;
    let host = request.uri().authority().context("no host in the URL")?;
    let server = tokio::net::lookup_host(host.as_str())
        .await?
        .next()
        .with_context(|| format!("{host} has no address"))?;
    let stream = socket.connect(server).await?;
    let (ws, _) = tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream)).await?;
    Ok(ws)
}
