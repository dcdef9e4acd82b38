//! A client of `/ws`: what `gateway watch`, the tests and the benchmarks connect with.

use tokio::net::TcpStream;
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
