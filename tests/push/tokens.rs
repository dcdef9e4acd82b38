//! The gateway takes an identity provider's tokens as ingest-api does (`[auth.jwks]`):
//! an RS256 token of the provider's key opens a socket that receives pushes, and after a
//! key rotation the new key's token does too while the old key's is closed with 4001.

use chatpipe_core::auth::jwks::JwksSettings;
use chatpipe_tests::jwks::{provider_token, Provider, RSA_A, RSA_B};
use chatpipe_tests::push::{Seen, WsClient};
use chatpipe_tests::stream::spawn_pipeline;
use jsonwebtoken::Algorithm;

use crate::{is_message, PRESENCE_DEADLINE, PUSH_DEADLINE};

#[tokio::test]
async fn the_gateway_takes_tokens_of_a_jwks_across_a_key_rotation() {
    let p = spawn_pipeline().await;
    let (provider, url) = Provider::start(&["rsa-a"]).await;
    let mut settings = p.gateway_settings("gw", 0);
    settings.auth.jwks = Some(JwksSettings {
        url,
        refresh_secs: 3600,
        refetch_min_ms: 0,
        fetch_timeout_ms: 2000,
    });
    let gw = p.start_gateway(settings).await;
    let fanout = p.start_fanout(p.fanout_settings());
    let (alice, bob) = (1, 2);
    let conversation = p.app.user(alice).create_group(&[bob]).await;

    let a = provider_token(Algorithm::RS256, "rsa-a", RSA_A, bob);
    let mut ws = WsClient::connect(&gw.url, &a).await;
    fanout.wait_online(&[bob], PRESENCE_DEADLINE).await;
    let seq = p
        .app
        .user(alice)
        .send_message(conversation, "to a provider's user")
        .await;
    let (frame, _) = ws.until(PUSH_DEADLINE, is_message(conversation, seq)).await;
    assert_eq!(frame["body"], "to a provider's user");

    // Rotation: only rsa-b is published now. Its token is taken at once (one fetch for
    // the unknown kid); a new socket with rsa-a's is closed with 4001.
    provider.serve(&["rsa-b"]);
    let before = provider.fetches();
    let b = provider_token(Algorithm::RS256, "rsa-b", RSA_B, bob);
    let mut rotated = WsClient::connect(&gw.url, &b).await;
    let seq = p
        .app
        .user(alice)
        .send_message(conversation, "after the rotation")
        .await;
    rotated
        .until(PUSH_DEADLINE, is_message(conversation, seq))
        .await;
    assert_eq!(provider.fetches(), before + 1, "one fetch for the new key");

    let mut old = WsClient::connect(&gw.url, &a).await;
    match old.next(PUSH_DEADLINE).await {
        Some(Seen::Closed(Some(close))) => {
            assert_eq!(u16::from(close.code), 4001, "{close:?}");
            assert!(close.reason.contains("rsa-a"), "{close:?}");
        }
        other => panic!("the old key's socket was not closed with 4001: {other:?}"),
    }
    fanout.stop().unwrap();
    gw.stop().await.unwrap();
    p.cleanup().await;
}
