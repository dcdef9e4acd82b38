//! Secured transports against the stack's real servers: PostgreSQL over TLS with the
//! certificate verified (sslmode=verify-full), and Kafka through the broker's SASL_SSL
//! listener with the properties an operator sets in `[kafka.properties]`.

use chatpipe_core::kafka::CreateGuarded;
use std::time::{Duration, Instant};

use chatpipe_core::config::KafkaSettings;
use chatpipe_core::kafka::BaseConsumer;
use chatpipe_core::kafka::FutureProducer;
use chatpipe_tests::spawn_app_with;
use chatpipe_tests::stream::create_topic;
use rdkafka::consumer::Consumer;
use rdkafka::producer::FutureRecord;
use rdkafka::Message;
use secrecy::{ExposeSecret, SecretString};
use sqlx::Connection;

/// A variable `scripts/stack env` exports; the test fails naming it when it is missing.
fn stack_var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: start the stack (`scripts/stack up`) and `eval \"$(scripts/stack env)\"`, as scripts/test does")
    })
}

/// `url` with TLS required and the server's certificate checked against the stack's CA
/// and its host name.
fn verify_full(url: &str, ca: &str) -> String {
    let base = url.split_once('?').map_or(url, |(b, _)| b);
    format!("{base}?sslmode=verify-full&sslrootcert={ca}")
}

#[tokio::test]
async fn ingest_api_talks_to_postgres_over_tls_with_the_certificate_verified() {
    let ca = stack_var("STACK_TLS_CA");
    let app = spawn_app_with(|s| {
        s.database.url = SecretString::from(verify_full(s.database.url.expose_secret(), &ca));
    })
    .await;
    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "over TLS").await;
    // PostgreSQL's own view of the app's connections: every one is TLS.
    let (connections, over_tls): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl)
           FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
          WHERE a.datname = current_database() AND a.application_name = 'ingest-api'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(connections >= 1);
    assert_eq!(over_tls, connections, "plaintext connections of ingest-api");

    // The check is real: without the stack's CA the same server is refused.
    let url: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .map(|db: String| chatpipe_tests::with_database(&chatpipe_tests::server_url(), &db))
        .unwrap();
    let untrusted = verify_full(&url, "/etc/ssl/certs/ca-certificates.crt");
    match sqlx::PgConnection::connect(&untrusted).await {
        Ok(_) => panic!("a certificate no trusted CA signed was accepted"),
        Err(err) => assert!(
            err.to_string().contains("UnknownIssuer"),
            "refused for another reason than the certificate: {err}"
        ),
    }
}

fn sasl_settings(password: &str) -> KafkaSettings {
    chatpipe_tests::stream::sasl(&stack_var("KAFKA_SASL_USER"), password)
}

#[tokio::test]
async fn kafka_clients_produce_and_consume_through_the_sasl_ssl_listener() {
    let topic = format!("transports-{}", uuid::Uuid::new_v4().simple());
    create_topic(&topic, 1).await;
    let kafka = sasl_settings(&stack_var("KAFKA_SASL_PASSWORD"));
    let producer: FutureProducer = kafka.producer().create_guarded().unwrap();
    producer
        .send(
            FutureRecord::to(&topic).key("k").payload("over SASL_SSL"),
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("producing through SASL_SSL: {e}"));

    let consumer: BaseConsumer = kafka
        .consumer(&format!("{topic}-reader"))
        .create_guarded()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = loop {
        assert!(
            Instant::now() < deadline,
            "nothing consumed through SASL_SSL"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.expect("consuming through SASL_SSL");
            break m.payload().map(|p| p.to_vec());
        }
    };
    assert_eq!(got.as_deref(), Some(&b"over SASL_SSL"[..]));
    chatpipe_tests::stream::close_consumer(consumer, "the SASL_SSL reader").await;

    // A wrong password is refused by the broker: nothing is acknowledged.
    let wrong: FutureProducer = sasl_settings("not-the-password")
        .producer()
        .set("message.timeout.ms", "5000")
        .create_guarded()
        .unwrap();
    let refused = wrong
        .send(
            FutureRecord::to(&topic).key("k").payload("must not arrive"),
            Duration::from_secs(10),
        )
        .await;
    assert!(refused.is_err(), "a wrong SASL password was accepted");
}

#[tokio::test]
async fn ingest_api_registers_its_schema_with_a_registry_over_https_trusting_the_configured_ca() {
    let tls_url = stack_var("SCHEMA_REGISTRY_TLS_URL");
    let ca = stack_var("STACK_TLS_CA");
    let app = spawn_app_with(|s| {
        s.registry.url = tls_url.clone();
        s.registry.ca_file = Some(ca.clone().into());
    })
    .await;
    // It started (it registers the chat.events schema first) and writes events with it.
    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "schema over https").await;
    assert!(!app.outbox_events().await.is_empty());

    // Without the CA the same registry is refused: the certificate is checked.
    let untrusted = chatpipe_schemas::registry::Registry::new(&tls_url, Duration::from_secs(5))
        .unwrap()
        .event_codec_for("chat.events-value")
        .await;
    let Err(err) = untrusted else {
        panic!("a registry certificate no trusted CA signed was accepted");
    };
    let chain = {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    };
    assert!(
        chain.contains("certificate") || chain.contains("UnknownIssuer"),
        "refused for another reason than the certificate: {chain}"
    );
}

#[tokio::test]
async fn ingest_api_reaches_a_registry_that_requires_credentials_and_a_wrong_password_is_refused() {
    let url = stack_var("SCHEMA_REGISTRY_AUTH_URL");
    let ca = stack_var("STACK_TLS_CA");
    let user = stack_var("REGISTRY_AUTH_USER");
    let password = stack_var("REGISTRY_AUTH_PASSWORD");
    // registry-auth keeps its schemas in memory: ingest-api registers its schema there as
    // anywhere, with the credentials on every request.
    let app = spawn_app_with(|s| {
        s.registry.url = url.clone();
        s.registry.ca_file = Some(ca.clone().into());
        s.registry.username = Some(user.clone());
        s.registry.password = Some(SecretString::from(password.clone()));
    })
    .await;
    let conv = app.user(10).create_group(&[20]).await;
    app.user(10).send_message(conv, "with credentials").await;
    assert!(!app.outbox_events().await.is_empty());

    let access = |password: Option<&str>| chatpipe_schemas::registry::Access {
        ca_file: Some(ca.clone().into()),
        username: password.map(|_| user.clone()),
        password: password.map(str::to_owned),
    };
    for (what, access) in [
        ("a wrong password", access(Some("not-the-password"))),
        ("no credentials", access(None)),
    ] {
        let refused = chatpipe_schemas::registry::Registry::with_access(
            &url,
            Duration::from_secs(5),
            &access,
        )
        .unwrap()
        .event_codec_for("chat.events-value")
        .await;
        let Err(err) = refused else {
            panic!("the registry accepted {what}");
        };
        let chain = format!("{err} {:?}", err);
        assert!(
            chain.contains("401"),
            "{what} refused for another reason: {chain}"
        );
    }
}
