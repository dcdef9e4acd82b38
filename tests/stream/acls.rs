//! Kafka ACLs (issue 24, item 11): each service has a principal of its own on the
//! broker's SASL_SSL listener, held to what the service does (config/stack/kafka-acls,
//! the matrix in docs/operations.md). The broker's answers are the witness: refusals
//! are its authorization errors, and the topics' end offsets show nothing got through.

use std::time::{Duration, Instant};

use chatpipe_core::kafka::{BaseConsumer, CreateGuarded, FutureProducer};
use chatpipe_tests::stream::{end_offsets, principal};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::FutureRecord;
use rdkafka::{Message, Offset, TopicPartitionList};
use secrecy::ExposeSecret;

#[tokio::test]
async fn each_principal_is_refused_what_its_service_does_not_do() {
    let events = end_offsets("chat.events").await;
    let deliveries = end_offsets("chat.deliveries").await;
    for (who, topic) in [
        ("chatpipe_gateway", "chat.events"),
        ("chatpipe_ingest", "chat.events"),
        ("chatpipe_pipeline", "chat.events"),
        ("chatpipe_ingest", "chat.deliveries"),
        ("chatpipe_gateway", "chat.deliveries"),
        ("chatpipe_gateway", "chat.read-receipts.dlq"),
    ] {
        let producer: FutureProducer = principal(who)
            .producer()
            .set("message.timeout.ms", "15000")
            .create_guarded()
            .unwrap();
        let refused = producer
            .send(
                FutureRecord::to(topic)
                    .key("acl")
                    .payload("must not arrive"),
                Duration::from_secs(20),
            )
            .await
            .map(|_| ())
            .expect_err(&format!("{who} wrote to {topic}"))
            .0;
        assert!(
            matches!(
                refused,
                KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed)
            ),
            "{who} writing {topic}: {refused}"
        );
    }
    assert_eq!(end_offsets("chat.events").await, events, "nothing written");
    assert_eq!(end_offsets("chat.deliveries").await, deliveries);

    // Reading: a topic a principal may not read, it may not even see (no Describe):
    // the broker's metadata answers TOPIC_AUTHORIZATION_FAILED, and librdkafka fetches
    // nothing of it.
    for (who, topic) in [
        ("chatpipe_gateway", "chat.events"),
        ("chatpipe_gateway", "chat.read-receipts"),
        ("chatpipe_gateway", "chat.fanout-members"),
        ("chatpipe_ingest", "chat.events"),
        ("chatpipe_ingest", "chat.deliveries"),
    ] {
        let consumer: BaseConsumer = principal(who)
            .consumer(&format!(
                "chatpipe-deliveries-acl-{}",
                uuid::Uuid::new_v4().simple()
            ))
            .create_guarded()
            .unwrap();
        let seen = tokio::task::spawn_blocking(move || {
            let metadata = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(15))
                .expect("metadata");
            metadata.topics()[0].error().map(RDKafkaErrorCode::from)
        })
        .await
        .unwrap();
        assert_eq!(
            seen,
            Some(RDKafkaErrorCode::TopicAuthorizationFailed),
            "{who} sees {topic}"
        );
    }

    // And what a service does is allowed: the pipeline writes its changelog and reads
    // the record back (a tombstone of a key no conversation has: fanout ignores it).
    let key = format!("acl-check-{}", uuid::Uuid::new_v4().simple());
    let pipeline = principal("chatpipe_pipeline");
    let producer: FutureProducer = pipeline.producer().create_guarded().unwrap();
    let delivered = producer
        .send(
            FutureRecord::<str, [u8]>::to("chat.fanout-members")
                .partition(0)
                .key(&key),
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("chatpipe_pipeline writing its changelog: {e}"));
    let offset = delivered.offset;
    let consumer: BaseConsumer = pipeline
        .consumer(&format!("chatpipe-acl-{}", uuid::Uuid::new_v4().simple()))
        .create_guarded()
        .unwrap();
    let read = tokio::task::spawn_blocking(move || {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("chat.fanout-members", 0, Offset::Offset(offset))
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                let m = m.expect("chatpipe_pipeline reads its changelog");
                return m.key().map(|k| String::from_utf8_lossy(k).into_owned());
            }
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(read.as_deref(), Some(key.as_str()));
}

/// The read path with the services' own principals, on the stack's topics: ingest-api
/// (chatpipe_ingest) puts a receipt on chat.read-receipts, a receipts processor
/// (chatpipe_pipeline, a group of its own) applies it: PostgreSQL's row moves.
#[tokio::test]
async fn a_read_goes_through_kafka_as_the_services_principals() {
    let app = chatpipe_tests::spawn_app_with(|s| {
        s.reads.mode = ingest_api::configuration::ReadMode::Stream;
        let kafka = principal("chatpipe_ingest");
        s.kafka.brokers = kafka.brokers;
        s.kafka.properties = kafka.properties;
    })
    .await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let db_url = chatpipe_tests::with_database(&chatpipe_tests::server_url(), &db);
    let mut settings = pipeline::settings::Settings::load(None).unwrap();
    settings.kafka = principal("chatpipe_pipeline");
    settings.registry.url = chatpipe_tests::registry_url();
    settings.database.url = chatpipe_tests::as_service(&db_url).into();
    let group = format!("chatpipe-acl-{}", uuid::Uuid::new_v4().simple());
    settings.receipts.group = format!("{group}-reads");
    settings.receipts.acks_group = format!("{group}-acks");
    assert!(settings
        .database
        .url
        .expose_secret()
        .contains("chatpipe_service"));
    let stop = chatpipe_runtime::CancellationToken::new();
    let processor = {
        let stop = stop.clone();
        std::thread::spawn(move || pipeline::receipts::run(&settings, stop))
    };

    let (alice, bob) = (app.user(10), app.user(20));
    let conv = alice.create_group(&[20]).await;
    for n in 1..=3 {
        alice.send_message(conv, &format!("m{n}")).await;
    }
    let res = bob
        .post(
            &format!("/v1/conversations/{conv}/read"),
            serde_json::json!({"seq": 3}),
        )
        .await;
    assert_eq!(res.status, 202, "{:?}", res.body);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let read: i64 = sqlx::query_scalar(
            "SELECT last_read_seq FROM conversation_member WHERE conversation_id = $1 AND user_id = 20",
        )
        .bind(conv)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        if read == 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the receipt was not applied within 120 s (watermark {read})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    tokio::task::spawn_blocking(move || processor.join())
        .await
        .unwrap()
        .expect("the processor's thread")
        .expect("the processor stops cleanly");
}
